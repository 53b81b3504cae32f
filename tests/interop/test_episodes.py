"""The protocol-neutral episode layer (`atropos.interop.episodes`), in process: which kind each
environment is, a game and a single-turn episode driven both ways (a tool call, a reply), the
refusal of an env whose loop cannot be split naming why, and the shared pieces (key reader,
`ORSError` as a `RolloutFailed`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from atropos.envs.outcome import RolloutFailed, failure_reason
from atropos.interop.episodes import OVER, Game, SingleTurn, Step, adapter
from atropos.interop.ors import ORSError
from atropos.interop.publishing import configured_env, take_api_key


async def _set_up(name: str, *flags: str) -> Any:
    found = adapter(configured_env(name, list(flags)))
    await found.setup()
    return found


def test_single_turn_a_call_and_a_reply_score_alike() -> None:
    async def run() -> tuple[Step, Step, Step]:
        found = await _set_up("gsm8k")
        assert isinstance(found, SingleTurn) and set(found.splits) == {"train", "test"}
        item = found.item(len(found.splits["train"]))  # a seed past the end wraps round
        assert item is found.splits["train"][0]
        by_call = await (await found.start(item)).call("answer", {"answer": "\\boxed{-1}"})
        episode = await found.start(item)
        by_reply = await episode.reply("\\boxed{-1}")
        return by_call, by_reply, await episode.reply("again")

    by_call, by_reply, again = asyncio.run(run())
    assert by_call == by_reply == Step("score: -1", -1.0, True)
    assert again == OVER


def test_a_game_rewards_at_the_end_and_is_cut_at_max_turns() -> None:
    pytest.importorskip("gymnasium")
    hit = '<tool_call>{"name": "take_action", "arguments": {"action": "hit"}}</tool_call>'

    async def run() -> list[Step]:
        found = await _set_up("blackjack", "--env.max_turns=2")
        assert isinstance(found, Game) and len(found.splits["test"]) == 100
        episode = await found.start(found.item(0))
        with pytest.raises(ValueError, match="not a valid tool"):
            await episode.call("answer", {"answer": "x"})
        with pytest.raises(ValueError, match="'command'"):
            await episode.call("act", {"move": hit})
        return [await episode.call("act", {"command": hit}) for _ in range(3)]

    steps = asyncio.run(run())
    finished = next(i for i, s in enumerate(steps) if s.finished)
    assert finished <= 1 and steps[finished + 1] == OVER  # max_turns=2 cuts it at the latest
    assert all(s.reward == 0.0 for s in steps[:finished])


def test_an_env_whose_loop_is_whole_is_refused_naming_why() -> None:
    with pytest.raises(ValueError, match="cannot be published") as refused:
        adapter(configured_env("mt_grpo", []))
    assert "whole group" in str(refused.value) and "mcp_tools" in str(refused.value)


def _replies(turn: Any) -> str:
    calls = "".join(f"<tool_call>{json.dumps(dict(c))}</tool_call>" for c in turn.calls)
    return f"<think>as asked</think>{calls}"


def test_tool_use_multiturn_a_reply_per_turn_judged_by_the_env() -> None:
    async def run() -> tuple[Any, list[Step], list[Step]]:
        found = await _set_up("tool_use_multiturn", "--env.scenarios", '["multistep"]')
        assert [t["name"] for t in found.tools] == ["reply"]
        episode = next(e for e in found.splits["train"] if len(e.turns) > 1)
        right = await found.start(episode)
        good = [await right.call("reply", {"text": _replies(t)}) for t in episode.turns]
        wrong = await found.start(episode)
        bad = [await wrong.reply("<think>hm</think>no calls"), await wrong.reply("again")]
        return episode, good, bad

    episode, good, bad = asyncio.run(run())
    *between, last = good
    assert all(s.reward is None and not s.finished for s in between)
    assert between[0].messages == tuple(episode.turns[1].replay)  # the recorded responses
    assert last.finished and last.reward == 1.5  # multistep, every call right: the bonus
    assert bad[0].finished and bad[0].reward is not None and bad[0].reward < 0
    assert bad[1] == OVER


def test_the_shared_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_API_KEY", "from-env")
    assert take_api_key(["--env.x", "1"]) == (["--env.x", "1"], "from-env")
    assert take_api_key(["--api-key", "k", "--env.x=1"]) == (["--env.x=1"], "k")
    failed = ORSError("ors_timeout", "no answer")
    assert isinstance(failed, RolloutFailed) and failure_reason(failed) == "ors_timeout"
    assert (failed.reason, failed.detail, str(failed)) == (
        "ors_timeout",
        "no answer",
        "ors_timeout: no answer",
    )
