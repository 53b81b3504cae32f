"""Our vLLM client (`server_type="vllm"`, through `ServerManager`) against both servers of the
tiny policy: `atropos local serve` and real vLLM (`target`). Token ids and logprobs are held to
transformers' forward pass over the same ids (float32, both servers within about 1e-5)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from atropos.inference.errors import InferenceError

from .helpers import MAX_MODEL_LEN, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server
TOLERANCE = 1e-4  # float32 on both sides; measured: a few 1e-6
EOS = 2  # <|im_end|>: the tiny policy's eos and end of turn
PROMPT = "Once upon a time"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_token_ids_and_logprobs_are_the_policys_own(
    target: Target, tokenizer: Any, reference: Callable[..., list[float]], temperature: float
) -> None:
    """The ids are what was sampled, the logprobs the model's own (raw: not tempered)."""
    ids = tokenizer.encode(PROMPT)

    async def main() -> Any:
        async with target.manager() as m:
            return await m.tokens_and_logprobs_completion(
                input_ids=ids, n=4, max_tokens=12, temperature=temperature, seed=3
            )

    prompt, outputs, logprobs, finish = run(main())
    assert prompt == ids and len(outputs) == len(logprobs) == len(finish) == 4
    for out, lps, reason in zip(outputs, logprobs, finish, strict=True):
        assert out and len(out) == len(lps)
        assert worst(lps, reference(ids, out)) < TOLERANCE
        if reason == "stop":
            assert out[-1] == EOS  # eos is kept in the ids, as the trainer must see it
        else:
            assert reason == "length" and len(out) == 12


def test_a_text_prompt_is_tokenized_by_the_server(
    target: Target, tokenizer: Any, reference: Callable[..., list[float]]
) -> None:
    async def main() -> Any:
        async with target.manager() as m:  # no tokenizer here: the server encodes the text
            return await m.tokens_and_logprobs_completion(prompt=PROMPT, max_tokens=5, seed=1)

    prompt, (out,), (lps,), _ = run(main())
    assert prompt == tokenizer.encode(PROMPT)
    assert worst(lps, reference(prompt, out)) < TOLERANCE


def test_n_is_split_over_requests_and_merged(target: Target, tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPT)

    async def main() -> Any:
        async with target.manager(max_n_completions=2) as m:
            tokens = await m.tokens_and_logprobs_completion(input_ids=ids, n=5, max_tokens=4)
            chat = await m.chat_completion(
                messages=[{"role": "user", "content": "2 + 2 ="}], n=3, max_tokens=4
            )
            text = await m.completion(prompt=PROMPT, n=3, max_tokens=4)
            return tokens, chat, text

    (_, outputs, logprobs, finish), chat, text = run(main())
    assert len(outputs) == len(logprobs) == len(finish) == 5
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert [c.index for c in text.choices] == [0, 1, 2]
    assert all(isinstance(c.message.content, str) for c in chat.choices)
    assert chat.usage is not None and chat.usage.completion_tokens >= 3


def test_stop_strings_cut_the_text_and_keep_the_ids(
    target: Target, tokenizer: Any, reference: Callable[..., list[float]]
) -> None:
    """A stop string ends a completion: the text stops before it, the ids keep the token that
    completed it (what the policy sampled), with its logprob."""
    ids, stops = tokenizer.encode(PROMPT), ["9", "5", "1"]
    sampling = {"n": 8, "max_tokens": 12, "temperature": 1.0, "seed": 5, "stop": stops}

    async def main() -> Any:
        async with target.manager() as m:
            text = await m.completion(prompt=PROMPT, **sampling)
            tokens = await m.tokens_and_logprobs_completion(input_ids=ids, **sampling)
            return text, tokens

    text, (_, outputs, logprobs, finish) = run(main())
    stopped = [c for c in text.choices if getattr(c, "stop_reason", None) in stops]
    assert stopped, "no choice hit a stop string (seeded: should not happen)"
    for choice in text.choices:
        assert not any(s in choice.text for s in stops) and choice.finish_reason in (
            "stop",
            "length",
        )
    by_string = 0
    for out, lps, reason in zip(outputs, logprobs, finish, strict=True):
        decoded = tokenizer.decode(out, skip_special_tokens=True)
        assert worst(lps, reference(ids, out)) < TOLERANCE
        if reason == "stop" and out[-1] != EOS:
            by_string += 1
            assert any(s in tokenizer.decode(out[-1:]) for s in stops), decoded
            assert not any(s in tokenizer.decode(out[:-1]) for s in stops), decoded
    assert by_string


def test_max_tokens_caps_the_completion_under_every_alias(target: Target, tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPT)
    common = {"input_ids": ids, "n": 2, "ignore_eos": True, "temperature": 1.0}

    async def main() -> list[Any]:
        async with target.manager() as m:
            return [
                await m.tokens_and_logprobs_completion(**common, **{key: 3})
                for key in ("max_tokens", "max_new_tokens", "max_completion_tokens")
            ]

    for _, outputs, logprobs, finish in run(main()):
        assert [len(o) for o in outputs] == [3, 3] and [len(lp) for lp in logprobs] == [3, 3]
        assert finish == ["length", "length"]


def test_max_tokens_defaults_are_vllms(target: Target, tokenizer: Any) -> None:
    """Without max_tokens: 16 for a text completion (and so for token ids, which use
    /v1/completions), the rest of the context for a chat completion."""
    ids = tokenizer.encode(PROMPT)
    long_chat = [{"role": "user", "content": "7 " * (MAX_MODEL_LEN - 30)}]

    async def main() -> Any:
        async with target.manager() as m:
            text = await m.completion(prompt=PROMPT, ignore_eos=True)
            tokens = await m.tokens_and_logprobs_completion(input_ids=ids, ignore_eos=True)
            chat = await m.chat_completion(messages=long_chat, ignore_eos=True)
            return text, tokens, chat

    text, (_, (out,), _, (reason,)), chat = run(main())
    assert text.usage.completion_tokens == 16 and text.choices[0].finish_reason == "length"
    assert len(out) == 16 and reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == MAX_MODEL_LEN
    assert chat.choices[0].finish_reason == "length"


