"""The reference GRPO trainer (`atropos train`): loss, batch tensors, API client, weight sync.

Importing this package is cheap; torch is imported by the modules that need it.
"""
