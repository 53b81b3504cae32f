"""Third-party trainers on Atropos batches (docs/integrations.md).

- `trl`: Hugging Face TRL's `GRPOTrainer` trained on the API's batches, weights published back
  (`python -m atropos.integrations.trl --model DIR ...`, a `trainer.command` for `atropos launch`).

Each integration imports only `atropos.client` (and leaves) of ours, and its trainer library
lazily: importing this package needs neither TRL nor torch.
"""
