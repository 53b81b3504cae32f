"""Our SGLang client (`server_type="sglang"`, `atropos.inference.sglang`, through
`ServerManager`) against SGLang itself serving the tiny policy: token ids and logprobs held to
transformers' forward pass over the same ids, `n`, stop strings, prompt logprobs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atropos.testing.server_process import tiny_policy_path
from atropos.testing.sglang import SGLangServer

from .helpers import TOLERANCE, gap, hf_logprobs, manager

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server
EOS = 2  # <|im_end|>: the tiny policy's eos and end of turn
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from atropos.inference.tokenizer import load_tokenizer

    return load_tokenizer("tiny")


def reference(prompt: list[int], output: list[int]) -> list[float]:
    """log p(each output id) under the tiny policy in transformers."""
    table = hf_logprobs(tiny_policy_path(), prompt + output)
    return [float(table[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_token_ids_and_logprobs_are_the_policys_own(
    sglang_server: SGLangServer, tokenizer: Any, temperature: float
) -> None:
    """The ids are what was sampled, the logprobs the model's own (raw: not tempered)."""
    ids = tokenizer.encode(PROMPT)

    async def main() -> Any:
        async with manager(sglang_server) as m:
            return await m.tokens_and_logprobs_completion(
                input_ids=ids, n=4, max_tokens=12, temperature=temperature
            )

    prompt, outputs, logprobs, finish = asyncio.run(main())
    assert prompt == ids and len(outputs) == len(logprobs) == len(finish) == 4
    for out, lps, reason in zip(outputs, logprobs, finish, strict=True):
        assert out and len(out) == len(lps)
        assert gap(lps, reference(ids, out)) < TOLERANCE
        if reason == "stop":
            assert out[-1] == EOS  # eos is kept in the ids, as the trainer must see it
        else:
            assert reason == "length" and len(out) == 12


def test_a_text_prompt_is_tokenized_by_the_server(
    sglang_server: SGLangServer, tokenizer: Any
) -> None:
    async def main() -> Any:
        async with manager(sglang_server) as m:  # no tokenizer here: the server encodes it
            return await m.tokens_and_logprobs_completion(prompt=PROMPT, max_tokens=5)

    prompt, (out,), (lps,), _ = asyncio.run(main())
    assert prompt == tokenizer.encode(PROMPT)
    assert gap(lps, reference(prompt, out)) < TOLERANCE


def test_n_is_split_over_requests_and_merged(sglang_server: SGLangServer, tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPT)

    async def main() -> Any:
        async with manager(sglang_server, max_n_completions=2) as m:
            tokens = await m.tokens_and_logprobs_completion(input_ids=ids, n=5, max_tokens=4)
            chat = await m.chat_completion(
                messages=[{"role": "user", "content": "2 + 2 ="}], n=3, max_tokens=4
            )
            text = await m.completion(prompt=PROMPT, n=3, max_tokens=4)
            return tokens, chat, text

    (_, outputs, logprobs, finish), chat, text = asyncio.run(main())
    assert len(outputs) == len(logprobs) == len(finish) == 5
    assert all(len(out) == len(lps) for out, lps in zip(outputs, logprobs, strict=True))
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert [c.index for c in text.choices] == [0, 1, 2]
    assert all(isinstance(c.message.content, str) for c in chat.choices)


def test_stop_strings_end_the_completion_and_keep_the_ids(
    sglang_server: SGLangServer, tokenizer: Any
) -> None:
    """A stop string ends a completion; the ids and logprobs are still what the policy sampled
    (the token that completed the stop string included, with its logprob)."""
    ids, stops = tokenizer.encode(PROMPT), ["9", "5", "1"]
    sampling = {"n": 8, "max_tokens": 12, "temperature": 1.0, "stop": stops}

    async def main() -> Any:
        async with manager(sglang_server) as m:
            text = await m.completion(prompt=PROMPT, **sampling)
            tokens = await m.tokens_and_logprobs_completion(input_ids=ids, **sampling)
            return text, tokens

    text, (_, outputs, logprobs, finish) = asyncio.run(main())
    for choice in text.choices:
        assert not any(s in choice.text for s in stops)
    by_string = 0
    for out, lps, reason in zip(outputs, logprobs, finish, strict=True):
        assert gap(lps, reference(ids, out)) < TOLERANCE
        if reason == "stop" and out[-1] != EOS:
            by_string += 1
            assert any(s in tokenizer.decode(out[-1:]) for s in stops), out
            assert not any(s in tokenizer.decode(out[:-1]) for s in stops), out
    assert by_string, finish  # 8 samples of 12 digits-prone tokens: some hit a stop string


def test_prompt_logprobs_are_the_policys_top_k(sglang_server: SGLangServer, tokenizer: Any) -> None:
    """`get_logprobs(top_k=2)`: for every prompt position after the first, the two likeliest
    next ids and their logprobs, as transformers ranks them."""
    import torch

    ids = tokenizer.encode("The cat sat on the mat, and then")

    async def main() -> Any:
        async with manager(sglang_server) as m:
            return await m.get_logprobs(input_ids=ids, top_k=2)

    got = asyncio.run(main())
    assert got["prompt_tokens"] == ids
    table = hf_logprobs(tiny_policy_path(), ids)
    assert not got["prompt_topk_token_ids"][0]  # nothing predicts the first token
    for i in range(1, len(ids)):
        values, indices = torch.topk(table[i - 1], 2)
        assert got["prompt_topk_token_ids"][i] == indices.tolist(), i
        assert gap(got["prompt_topk_logprobs"][i], values.tolist()) < TOLERANCE
