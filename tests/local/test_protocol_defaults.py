"""`atropos local serve` reads a request's defaults as vLLM does (`CompletionRequest`,
`ChatCompletionRequest`, `vllm.entrypoints.utils.get_max_tokens`)."""

from __future__ import annotations

from typing import Any

import pytest

from atropos.inference.tokenizer import load_tokenizer
from atropos.local.protocol import Codec, RequestError, Sampling, parse_chat, parse_completion

HELLO: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def codec() -> Codec:
    tokenizer = load_tokenizer("tiny")
    return Codec(tokenizer, len(tokenizer), max_model_len=256)


def test_a_completion_without_max_tokens_gets_16_and_null_the_rest_of_the_context(codec):
    assert parse_completion({"prompt": "hi"}, codec).sampling.max_tokens == 16
    assert parse_completion({"prompt": "hi", "max_tokens": None}, codec).sampling.max_tokens is None
    assert parse_completion({"prompt": "hi", "max_tokens": 40}, codec).sampling.max_tokens == 40


def test_a_chat_without_a_limit_gets_the_rest_of_the_context(codec):
    for extra in ({}, {"max_tokens": None}, {"max_completion_tokens": None}):
        assert parse_chat({"messages": HELLO, **extra}, codec).sampling.max_tokens is None
    chosen = parse_chat({"messages": HELLO, "max_tokens": 9, "max_completion_tokens": 7}, codec)
    assert chosen.sampling.max_tokens == 7  # max_completion_tokens first, as vLLM


def test_the_other_defaults_are_vllms(codec):
    for parsed in (
        parse_completion({"prompt": "hi"}, codec),
        parse_chat({"messages": HELLO}, codec),
    ):
        assert parsed.sampling == Sampling(max_tokens=parsed.sampling.max_tokens)
        s = parsed.sampling
        assert (s.n, s.temperature, s.top_p, s.top_k, s.seed) == (1, 1.0, 1.0, 0, None)
        assert (s.stop, s.stop_token_ids, s.logprobs, s.prompt_logprobs) == ((), (), None, None)
        assert (s.ignore_eos, s.include_stop_str_in_output, s.skip_special_tokens) == (
            False,
            False,
            True,
        )


def test_a_prompt_that_fills_the_context_leaves_no_room_for_the_default_16(codec):
    prompt = list(range(10, 10 + 250))  # 250 ids: 6 left, fewer than the default 16
    with pytest.raises(RequestError, match="maximum context length is 256"):
        parse_completion({"prompt": prompt}, codec)
    assert parse_completion({"prompt": prompt, "max_tokens": None}, codec).prompts == [prompt]
