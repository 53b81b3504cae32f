"""Tool calls and reasoning controls through vLLM's own parsers, against our client paths.

One extra vLLM for both (`PARSERS`): `--enable-auto-tool-choice --tool-call-parser hermes`
(`<tool_call>{json}</tool_call>`, the tiny policy's format), `--reasoning-parser qwen3`
(`<think>...</think>` split into `message.reasoning`), and structured outputs allowed inside
the reasoning. The tiny policy writes neither a call nor a think block by itself, so the output
is forced with vLLM's structured outputs (`structured_outputs: {"regex": ...}`, sent through
our clients' `extra_body`).

What vLLM 0.32 does here, measured, that the tests rely on or avoid:

* With a `--reasoning-parser`, a structured-outputs grammar is applied only once the reasoning
  has ended, unless the server is started with `--structured-outputs-config
  '{"enable_in_reasoning": true}'`: the tiny policy never ends a reasoning block, so without it
  the regex is silently not applied at all.
* The qwen3 parser reads an output without `</think>` as all reasoning (`content` null) unless
  the request turns thinking off (`chat_template_kwargs.enable_thinking: false`, which our
  `thinking_mode` / `reasoning_effort` "none" send): then everything is `content`.
* Under a grammar, the logprobs vLLM returns are those of the constrained distribution (the
  grammar's mask is applied to the logits before the sampler computes even its "raw" logprobs):
  at or above the model's own (its `prompt_logprobs` for the same ids), 0.0 where the grammar
  leaves one token. The ids are exact; a trainer that recomputes the model's logprobs sees the
  difference as off-policy.
* `thinking_token_budget` with a grammar that forbids `</think>` where the budget forces it
  fails the request (HTTP 500, "grammar rejected tokens"): the regexes here allow it anywhere.
  Our own budget on token-level generation (`ManagedServer`) cannot be combined with a
  grammar: its continuation request would restart the grammar mid-output.

Our local server has neither parser nor structured outputs, so these run against vLLM only;
the budget refusal runs on the plain `vllm_server`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from atropos.environments.tool_calling import score_item, score_message
from atropos.inference.config import ServerManagerConfig
from atropos.inference.errors import InferenceError, fatal_reason
from atropos.inference.manager import ServerManager
from atropos.inference.reasoning import Reasoning
from atropos.inference.sequence import DriftKind
from atropos.inference.tool_calls import parse_tool_calls
from atropos.testing.vllm import VLLMServer

from .helpers import MODEL, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server

PARSERS = (
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--reasoning-parser", "qwen3",
    "--structured-outputs-config", '{"enable_in_reasoning": true}',
)  # fmt: skip
"""The one extra server configuration of these tests."""

THINK, END_THINK = 1024, 1025  # the tiny tokenizer's <think> and </think>
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
CALL = r'<tool_call>\{"name": "add", "arguments": \{"a": 2, "b": 3\}\}</tool_call>'
THOUGHT = r"<think>[a-z ]{1,60}</think>[a-z ]{3,20}"  # </think> may come anywhere
EXPECTED = {"expected": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def manager(target: Target, tokenizer: Any, reasoning: Reasoning | None = None) -> ServerManager:
    """Our client of `target` alone (a 60 s deadline per call), with these reasoning settings."""
    settings = ServerManagerConfig(health_check_interval=0.5, deadline=60.0)
    return ServerManager([target.config()], settings, tokenizer=tokenizer, reasoning=reasoning)


def forced(regex: str, **more: Any) -> dict[str, Any]:
    return {"extra_body": {"structured_outputs": {"regex": regex}, **more}}


def model_logprobs(target: Target, ids: list[int]) -> list[float | None]:
    """The model's own log p(ids[t] | ids[:t]) from vLLM's `prompt_logprobs` (no grammar)."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}
    answer = httpx.post(f"{target.base_url}/completions", json=body | {"prompt_logprobs": 1})
    answer.raise_for_status()
    positions = answer.json()["choices"][0]["prompt_logprobs"]
    return [
        None if p is None else p[str(t)]["logprob"] for p, t in zip(positions, ids, strict=True)
    ]


