"""Moved to `atropos.client` (the public trainer client); `ApiError` stays importable here for
`atropos.cli.train`."""

from atropos.client.api import ApiError, Batch, TrainerClient

__all__ = ["ApiError", "Batch", "TrainerClient"]
