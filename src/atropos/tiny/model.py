"""The tiny policy's architecture: a small Llama over the tiny ChatML tokenizer.

About 0.9 M parameters (3.7 MB in fp32): small enough to train and serve on two CPU cores in
minutes, big enough to learn two-digit addition. Token ids (eos `<|im_end|>`, pad `<|pad|>`)
come from the tokenizer, so the config and the tokenizer cannot disagree.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ARCHITECTURE", "build_model", "tiny_config"]

#: Sizes of the shipped policy (chosen by experiment, see docs/demo-policy.md).
ARCHITECTURE: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 384,
    "max_position_embeddings": 128,
}


def tiny_config(tokenizer: Any = None, **overrides: Any) -> Any:
    """A `transformers.LlamaConfig` for the tiny policy.

    Args:
        tokenizer: the tokenizer whose vocabulary and special ids to use (default: the tiny one).
        overrides: config fields that replace `ARCHITECTURE`'s (e.g. `num_hidden_layers=2`).
    """
    from transformers import LlamaConfig

    if tokenizer is None:
        from atropos.inference.tokenizer import load_tokenizer

        tokenizer = load_tokenizer("tiny")
    sizes = {**ARCHITECTURE, **overrides}
    return LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )


def build_model(seed: int = 0, config: Any = None) -> Any:
    """A freshly initialised `LlamaForCausalLM` (fp32, train mode), the same for the same seed."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config if config is not None else tiny_config())
    model.train()
    return model