@pytest.fixture(scope="module")
def parsing(vllm_servers: Any) -> Target:
    """vLLM with the hermes tool parser and the qwen3 reasoning parser (`PARSERS`)."""
    server: VLLMServer = vllm_servers.get(extra_args=PARSERS)
    return Target("vllm-parsers", server.base_url)


# ----- tool calls -----------------------------------------------------------------------------


def test_a_forced_hermes_call_reads_alike_through_vllms_parser_and_ours(
    parsing: Target, tokenizer: Any
) -> None:
    """The same request (same seed) through vLLM's chat route, whose hermes parser reads the
    call, and through `ManagedServer` (our template render, ids to /completions, our parser):
    one prompt, one output, one call; a reward of 1.0 from the tool_calling env either way."""

    async def main() -> Any:
        async with manager(parsing, tokenizer) as client:
            chat = await client.chat_completion(
                messages=ASK,
                tools=TOOLS,
                tool_choice="auto",
                max_tokens=64,
                seed=7,
                **forced(CALL, return_token_ids=True, logprobs=True),
            )
            async with client.managed_server(tokenizer) as managed:
                turn = await managed.chat_turn(
                    messages=ASK, tools=TOOLS, max_tokens=64, seed=7, **forced(CALL)
                )
            return chat, turn

    chat, turn = run(main())
    [choice] = chat.choices
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [theirs] = choice.message.tool_calls  # vLLM's hermes parser, in our client's answer
    assert score_message(EXPECTED, choice.message.model_dump()) == 1.0

    [raw] = turn.contents
    parsed = parse_tool_calls(raw, "hermes")
    [ours] = parsed.tool_calls
    assert parsed.content == "" and parsed.malformed == 0 and score_item(EXPECTED, raw) == 1.0
    assert ours["function"]["name"] == theirs.function.name == "add"
    assert json.loads(ours["function"]["arguments"]) == json.loads(theirs.function.arguments)

    [node] = turn.nodes
    prompt = turn.prompt_tokens
    output = node.tokens[len(prompt) :]
    assert prompt == chat.prompt_token_ids  # our render of the template is vLLM's
    assert output == choice.token_ids and output[-1] == 2  # the very ids vLLM sampled
    assert node.masked_tokens == [-100] * len(prompt) + output
    chat_logprobs = [entry.logprob for entry in choice.logprobs.content]
    generated = node.logprobs[len(prompt) :]
    assert generated == pytest.approx(chat_logprobs[: len(output)], abs=1e-5)
    # constrained logprobs: never below the model's own, 0.0 where the grammar left one token
    model = model_logprobs(parsing, node.tokens)[len(prompt) :]
    assert all(g >= m - 1e-4 for g, m in zip(generated, model, strict=True))  # type: ignore[operator]
    assert 0.0 in generated


def test_the_call_and_its_result_continue_the_sequence_by_the_held_ids(
    parsing: Target, tokenizer: Any
) -> None:
    """An agent sends the call back with the tool's result: the next prompt re-renders the
    raw call text, which may tokenize otherwise than the sampled ids (the grammar may spell
    `<tool_call>` by characters); the session keeps the sampled ids either way."""

    async def main() -> Any:
        async with manager(parsing, tokenizer) as client:
            async with client.managed_server(tokenizer) as managed:
                first = await managed.chat_turn(
                    messages=ASK, tools=TOOLS, max_tokens=64, seed=11, **forced(CALL)
                )
                [call] = parse_tool_calls(first.contents[0]).tool_calls
                history = [
                    *ASK,
                    {"role": "assistant", "content": first.contents[0]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "5"},
                ]
                second = await managed.chat_turn(
                    messages=history, tools=TOOLS, max_tokens=8, seed=11
                )
                return first.nodes[0], second.nodes[0], dict(managed.drift_counts)

    first, second, drift = run(main())
    assert second.drift in (DriftKind.CLEAN, DriftKind.REALIGN)
    assert drift[DriftKind.FORK] == 0
    assert second.tokens[: len(first.tokens)] == first.tokens
    assert second.masked_tokens[: len(first.tokens)] == first.masked_tokens
    assert second.logprobs[: len(first.tokens)] == first.logprobs