def test_a_prompt_past_the_context_is_a_4xx_and_not_retried(target: Target) -> None:
    sent = []

    async def main() -> InferenceError:
        async with target.manager(max_attempts=3) as m:
            backend = m.servers[0]
            call = backend.tokens_and_logprobs_completion

            async def counted(**kwargs: Any) -> Any:
                sent.append(kwargs)
                return await call(**kwargs)

            backend.tokens_and_logprobs_completion = counted  # type: ignore[method-assign]
            with pytest.raises(InferenceError) as refused:
                await m.tokens_and_logprobs_completion(
                    input_ids=[5] * (MAX_MODEL_LEN + 4), max_tokens=8
                )
            return refused.value

    error = run(main())
    assert error.status_code == 400 and not error.retryable, error
    assert "maximum context length is 4096" in str(error), error
    assert len(sent) == 1


def test_logprobs_stay_the_policys_past_its_trained_positions(
    target: Target, reference: Callable[..., list[float]]
) -> None:
    """The tiny policy was trained on 128 positions; both servers allow 4096 (RoPE runs on),
    and their logprobs there are still transformers' (a vLLM told to allow it by
    VLLM_ALLOW_LONG_MAX_MODEL_LEN instead of a longer rotary table answers NaN)."""
    ids = [50, 81, 288, 327, 83, 278, 279, 506, 308] * 100

    async def main() -> Any:
        async with target.manager() as m:
            return await m.tokens_and_logprobs_completion(
                input_ids=ids, n=2, max_tokens=8, seed=2, ignore_eos=True
            )

    _, outputs, logprobs, _ = run(main())
    for out, lps in zip(outputs, logprobs, strict=True):
        assert len(out) == 8 and worst(lps, reference(ids, out)) < TOLERANCE


@pytest.mark.parametrize("top_k", [1, 3])
def test_prompt_logprobs_are_the_policys_top_k(
    target: Target, tokenizer: Any, logprob_table: Callable[[list[int]], Any], top_k: int
) -> None:
    """`get_logprobs`: per prompt position the k best ids and logprobs, best first, as
    transformers ranks them; position 0 has none."""
    ids = tokenizer.encode("Question: what is 12 + 7? Answer: 19")

    async def main() -> Any:
        async with target.manager() as m:
            first = await m.get_logprobs(input_ids=ids, top_k=top_k)
            await m.tokens_and_logprobs_completion(input_ids=ids, max_tokens=2)  # cache it
            again = await m.get_logprobs(input_ids=ids, top_k=top_k)
            by_text = await m.get_logprobs(prompt=tokenizer.decode(ids), top_k=top_k)
            return first, again, by_text

    first, again, by_text = run(main())
    table = logprob_table(ids)
    for scored in (first, again):
        assert scored["prompt_tokens"] == ids
        assert scored["prompt_topk_token_ids"][0] == scored["prompt_topk_logprobs"][0] == []
        for pos in range(1, len(ids)):
            best = table[pos - 1].topk(top_k)
            got_ids = scored["prompt_topk_token_ids"][pos]
            got = scored["prompt_topk_logprobs"][pos]
            assert worst(got, [float(x) for x in best.values]) < TOLERANCE
            assert got == sorted(got, reverse=True) and len(got_ids) == top_k
            for token, lp in zip(got_ids, got, strict=True):  # ties may swap ids: check values
                assert math.isclose(float(table[pos - 1, token]), lp, abs_tol=TOLERANCE)
    assert by_text["prompt_tokens"] == ids


def test_chat_completion_answers_with_the_template_and_logprobs(
    target: Target, tokenizer: Any, reference: Callable[..., list[float]]
) -> None:
    messages = [{"role": "user", "content": "What is 12 + 7?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)

    async def main() -> Any:
        async with target.manager() as m:
            return await m.chat_completion(
                messages=messages, max_tokens=8, temperature=0.0, logprobs=True
            )

    chat = run(main())
    (choice,) = chat.choices
    assert chat.model == "atropos-tiny" and chat.usage.prompt_tokens == len(ids)
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    content = [t.logprob for t in choice.logprobs.content]
    out = tokenizer.encode(choice.message.content, add_special_tokens=False) + [EOS]
    assert worst(content, reference(ids, out)) < TOLERANCE


def test_concurrent_calls_each_get_their_own_answer(
    target: Target, tokenizer: Any, reference: Callable[..., list[float]]
) -> None:
    """32 calls in flight at once (batched together by the server): every answer is for its
    own prompt, and its logprobs are still the policy's for its own ids."""
    prompts = [tokenizer.encode(f"Question: {i} + {i} = ") for i in range(32)]

    async def main() -> list[Any]:
        async with target.manager() as m:
            return await asyncio.gather(
                *(
                    m.tokens_and_logprobs_completion(
                        input_ids=ids, n=2, max_tokens=6, temperature=1.0, seed=i
                    )
                    for i, ids in enumerate(prompts)
                )
            )

    answers = run(main())
    for ids, (prompt, outputs, logprobs, _) in zip(prompts, answers, strict=True):
        assert prompt == ids
        for out, lps in zip(outputs, logprobs, strict=True):
            assert worst(lps, reference(ids, out)) < TOLERANCE
