"""Fixtures shared across test folders: a tiny random causal LM for the trainer and its metrics
tests. Under CI (`CI` set) hypothesis draws the same examples every run, so CI's verdict on a
commit does not depend on luck; a developer's runs keep exploring new ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random causal LM in Hugging Face format, built once per session (no downloads)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from atropos.inference.tokenizer import load_tokenizer
    from atropos.testing import tiny_tokenizer_path

    torch.manual_seed(0)
    tok = load_tokenizer(tiny_tokenizer_path())
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path
