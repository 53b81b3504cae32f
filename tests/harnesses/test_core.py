"""The harness runner and `HarnessEnv` with a command harness (a small bash-tool agent in
Python, run in the sandbox as `--env.harness COMMAND`): edits scored by the task's test, the
trained tokens the server's, failures (non-zero exit, hang, no model call) counted by reason
and never scored, and a rollout cancelled mid-run leaving no sandbox, session or process.

Cost: 8 tests, each one group of two rollouts in bubblewrap sandboxes, about 1 s each."""

from __future__ import annotations

import asyncio
import os
import shlex
from pathlib import Path

import pytest

from atropos.harnesses import harness_named
from atropos.harnesses.tasks import load_tasks, swe_patch_tasks
from atropos.sandbox._host import owner_label

from .helpers import Script, collect, make_env, tool_call, trained_tokens

AGENT = """
import json, os, subprocess, urllib.request
url, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
          "properties": {"command": {"type": "string"}}}}}]
messages = [{"role": "user", "content": os.environ["ATROPOS_INSTRUCTION"]}]
for _ in range(8):
    body = json.dumps({"model": os.environ["ATROPOS_MODEL"], "messages": messages,
                       "tools": tools, "max_tokens": 200}).encode()
    request = urllib.request.Request(url + "/chat/completions", body, method="POST",
        headers={"authorization": "Bearer " + key, "content-type": "application/json"})
    message = json.load(urllib.request.urlopen(request))["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        print(message["content"])
        break
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        out = subprocess.run(command, shell=True, capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": out.stdout + out.stderr})
"""
COMMAND = f"python3 -c {shlex.quote(AGENT)}"
GOOD = tool_call("bash", command="sed -i 's/a - b/a + b/' calc.py")
WRONG = tool_call("bash", command="sed -i 's/a - b/a * b/' calc.py")
DONE = "Fixed."


def test_the_edit_is_scored_by_the_tasks_test_and_the_tokens_are_the_servers(
    script_server, calc_tasks
):
    server = script_server(Script([GOOD, DONE]))
    group, exits = collect(make_env(server, calc_tasks, harness=COMMAND))
    assert group["scores"] == [1.0, 1.0] and exits == ["ok", "ok"]
    assert group["token_source"] == "server"
    assert trained_tokens(group) == server.tokens_generated  # every generated token, once
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)


def test_a_wrong_edit_scores_lower_in_the_same_group(script_server, calc_tasks):
    server = script_server(Script([GOOD, DONE], first=[GOOD, WRONG]))
    group, _ = collect(make_env(server, calc_tasks, harness=COMMAND))
    assert sorted(group["scores"]) == [0.0, 1.0]


@pytest.mark.parametrize(
    ("command", "reason", "timeout"),
    [
        (f"{COMMAND} && exit 3", "exit_nonzero", 120.0),  # called the model, then failed
        ("exec sleep 300", "timeout", 2.0),  # hangs past the wall time
        ("echo 'done, without asking anything'", "no_model_call", 120.0),
    ],
)
def test_a_failed_harness_is_a_failed_rollout_with_its_reason_never_a_score(
    script_server, calc_tasks, command, reason, timeout
):
    server = script_server(Script([GOOD, DONE]))
    env = make_env(server, calc_tasks, harness=command, agent_timeout=timeout)
    group, exits = collect(env)
    assert group is None and exits == [reason, reason]  # failed, never scored
    assert env.failures == {reason: 2} and env.failed_reason == f"agent_{reason}"
    env = make_env(server, calc_tasks, harness=command, agent_timeout=timeout,
                   failed_agent_score=-1.0)  # fmt: skip
    group, _ = collect(env)
    assert group is None or group["scores"] == [-1.0, -1.0]  # no model call: no row
    if group is not None:  # the opt-in scores them, marked the policy's: invalid/agent_failed
        assert {o["outcome"] for o in group["overrides"]} == {"invalid/agent_failed"}


def test_a_rollout_cancelled_mid_run_leaves_no_sandbox_session_or_process(
    script_server, calc_tasks, sandbox_root
):
    server = script_server(Script([GOOD, DONE]))
    env = make_env(server, calc_tasks, harness=f"{COMMAND} && exec sleep 987")
    owner = sandbox_root / owner_label()

    async def main() -> None:
        await env.setup()
        try:
            rollout = asyncio.create_task(env.rollout(env.items[0]))
            for _ in range(600):  # the harness asked the model, then hangs
                if server.tokens_generated and _sleepers():
                    break
                await asyncio.sleep(0.05)
            assert _sleepers() and env.proxy.sessions
            rollout.cancel()
            with pytest.raises(asyncio.CancelledError):
                await rollout
            assert not env.proxy.sessions
        finally:
            await env.aclose()

    asyncio.run(main())
    assert not _sleepers()
    assert not owner.exists() or not list(owner.iterdir())


def _sleepers() -> list[int]:
    """Processes running `sleep 987` (the harness that hangs)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00987\x00":
                found.append(int(pid))
        except (OSError, ValueError):
            continue
    return found


def test_tasks_from_a_tarball_and_from_swe_patch(tmp_path):
    from atropos.harnesses.tasks import tarball

    (tmp_path / "repo.tar").write_bytes(tarball({"./a.py": b"x = 1\n", "b/c.txt": b"c"}))
    (tmp_path / "t.jsonl").write_text(
        '{"instruction": "do", "snapshot": "repo.tar", "test": "true", "reward_file": "r"}\n'
    )
    [task] = load_tasks(str(tmp_path / "t.jsonl"))
    assert dict(task.files) == {"a.py": b"x = 1\n", "b/c.txt": b"c"} and task.reward_file == "r"
    swe = swe_patch_tasks()
    assert len(swe) >= 9 and all(t.files and t.test_files for t in swe)
    with pytest.raises(ValueError, match="instruction"):
        (tmp_path / "bad.jsonl").write_text('{"test": "true"}\n')
        load_tasks(str(tmp_path / "bad.jsonl"))
    with pytest.raises(ValueError, match="did you mean 'claude-code'"):
        harness_named("claude_code")
