"""Moved to `atropos.client.transfer` (the weight-transfer protocol is the client's); these
names stay here for the tests and benchmarks that import them from the trainer."""

from atropos.client.transfer import (
    SERVER_TYPES,
    SGLANG_PAUSE,
    TRANSFER_BACKENDS,
    SyncError,
    TransferClient,
    local_address,
    named_tensors,
    whole,
)

__all__ = [
    "SERVER_TYPES",
    "SGLANG_PAUSE",
    "TRANSFER_BACKENDS",
    "SyncError",
    "TransferClient",
    "local_address",
    "named_tensors",
    "whole",
]