# ----- reasoning ------------------------------------------------------------------------------


def test_vllm_splits_a_forced_think_block_and_the_token_path_keeps_its_ids(
    parsing: Target, tokenizer: Any
) -> None:
    """thinking on (effort "low"): vLLM takes our switches, answers the block as `reasoning`
    and the rest as `content`; `ManagedServer` (same seed) gets the same ids, block included."""

    async def main() -> Any:
        reasoning = Reasoning(thinking=True, effort="low")
        async with manager(parsing, tokenizer, reasoning) as client:
            chat = await client.chat_completion(
                messages=ASK, max_tokens=64, seed=3, **forced(THOUGHT, return_token_ids=True)
            )
            async with client.managed_server(tokenizer) as managed:
                turn = await managed.chat_turn(
                    messages=ASK, max_tokens=64, seed=3, **forced(THOUGHT)
                )
            return chat, turn

    chat, turn = run(main())
    [choice] = chat.choices
    message = choice.message
    assert message.reasoning and message.content
    output = turn.nodes[0].tokens[len(turn.prompt_tokens) :]
    assert turn.prompt_tokens == chat.prompt_token_ids and output == choice.token_ids
    assert output[0] == THINK  # the grammar may spell the end by characters, not as 1025
    assert turn.contents[0] == f"<think>{message.reasoning}</think>{message.content}"


@pytest.mark.parametrize(
    ("reasoning", "split"),
    [
        (Reasoning(thinking=False, effort="none"), False),
        (Reasoning(thinking=True, effort="minimal"), True),
        (Reasoning(thinking=True, effort="xhigh"), True),
        (Reasoning(thinking=True), True),
        (Reasoning(thinking=True, effort="high", max_tokens=4), True),
    ],
    ids=["off", "minimal", "xhigh", "thinking", "budget"],
)
def test_vllm_takes_every_switch_we_send(
    parsing: Target, tokenizer: Any, reasoning: Reasoning, split: bool
) -> None:
    """Every level and switch is accepted (no 400); thinking off keeps the block in
    `content`; a budget is enforced by vLLM (at most that many tokens inside the block)."""

    async def main() -> Any:
        async with manager(parsing, tokenizer, reasoning) as client:
            return await client.chat_completion(
                messages=ASK, max_tokens=64, seed=5, **forced(THOUGHT, return_token_ids=True)
            )

    [choice] = run(main()).choices
    message, ids = choice.message, choice.token_ids
    if split:
        assert message.reasoning and "<think>" not in (message.content or "")
    else:
        assert message.reasoning is None and message.content.startswith("<think>")
    if reasoning.max_tokens is not None:  # the block is ended by vLLM: </think> as its token
        assert ids[0] == THINK and 0 < ids.index(END_THINK) - 1 <= reasoning.max_tokens


def test_a_budget_to_a_vllm_without_a_reasoning_parser_is_fatal(
    vllm_server: VLLMServer, tokenizer: Any
) -> None:
    """vLLM refuses `thinking_token_budget` unless started with `--reasoning-parser`: the error
    stops a run (not retried, not a reward-0 rollout) and names both fixes."""
    target = Target("vllm", vllm_server.base_url)

    async def main() -> None:
        reasoning = Reasoning(thinking=True, max_tokens=8)
        async with manager(target, tokenizer, reasoning) as client:
            await client.chat_completion(messages=ASK, max_tokens=8)

    with pytest.raises(InferenceError) as caught:
        run(main())
    reason = fatal_reason(caught.value)
    assert reason is not None and caught.value.status_code == 400
    assert "--reasoning-parser" in reason and "max_reasoning_tokens" in reason
