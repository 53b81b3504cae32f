"""The Codex CLI harness end to end: the real `codex` binary (installed once, cached) in a
bubblewrap sandbox whose only network is the rollout proxy, over the fake inference server with
a scripted policy answering in the tiny model's chat template (Hermes `<tool_call>`s, which the
proxy turns into Responses function calls). The harness edits a file with `apply_patch` through
its `exec_command` tool, the task's test scores it, and what is trained is what the server
returned; a hanging command is a failed rollout (timeout), not a score."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.harnesses.base import HarnessCall
from atropos.harnesses.codex import Codex, config_toml, read_events
from atropos.harnesses.env import HarnessEnv
from atropos.sandbox import ExecResult
from atropos.testing import FakeInferenceServer

from .helpers import collect_harness, greet_task

PATCH = (
    "*** Begin Patch\n*** Update File: greet.py\n-print('hello')\n+print('{word}')\n*** End Patch"
)
first_calls = itertools.count()


def call(arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': 'exec_command', 'arguments': arguments})}</tool_call>"


def policy(prompt: str) -> str:
    """Turn 1: patch greet.py (every other rollout of [fix] writes a wrong word); turn 2: done.
    [hang]: a command that outlives the harness's deadline."""
    if "<|im_start|>tool" in prompt:  # the patch's result is back
        return "Done: greet.py now prints goodbye."
    if "[hang]" in prompt:
        return call({"cmd": "sleep 60", "yield_time_ms": 30000})
    word = "goodbye" if next(first_calls) % 2 == 0 else "goodby"
    return call({"cmd": f"apply_patch <<'EOF'\n{PATCH.format(word=word)}\nEOF"})


@pytest.fixture(scope="module")
def fake() -> Any:
    # Codex's own instructions and tools are ~12k tiny-tokenizer tokens a call
    with FakeInferenceServer(responder=policy, max_model_len=65536) as server:
        yield server


@pytest.fixture(autouse=True)
def nothing_left(sandbox_root: Path) -> Iterator[None]:
    """After a run no sandbox folder nor uid reservation is left in the test's run root."""
    yield
    left = [str(p) for p in sandbox_root.glob("owner-*/*")]
    assert left + [str(p) for p in sandbox_root.glob("uids/*")] == []


def tasks(tmp_path: Path, marker: str) -> str:
    return greet_task(tmp_path, marker)


def collect(url: str, source: str, **config: Any) -> tuple[Any, HarnessEnv]:
    return collect_harness("codex", url, source, **config)


def test_codex_patches_the_file_and_the_test_scores_it(fake: Any, tmp_path: Path) -> None:
    fake.reset_counters()
    (group, backlog), env = collect(fake.base_url, tasks(tmp_path, "[fix]"))
    assert backlog == [] and group is not None
    assert sorted(group["scores"]) == [0.0, 1.0]  # the right edit passes, the wrong one fails
    assert env.exits == {"ok": 2}
    trained = [
        [t for t, m in zip(*row, strict=True) if m != -100]
        for row in zip(group["tokens"], group["masks"], strict=True)
    ]
    assert len(trained) == 2  # one extending conversation per rollout (patch, then answer)
    assert sum(map(len, trained)) == fake.tokens_generated  # every trained token is the server's
    tok = env.tokenizer
    for tokens in trained:
        text = tok.decode(tokens)
        assert "apply_patch" in text and "Done: greet.py now prints goodbye." in text


def test_a_session_limit_ends_the_run_and_its_work_is_scored(fake: Any, tmp_path: Path) -> None:
    (group, _), env = collect(fake.base_url, tasks(tmp_path, "[fix]"), max_agent_turns=1)
    assert group is not None and sorted(group["scores"]) == [0.0, 1.0]  # the patch stands
    assert env.exits == {"limit": 2} and not env.failures


def test_a_hanging_command_is_a_failed_rollout_not_a_score(fake: Any, tmp_path: Path) -> None:
    (group, _), env = collect(fake.base_url, tasks(tmp_path, "[hang]"), agent_timeout=6.0)
    assert group is None  # a failed rollout drops the group: never scored 0
    assert env.failures["timeout"] == 2 and env.exits == {"timeout": 2}


def outcome(stdout: list[dict[str, Any]], exit_code: int = 0, calls: int = 1) -> Any:
    lines = b"".join(json.dumps(event).encode() + b"\n" for event in stdout)
    return Codex().outcome(ExecResult(exit_code, lines, b""), calls)


def test_outcome_reads_the_json_events() -> None:
    said = {"type": "item.completed", "item": {"type": "agent_message", "text": "fixed"}}
    assert outcome([said, {"type": "turn.completed"}]).output == "fixed"
    refused = json.dumps({"error": {"message": "session s reached max_turns=3"}})
    limit = outcome([{"type": "turn.failed", "error": {"message": refused}}], exit_code=1)
    assert (limit.ok, limit.reason, limit.detail) == (
        True,
        "limit",
        "session s reached max_turns=3",
    )
    cut = "Incomplete response returned, reason: max_output_tokens"
    assert outcome([{"type": "turn.failed", "error": {"message": cut}}], 1).reason == "limit"
    broken = outcome([{"type": "turn.failed", "error": {"message": "stream closed"}}], 1)
    assert (broken.ok, broken.reason) == (False, "model_error")
    assert outcome([], exit_code=1, calls=0).reason == "no_model_call"
    assert outcome([], exit_code=-9).reason == "crashed"
    declined = {
        "type": "item.completed",
        "item": {"type": "command_execution", "status": "declined"},
    }
    assert outcome([declined], 1).reason == "approval"
    assert read_events(b'{"type": "a"}\nnot json\n[1]\n{"type": "b"') == [{"type": "a"}]


def test_the_config_quotes_what_it_is_given() -> None:
    call = HarnessCall("x", 'http://127.0.0.1:1/s/a"b/v1', "k", "m\\n", "/w", "/h", None, 5.0)
    text = config_toml(call)
    assert 'base_url = "http://127.0.0.1:1/s/a\\"b/v1"' in text
    assert 'model = "m\\\\n"' in text and "stream_idle_timeout_ms = 5000" in text
    assert re.search(r'^wire_api = "responses"$', text, re.M)
