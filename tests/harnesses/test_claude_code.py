"""The Claude Code harness end to end: the real `claude` binary (2.1.332, installed once, cached)
in a bubblewrap sandbox whose only network is the rollout proxy, over the fake inference server
with a scripted policy answering in the tiny model's chat template (Hermes `<tool_call>`s, which
the proxy turns into Anthropic `tool_use` blocks, streamed). The harness edits a file with its
Edit tool, the task's test scores it, and what is trained is what the server returned; a
hanging Bash command is a failed rollout (timeout), not a score. Its exit reading is checked on
the result events it writes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from atropos.harnesses.base import HarnessCall
from atropos.harnesses.claude_code import ClaudeCode, last_result
from atropos.harnesses.env import HarnessEnv
from atropos.sandbox import ExecResult
from atropos.testing import FakeInferenceServer

from .helpers import collect_harness, greet_task

first_calls = itertools.count()


def call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def policy(prompt: str) -> str:
    """Turn 1: Edit greet.py (every other rollout of [fix] writes a wrong word); turn 2: done.
    [hang]: a Bash command that outlives the harness's deadline."""
    if "<|im_start|>tool" in prompt:  # the edit's result is back
        return "Done: greet.py now prints goodbye."
    if "[hang]" in prompt:
        # (a bare `sleep N` is refused by its Bash tool: it asks for run_in_background)
        wait = "python3 -c 'import time; time.sleep(60)'"
        return call("Bash", {"command": wait, "description": "wait"})
    word = "goodbye" if next(first_calls) % 2 == 0 else "goodby"
    edit = {"file_path": "/work/repo/greet.py", "old_string": "hello", "new_string": word}
    return call("Edit", edit)


@pytest.fixture(scope="module")
def fake() -> Any:
    # Claude Code's prompt is ~25k tiny-tokenizer tokens and it asks for 32,000 more
    with FakeInferenceServer(responder=policy, max_model_len=131072) as server:
        yield server


def tasks(tmp_path: Path, marker: str) -> str:
    return greet_task(tmp_path, marker)


def collect(url: str, source: str, **config: Any) -> tuple[Any, HarnessEnv]:
    return collect_harness("claude-code", url, source, **config)


def test_claude_code_edits_the_file_and_the_test_scores_it(fake: Any, tmp_path: Path) -> None:
    fake.reset_counters()
    (group, backlog), env = collect(fake.base_url, tasks(tmp_path, "[fix]"))
    assert backlog == [] and group is not None
    assert sorted(group["scores"]) == [0.0, 1.0]  # the right edit passes, the wrong one fails
    assert env.exits == {"ok": 2}
    trained = [
        [t for t, m in zip(*row, strict=True) if m != -100]
        for row in zip(group["tokens"], group["masks"], strict=True)
    ]
    # one extending conversation per rollout (the Edit, sent back with replace_all added,
    # still extends the model's own tokens), and every trained token is the server's
    assert len(trained) == 2
    assert sum(map(len, trained)) == fake.tokens_generated
    for tokens in trained:
        text = env.tokenizer.decode(tokens)
        assert '"name": "Edit"' in text and "Done: greet.py now prints goodbye." in text


def test_a_turn_limit_ends_the_run_and_its_work_is_scored(fake: Any, tmp_path: Path) -> None:
    (group, _), env = collect(fake.base_url, tasks(tmp_path, "[fix]"), max_agent_turns=1)
    assert group is not None and sorted(group["scores"]) == [0.0, 1.0]
    assert env.exits == {"limit": 2}


def test_a_hanging_command_is_a_failed_rollout_not_a_score(fake: Any, tmp_path: Path) -> None:
    (group, _), env = collect(fake.base_url, tasks(tmp_path, "[hang]"), agent_timeout=8.0)
    assert group is None  # a failed rollout drops the group: never scored 0
    assert env.failures["timeout"] == 2 and env.exits == {"timeout": 2}


# How its exit is read (the result event of --output-format stream-json)

DONE = {"type": "result", "subtype": "success", "is_error": False, "result": "fixed"}


def outcome(events: list[dict[str, Any]], exit_code: int = 0, calls: int = 1, **kw: Any) -> Any:
    lines = b"".join(json.dumps(event).encode() + b"\n" for event in events)
    return ClaudeCode().outcome(ExecResult(exit_code, lines, b"", **kw), calls)


def test_outcome_reads_the_result_event() -> None:
    assert outcome([{"type": "system"}, DONE]) == outcome([DONE])
    assert (outcome([DONE]).ok, outcome([DONE]).output) == (True, "fixed")
    denied = {**DONE, "permission_denials": [{"tool_name": "Bash"}]}
    assert (outcome([denied]).ok, outcome([denied]).reason) == (False, "approval")
    turns = {**DONE, "subtype": "error_max_turns", "is_error": True, "terminal_reason": "max_turns"}
    assert (outcome([turns], 1).ok, outcome([turns], 1).reason) == (True, "limit")
    refused = {**DONE, "is_error": True, "api_error_status": 400}
    limit = outcome([{**refused, "result": "API Error: 400 session s reached max_turns=3"}], 1)
    assert (limit.ok, limit.reason) == (True, "limit")
    broken = outcome([{**refused, "result": "API Error: 502 the inference server failed"}], 1)
    assert (broken.ok, broken.reason) == (False, "model_error")
    assert outcome([DONE], calls=0).reason == "no_model_call"
    assert outcome([], exit_code=1).reason == "exit_nonzero"
    assert outcome([]).reason == "no_result"
    assert outcome([], exit_code=-9).reason == "crashed"
    assert outcome([], exit_code=-9, timed_out=True).reason == "timeout"
    assert last_result(b'not json\n{"type": "result", "n": 1}\n[1]\n{"type": "res') == {
        "type": "result",
        "n": 1,
    }


def test_the_command_and_environment_point_it_at_the_session() -> None:
    call = HarnessCall("-x; rm", "http://127.0.0.1:9/s/a", "k", "m", "/w/r", "/w/h", 3, 5.0)
    harness = ClaudeCode(tools="Bash,Edit")
    argv = harness.command(call)
    assert argv[-2:] == ["--", "-x; rm"]  # the instruction is never read as an option
    assert argv[argv.index("--max-turns") + 1] == "3" and "--tools" in argv
    env = harness.environment(call)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/s/a" and env["HOME"] == "/w/h"
    assert env["ANTHROPIC_API_KEY"] == "k" and env["ANTHROPIC_SMALL_FAST_MODEL"] == "m"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert list(harness.files(call)) == ["/w/h/.claude.json"]
