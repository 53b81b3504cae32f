"""The reference GRPO trainer (`atropos train`): loss, step, checkpoints, many processes; its
API calls, batch tensors and weight sync come from the public trainer client, `atropos.client`.

Importing this package is cheap; torch is imported by the modules that need it.
"""
