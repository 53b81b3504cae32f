"""ORS out: `atropos env publish NAME --as ors` driven by openreward's own client (run by the
interop venv) through a full session of gsm8k, tool_calling, textworld, mcp_tools (its MCP
tools run by its servers) and a game (blackjack): splits, task count,
tools, prompt and messages, tool calls with their rewards and `finished`; and the HTTP rules:
a key beyond loopback, checked when set."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from atropos.cli.main import main as atropos_main
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.tool_calling import load_rows
from atropos.rewards.math import gsm8k_gold

from .ors_helpers import openreward_session, published


def test_gsm8k_a_full_session(interop_python: Path) -> None:
    item = read_jsonl(data_path("gsm8k", "train.jsonl"))[0]
    right = f"\\boxed{{{gsm8k_gold(item['answer'])}}}"
    with published("gsm8k") as url:
        report = openreward_session(interop_python, url, "gsm8k", [
            {"name": "answer", "input": {"answer": right}},
            {"name": "answer", "input": {"answer": "again"}},  # not sent: the episode finished
        ])  # fmt: skip
        wrong = openreward_session(interop_python, url, "gsm8k", [
            {"name": "answer", "input": {"answer": "\\boxed{-1}"}}
        ], split="test", index=1)  # fmt: skip
    assert report["splits"] == ["test", "train"] and report["tools"] == ["answer"]
    assert report["num_tasks"] == len(read_jsonl(data_path("gsm8k", "train.jsonl")))
    assert report["task"] == {"split": "train", "index": 0}
    assert item["question"] in report["prompt"] and report["roles"] == ["system", "user"]
    assert report["outputs"] == [{"text": "score: 1", "reward": 1.0, "finished": True}]
    assert wrong["outputs"][0]["reward"] == -1.0 and wrong["outputs"][0]["finished"]


def test_tool_calling_a_full_session_and_a_bad_call(interop_python: Path) -> None:
    item = load_rows("train")[0]
    answer = "\n".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in item["expected"])
    with published("tool_calling") as url:
        report = openreward_session(interop_python, url, "tool_calling", [
            {"name": "search", "input": {}},  # no such tool: refused, the session goes on
            {"name": "answer", "input": {"text": "x"}},  # bad input: refused too
            {"name": "answer", "input": {"answer": answer}},
        ])  # fmt: skip
    assert item["request"] in report["prompt"]
    first, second, third = report["outputs"]
    assert "not a valid tool" in first["error"] and "answer" in second["error"]
    assert third == {"text": "score: 1", "reward": 1.0, "finished": True}


def test_textworld_a_full_game(interop_python: Path, tmp_path: Path) -> None:
    pytest.importorskip("textworld")
    from atropos.environments.textworld.generate import GameSpec, ensure_game, walkthrough

    game = asyncio.run(ensure_game(tmp_path, GameSpec.of("easy", quests=2), 0))
    commands = walkthrough(game)
    assert commands
    flags = ["--env.difficulty=easy", "--env.nb_quests=2", "--env.num_games=1"]
    flags += ["--env.first_seed=0", f"--env.cache_dir={tmp_path}", "--env.max_turns=20"]
    with published("textworld", *flags) as url:
        calls = [{"name": "act", "input": {"command": c}} for c in commands]
        report = openreward_session(interop_python, url, "textworld", calls)
    assert report["tools"] == ["act"] and report["num_tasks"] == 1
    rewards = [o["reward"] for o in report["outputs"]]
    assert sum(rewards) == pytest.approx(1.0)  # the score's changes: every point, in steps
    assert [o["finished"] for o in report["outputs"]] == [False] * (len(commands) - 1) + [True]


def test_a_key_is_checked_and_needed_beyond_loopback(
    interop_python: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with published("gsm8k", env={"ATROPOS_API_KEY": "k3y"}) as url:
        assert httpx.get(f"{url}/gsm8k/splits").status_code == 401
        assert httpx.get(f"{url}/gsm8k/splits", headers={"X-API-Key": "k3y"}).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200
        report = openreward_session(interop_python, url, "gsm8k", [], key="k3y")
        assert report["tools"] == ["answer"]
        foreign = httpx.get(f"{url}/gsm8k/splits", headers={"Host": "attacker.example"})
        assert foreign.status_code == 403  # the HTTP rules: DNS rebinding refused
    assert atropos_main(["env", "publish", "gsm8k", "--as", "ors", "--host", "0.0.0.0"]) == 2
    assert "ATROPOS_API_KEY" in capsys.readouterr().err


def test_an_env_with_its_own_loop_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["env", "publish", "mt_grpo", "--as", "ors", "--port", "1"]
    assert atropos_main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot be published" in err and "whole group" in err


def test_mcp_tools_its_tools_run_by_its_servers_and_scored_at_the_answer(
    interop_python: Path,
) -> None:
    pytest.importorskip("mcp")
    convert = {"value": 42, "from_unit": "km", "to_unit": "mi"}
    with published("mcp_tools") as url:  # the shipped fixture MCP server, started by the env
        report = openreward_session(interop_python, url, "mcp_tools", [
            {"name": "convert_units", "input": convert},
            {"name": "search", "input": {}},  # not one of its tools: refused, the session goes on
            {"name": "answer", "input": {"answer": "26.1"}},
        ])  # fmt: skip
    assert {"convert_units", "lookup_item", "answer"} <= set(report["tools"])
    assert report["splits"] == ["test", "train"] and "42 km" in report["prompt"]
    tool, refused, answer = report["outputs"]
    assert tool == {"text": "26.09759", "reward": None, "finished": False}
    assert "not a valid tool" in refused["error"]
    assert answer == {"text": "score: 1", "reward": 1.0, "finished": True}


def test_a_game_is_published_too(interop_python: Path) -> None:
    with published("blackjack", "--env.max_turns=3") as url:
        hit = '<tool_call>{"name": "take_action", "arguments": {"action": "hit"}}</tool_call>'
        calls = [{"name": "act", "input": {"command": hit}}] * 4  # a move as the rules write it
        report = openreward_session(interop_python, url, "blackjack", calls)
    assert report["tools"] == ["act"] and report["splits"] == ["test", "train"]
    assert "hand" in report["prompt"].lower()
    *before, last = report["outputs"]
    assert last["finished"] and all(o["reward"] == 0.0 and not o["finished"] for o in before)
    assert len(report["outputs"]) <= 3  # --env.max_turns ends it, scored as it stands
