"""The tiny policy of `make demo`: a 0.9 M-parameter Llama, warm-started on `arithmetic`.

- `atropos.tiny.model`: its config (`tiny_config`) and a seeded builder (`build_model`).
- `atropos.tiny.warmstart`: the supervised warm start and `evaluate_policy`.
- `policy/`: the shipped checkpoint (HF format), `atropos.tiny.warmstart.policy_path()`.
- `tokenizer/`: the tiny ChatML tokenizer (`tokenizer_path()`, the tokenizer name `"tiny"`).

Rebuild with `python scripts/make_tiny_policy.py` and `scripts/make_tiny_tokenizer.py`; see
docs/demo-policy.md. This module imports nothing: it only names package data, so any layer
(the tokenizer loader in `atropos.inference` included) may use it.
"""

from __future__ import annotations

from pathlib import Path


def tokenizer_path() -> str:
    """The directory of the tiny ChatML tokenizer shipped with the package (loads offline).

    >>> import os
    >>> os.path.isfile(os.path.join(tokenizer_path(), "tokenizer.json"))
    True
    """
    return str(Path(__file__).resolve().parent / "tokenizer")
