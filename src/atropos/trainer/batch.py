"""Moved to `atropos.client.tensors` (and `Sample` to `atropos.client.samples`); these names
stay here for `benchmarks/trainer_gpu.py`, which imports them from the trainer."""

from atropos.client.samples import MISSING, Sample
from atropos.client.tensors import MicroBatch, collate, micro_batches

__all__ = ["MISSING", "MicroBatch", "Sample", "collate", "micro_batches"]
