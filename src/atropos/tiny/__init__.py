"""The tiny policy of `make demo`: a 0.9 M-parameter Llama, warm-started on `arithmetic`.

- `atropos.tiny.model`: its config (`tiny_config`) and a seeded builder (`build_model`).
- `atropos.tiny.warmstart`: the supervised warm start and `evaluate_policy`.
- `policy/`: the shipped checkpoint (HF format), `atropos.tiny.warmstart.policy_path()`.

Rebuild with `python scripts/make_tiny_policy.py`; see docs/demo-policy.md.
"""
