"""`ManagedServer` sessions against both servers of the tiny policy (`target`): a sequence holds
exactly the ids the server generated, turn after turn, with the trainer's masks and the server's
logprobs (held to transformers' forward pass over the whole sequence)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from atropos.inference.sequence import MASKED, PROMPT_LOGPROB, DriftKind

from .helpers import Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TOLERANCE = 1e-4


class Recorder:
    """Wraps the backend's `tokens_and_logprobs_completion`: every answer, as the server gave it."""

    def __init__(self, backend: Any) -> None:
        self.calls: list[tuple[list[int], Any]] = []
        self._call = backend.tokens_and_logprobs_completion
        backend.tokens_and_logprobs_completion = self

    async def __call__(self, **kwargs: Any) -> Any:
        answer = await self._call(**kwargs)
        self.calls.append((list(kwargs["input_ids"]), answer))
        return answer


def check_logprobs(node: Any, table: Callable[[list[int]], Any]) -> int:
    """Every trained position's logprob is the policy's for that id after the ids before it;
    every masked one is the placeholder. Returns how many positions are trained."""
    rows = table(node.tokens)
    trained = 0
    for i, (token, mask, lp) in enumerate(
        zip(node.tokens, node.masked_tokens, node.logprobs, strict=True)
    ):
        if mask == MASKED:
            assert lp == PROMPT_LOGPROB
            continue
        assert mask == token and i > 0
        assert abs(float(rows[i - 1, token]) - lp) < TOLERANCE, (i, token, lp)
        trained += 1
    return trained


def test_a_two_turn_chat_holds_the_servers_ids_and_masks(
    target: Target, tokenizer: Any, logprob_table: Callable[[list[int]], Any]
) -> None:
    question = [{"role": "user", "content": "What is 12 + 7?"}]

    async def main() -> Any:
        async with target.manager(tokenizer) as m:
            recorder = Recorder(m.servers[0])
            async with m.managed_server(tokenizer) as managed:
                first = await managed.chat_completion(
                    messages=question, n=2, max_tokens=8, temperature=1.0, seed=1
                )
                reply = first.choices[0].message.content
                follow_up = [
                    *question,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": "And 3 + 4?"},
                ]
                second = await managed.chat_completion(
                    messages=follow_up, max_tokens=8, temperature=1.0, seed=2
                )
                return first, second, managed.get_state()["nodes"], managed.drift_counts, recorder

    first, second, nodes, drift, recorder = asyncio.run(main())
    (sent1, (prompt1, outs1, lps1, _)), (sent2, (prompt2, outs2, lps2, _)) = recorder.calls
    rendered = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert sent1 == prompt1 == tokenizer.encode(rendered, add_special_tokens=False)
    turn1 = prompt1 + outs1[0]
    assert prompt2[: len(turn1)] == turn1  # the held ids, never re-tokenized
    assert drift[DriftKind.CLEAN] + drift[DriftKind.REALIGN] == 1 and drift[DriftKind.FORK] == 0
    assert first.choices[0].message.content == tokenizer.decode(outs1[0], skip_special_tokens=True)
    assert second.choices[0].message.content == tokenizer.decode(outs2[0], skip_special_tokens=True)

    other, extended = sorted(nodes, key=lambda n: len(n.tokens))  # choice 1, then the chat
    assert other.tokens == prompt1 + outs1[1] and other.logprobs[len(prompt1) :] == lps1[1]
    assert extended.tokens == prompt2 + outs2[0]
    expected_masks = (
        [MASKED] * len(prompt1) + outs1[0] + [MASKED] * (len(prompt2) - len(turn1)) + outs2[0]
    )
    assert extended.masked_tokens == expected_masks
    assert extended.logprobs[len(prompt1) : len(turn1)] == lps1[0]
    assert extended.logprobs[len(prompt2) :] == lps2[0]
    assert check_logprobs(extended, logprob_table) == len(outs1[0]) + len(outs2[0])
    assert check_logprobs(other, logprob_table) == len(outs1[1])
    assert extended.messages is not None and extended.messages[-1]["role"] == "assistant"


def test_a_turn_continued_by_ids_keeps_every_id(
    target: Target, tokenizer: Any, logprob_table: Callable[[list[int]], Any]
) -> None:
    """`continue_turn`: ids inserted after a node (masked), then the policy writes on; the
    server must answer for exactly node + inserted, or the session refuses."""
    question = [{"role": "user", "content": "What is 5 + 9?"}]
    inserted = tokenizer.encode(" 1", add_special_tokens=False)

    async def main() -> Any:
        async with target.manager(tokenizer) as m:
            async with m.managed_server(tokenizer) as managed:
                turn = await managed.chat_turn(
                    messages=question, max_tokens=4, temperature=1.0, seed=4
                )
                node = await managed.continue_turn(
                    turn.nodes[0], inserted, max_tokens=4, temperature=1.0, seed=5
                )
                return turn.nodes[0], node, managed.get_state()["nodes"]

    start, node, held = asyncio.run(main())
    assert node.tokens[: len(start.tokens)] == start.tokens
    at = len(start.tokens)
    assert node.tokens[at : at + len(inserted)] == inserted
    assert node.masked_tokens[at : at + len(inserted)] == [MASKED] * len(inserted)
    assert [n.tokens for n in held] == [node.tokens]  # the continuation took the node's place
    assert check_logprobs(node, logprob_table) == len(node.tokens) - at - len(inserted) + sum(
        m != MASKED for m in start.masked_tokens
    )


def test_raw_prompt_completions_extend_the_held_sequence(
    target: Target, tokenizer: Any, logprob_table: Callable[[list[int]], Any]
) -> None:
    """A prompt that continues a held sequence's text extends it by ids; one that continues
    only its visible text (the held ids end in an eos the text does not show) forks."""
    prompt = "Question: 8 + 8 = "

    async def main() -> Any:
        async with target.manager(tokenizer) as m:
            async with m.managed_server(tokenizer) as managed:
                first = await managed.completion(
                    prompt=prompt, max_tokens=1, temperature=1.0, seed=7
                )
                held = managed.get_state()["nodes"][0]
                more = prompt + first.choices[0].text + " and 2 + 2 = "
                await managed.completion(prompt=more, max_tokens=3, temperature=1.0, seed=8)
                return held, managed.get_state()["nodes"], managed.drift_counts

    held, nodes, drift = asyncio.run(main())
    if held.tokens[-1] == tokenizer.eos_token_id:  # "16<|im_end|>" is not the text "16"
        assert drift[DriftKind.FORK] == 1 and len(nodes) == 2
        assert nodes[0].tokens == held.tokens
    else:
        assert drift[DriftKind.FORK] == 0 and len(nodes) == 1
        assert nodes[0].tokens[: len(held.tokens)] == held.tokens
        assert nodes[0].masked_tokens[: len(held.tokens)] == held.masked_tokens
    for node in nodes:
        assert check_logprobs(node, logprob_table) >= 1
