"""The tiny policy's config and builder, and the shipped checkpoint."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from atropos.inference.tokenizer import import_transformers_quietly, load_tokenizer
from atropos.tiny.model import build_model, tiny_config
from atropos.tiny.warmstart import WarmStartConfig, evaluate_policy, policy_path

torch.set_num_threads(1)  # the machine is shared; the model is tiny anyway
transformers = import_transformers_quietly()
transformers.logging.disable_progress_bar()


def test_config_takes_vocabulary_and_special_ids_from_the_tokenizer():
    tok = load_tokenizer("tiny")
    config = tiny_config()
    assert config.vocab_size == len(tok)
    assert (config.eos_token_id, config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert config.tie_word_embeddings and config.num_key_value_heads < config.num_attention_heads
    assert tiny_config(num_hidden_layers=2).num_hidden_layers == 2


def test_same_seed_same_weights_and_a_small_fp32_model():
    a, b, c = build_model(0), build_model(0), build_model(1)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    size = sum(p.numel() * p.element_size() for p in a.parameters())
    assert size < 8e6  # fp32 bytes; tied embeddings are counted once


def test_the_shipped_policy_loads_with_plain_transformers():
    folder = policy_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.to_dict()["hidden_size"] == tiny_config().hidden_size
    tok = load_tokenizer(str(folder))
    assert tok.get_vocab() == load_tokenizer("tiny").get_vocab()
    assert (folder / "model.safetensors").stat().st_size < 10e6
    recipe = json.loads((folder / "warmstart.json").read_text())
    assert recipe == dataclasses.asdict(WarmStartConfig())  # the script's defaults rebuild it


@pytest.mark.slow
def test_the_shipped_policy_is_partly_right_on_held_out_items():
    metrics = evaluate_policy(n_items=200, samples=4)
    assert 0.15 <= metrics["greedy_accuracy"] <= 0.65, metrics
    assert metrics["mixed_groups"] >= 0.4, metrics  # GRPO needs groups with mixed rewards
