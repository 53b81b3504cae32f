"""OpenEnv in: environments written with openenv-core's own server classes (served from the
interop venv by `openenv:package.module:Class`) played by `atropos env process` against the
fake inference server; remote failures fail the group, never score it."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from atropos.cli.main import main
from atropos.inference.tokenizer import load_tokenizer
from atropos.interop.openenv.env import OpenEnv
from atropos.interop.openenv.wire import OpenEnvError, Session
from atropos.testing import FakeInferenceServer

ARITH = "openenv:tests.interop.openenv_envs.arith:ArithEnv"
TOOLS = "openenv:tests.interop.openenv_envs.tools:ToolsEnv"


def arith_responder(prompt: str) -> str:
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", prompt)[-1])
    return str(a + b)


def tools_responder(prompt: str) -> str:
    a, b, c = map(int, re.findall(r"Compute \((\d+) \+ (\d+)\) \* (\d+)", prompt)[-1])
    if '"name": "multiply", "arguments"' in prompt:
        call = {"name": "submit", "arguments": {"answer": (a + b) * c}}
    elif '"name": "add", "arguments"' in prompt:
        call = {"name": "multiply", "arguments": {"a": a + b, "b": c}}
    else:
        call = {"name": "add", "arguments": {"a": a, "b": b}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def process(spec: str, responder: Any, out: Path, *flags: str) -> int:
    with FakeInferenceServer(responder=responder) as fake:
        return main(
            [
                "env", "process", spec,
                "--openai.base_url", fake.base_url,
                "--openai.server_type", "vllm",
                "--env.total_steps", "2",
                "--env.group_size", "2",
                "--env.python", str(Path(".cache/interop-venv/bin/python").absolute()),
                "--env.data_path_to_save_groups", str(out),
                *flags,
            ]
        )  # fmt: skip


def groups(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_single_turn_env_scores_the_step_reward_and_masks_the_observation(
    tmp_path: Path, interop_python: Path
):
    out = tmp_path / "g.jsonl"
    assert process(ARITH, arith_responder, out) == 0
    tok = load_tokenizer("tiny")
    found = groups(out)
    assert len(found) == 2 and {s for g in found for s in g["scores"]} == {1.0}
    for group in found:
        rows = zip(group["tokens"], group["masks"], group["messages"], strict=True)
        for tokens, masks, messages in rows:
            trained = tok.decode([t for t, m in zip(tokens, masks, strict=True) if m != -100])
            assert re.fullmatch(r"\d+\s*(<\|im_end\|>)?\s*", trained)  # the reply alone
            assert "What is" in tok.decode(tokens)  # the observation is in, masked
            assert [m.get("reward") for m in messages] == [None, 1.0]


def test_multi_tool_env_steps_each_call_and_scores_the_return(tmp_path: Path, interop_python: Path):
    out = tmp_path / "g.jsonl"
    assert process(TOOLS, tools_responder, out, "--env.max_turns", "4") == 0
    for group in groups(out):
        assert group["scores"] == [pytest.approx(1.2)] * 2  # 0.1 + 0.1 + 1.0
        for messages in group["messages"]:
            roles = [m["role"] for m in messages]
            assert roles == ["system", "user", "assistant", "tool"] * 1 + [
                "assistant",
                "tool",
                "assistant",
            ]
            assert [m["reward"] for m in messages if m["role"] == "assistant"] == [
                pytest.approx(0.1), pytest.approx(0.1), 1.0
            ]  # fmt: skip
            assert messages[3]["content"] == str(int(messages[3]["content"]))


def test_evaluate_reports_the_names_ors_reports(tmp_path: Path, interop_python: Path):
    with FakeInferenceServer(responder=tools_responder) as fake:
        argv = ["env", "evaluate", TOOLS, "--openai.base_url", fake.base_url]
        argv += ["--openai.server_type", "vllm", "--env.eval_episodes", "2", "--env.max_turns", "4"]
        argv += ["--env.python", str(Path(".cache/interop-venv/bin/python").absolute())]
        assert main([*argv, f"--env.data_dir_to_save_evals={tmp_path}"]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/avg_score": pytest.approx(1.2), "eval/finished": 1.0}
    samples = [json.loads(s) for s in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["seed"] for s in samples) == [1_000_000, 1_000_001]


def test_a_remote_failure_fails_the_group_and_an_unreachable_server_is_named(
    tmp_path: Path, interop_python: Path
):
    out = tmp_path / "g.jsonl"
    assert process(ARITH, lambda prompt: "boom", out) != 0  # every group failed
    assert not out.exists() or not out.read_text().strip()

    async def unreachable() -> str:
        with pytest.raises(OpenEnvError) as err:
            async with Session("http://127.0.0.1:9", timeout=2.0, connect_timeout=2.0):
                pass
        return err.value.failure_kind

    assert asyncio.run(unreachable()) == "openenv_unreachable"
    assert OpenEnv.named("http://127.0.0.1:9").config_defaults["target"] == "http://127.0.0.1:9"


def test_process_against_the_local_cpu_server(tmp_path: Path, interop_python: Path):
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    out = tmp_path / "g.jsonl"
    with local_tiny_server() as url:
        argv = ["env", "process", TOOLS, "--openai.base_url", url]
        argv += ["--openai.server_type", "vllm", "--openai.model_name", "atropos-tiny"]
        argv += ["--env.python", str(interop_python), "--env.total_steps", "1"]
        argv += ["--env.group_size", "2", "--env.max_turns", "2", "--env.reply_tokens", "24"]
        argv += ["--env.ensure_scores_are_not_same", "false"]  # the tiny policy's noise
        argv += ["--env.data_path_to_save_groups", str(out)]
        assert main(argv) == 0
    [group] = groups(out)
    assert group["token_source"] == "server" and len(group["tokens"]) == 2
    assert [len(lp) for lp in group["inference_logprobs"]] == [len(t) for t in group["tokens"]]
