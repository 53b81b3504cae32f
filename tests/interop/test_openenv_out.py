"""OpenEnv out: `atropos env publish NAME --as openenv` serves gsm8k, tool_calling and
textworld, and openenv-core's own client (in the interop venv) plays full episodes of them;
the rewards are the environments' own scores. The server keeps our HTTP rules."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.envs import registry
from atropos.envs.cli import parse
from atropos.interop.openenv.launch import free_port

DRIVE = Path(__file__).parent / "openenv_envs" / "drive.py"


@contextmanager
def published(name: str, *flags: str) -> Iterator[str]:
    """`atropos env publish NAME --as openenv` on 127.0.0.1, stopped by its pid."""
    port = free_port()
    cmd = [sys.executable, "-m", "atropos", "env", "publish", "--as", "openenv"]
    proc = subprocess.Popen([*cmd, "--port", str(port), name, *flags])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not answer"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(20)


def drive(python: Path, url: str, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(python), str(DRIVE), url, json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records: list[dict[str, Any]] = json.loads(done.stdout)
    return records


def local_env(name: str, *flags: str) -> Any:
    cls = registry.get(name)
    resolved = parse(cls, "process", list(flags))
    env = cls(resolved.env, resolved.servers, manager=resolved.manager)
    asyncio.run(env.setup())
    return env


@pytest.mark.parametrize("name", ["gsm8k", "tool_calling"])
def test_official_client_plays_single_turn_envs_scored_by_the_env(name: str, interop_python: Path):
    env = local_env(name)
    items = env.items
    gold = [items[0].get("answer"), "no idea"] if name == "gsm8k" else [
        json.dumps(items[0].get("expected")), "no idea"
    ]  # fmt: skip
    replies = [str(g) for g in gold]
    plan = [{"seed": 0, "replies": [replies[0]]}, {"seed": 0, "replies": [replies[1]]}]
    with published(name) as url:
        records = drive(interop_python, url, plan)
    for record, reply in zip(records, replies, strict=True):
        assert record["prompt"] == env.prompt(items[0])[-1]["content"]
        [step] = record["steps"]
        assert step["done"] is True
        assert step["reward"] == pytest.approx(float(env.score(items[0], reply)))
        assert record["state"]["step_count"] == 1


def test_official_client_plays_textworld_turn_by_turn(interop_python: Path):
    pytest.importorskip("textworld")
    plan = [{"seed": 0, "replies": ["look", "inventory", "go north"]}]
    with published("textworld", "--env.max_turns", "3") as url:
        [record] = drive(interop_python, url, plan)
    assert record["prompt"] and len(record["steps"]) == 3
    assert [s["done"] for s in record["steps"]][-1] is True  # max_turns ends it
    assert all(0.0 <= s["reward"] <= 1.0 for s in record["steps"])
    assert record["state"]["step_count"] == 3


def test_published_server_keeps_the_http_rules_and_refuses_bad_actions(interop_python: Path):
    with published("gsm8k") as url:
        assert httpx.get(f"{url}/schema", headers={"Host": "evil.example"}).status_code == 403
        schema = httpx.get(f"{url}/schema").json()
        assert schema["action"]["required"] == ["message"]

        async def talk() -> list[dict[str, Any]]:
            from websockets.asyncio.client import connect

            answers = []
            async with connect(url.replace("http", "ws") + "/ws", proxy=None) as ws:
                for msg in ({"type": "step", "data": {"message": "1"}},
                            {"type": "step", "data": {"code": 1}}, "not json"):  # fmt: skip
                    await ws.send(msg if isinstance(msg, str) else json.dumps(msg))
                    answers.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            with pytest.raises(Exception, match="403|1008|rejected"):
                hostile = {"Origin": "https://evil.example"}
                async with connect(url.replace("http", "ws") + "/ws", proxy=None,
                                   additional_headers=hostile) as ws:  # fmt: skip
                    await asyncio.wait_for(ws.recv(), 30)
            return answers

        codes = [a["data"]["code"] for a in asyncio.run(talk())]
    assert codes == ["EXECUTION_ERROR", "VALIDATION_ERROR", "INVALID_JSON"]


def test_official_client_plays_mcp_tools_a_tool_call_at_a_time(interop_python: Path):
    pytest.importorskip("mcp")
    convert = {
        "name": "convert_units",
        "arguments": {"value": 42, "from_unit": "km", "to_unit": "mi"},
    }
    replies = [f"<tool_call>{json.dumps(convert)}</tool_call>", "<answer>26.1</answer>"]
    plan = [{"seed": 0, "replies": replies}, {"seed": 0, "replies": ["<answer>3</answer>"]}]
    with published("mcp_tools") as url:  # the env starts its fixture MCP server
        right, wrong = drive(interop_python, url, plan)
    assert "42 km" in right["prompt"]
    tool, answer = right["steps"]
    assert tool == {"reward": 0.0, "done": False, "prompt": "26.09759"}  # run by its server
    assert answer["reward"] == 1.0 and answer["done"] is True  # scored by the env
    assert wrong["steps"][0]["reward"] == 0.0 and wrong["steps"][0]["done"] is True
