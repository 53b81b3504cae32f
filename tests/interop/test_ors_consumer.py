"""ORS in: `atropos env process|evaluate ors:URL#ENV` drives environments written with
openreward's own `Environment` and `Server` (tests/interop/ors_envs, served by the interop
venv): a single-turn one and a multi-tool one, against the fake inference server (a scripted
policy) and against `atropos local serve tiny`. Checked: the rewards ORS gives (inline and at
`finished`) as scores and per-step `reward`s, token fidelity, failures of the remote environment
counted as failed, never scored, and a remote environment registered under a name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from atropos.cli.main import main as atropos_main
from atropos.envs import registry
from atropos.testing import FakeInferenceServer

from .ors_helpers import ors_env


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def counter_policy(prompt: str) -> str:
    """Add the target in one call, then submit the total the tool reported."""
    totals = re.findall(r"total=(\d+)", prompt)
    if totals:
        return call("submit", total=int(totals[-1]))
    return call("add", value=int(re.findall(r"Reach (\d+)", prompt)[-1]))


def sums_policy(prompt: str) -> str:
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
    return call("answer", answer=str(int(a) + int(b)))


def process(spec: str, base_url: str, out: Path, *extra: str, steps: int = 2) -> int:
    argv = ["env", "process", spec, f"--openai.base_url={base_url}"]
    argv += ["--openai.server_type=vllm", f"--env.total_steps={steps}", "--env.group_size=2"]
    argv += [f"--env.data_path_to_save_groups={out}", "--env.use_wandb=false", *extra]
    return atropos_main(argv)


def groups(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(scope="module")
def counter(interop_python: Path) -> Any:
    with ors_env(interop_python, "multi_tool") as url:
        yield url


@pytest.fixture(scope="module")
def sums(interop_python: Path) -> Any:
    with ors_env(interop_python, "single_turn") as url:
        yield url


def test_a_multi_tool_environment_inline_and_final_rewards(counter: str, tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=counter_policy) as fake:
        assert process(f"ors:{counter}#counter", fake.base_url, out) == 0
    found = groups(out)
    assert len(found) == 2
    for group in found:
        assert group["scores"] == [pytest.approx(1.1)] * 2  # 0.1 inline for add, 1.0 at submit
        assert group["token_source"] == "server"
        assert len(group["inference_logprobs"][0]) == len(group["tokens"][0])
        tool_turns = [m for m in group["messages"][0] if m["role"] == "tool"]
        assert [t["reward"] for t in tool_turns] == [0.1, 1.0]  # per-step rewards kept
        trained = [m for m in group["masks"][0] if m != -100]
        assert len(trained) > 0 and len(trained) < len(group["masks"][0])  # observations masked


def test_a_single_turn_environment_without_env_name(sums: str, tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=sums_policy) as fake:
        assert process(f"ors:{sums}", fake.base_url, out) == 0  # its only environment
    assert [g["scores"] for g in groups(out)] == [[1.0, 1.0]] * 2


def test_evaluate_plays_the_test_split(sums: str, tmp_path: Path) -> None:
    with FakeInferenceServer(responder=sums_policy) as fake:
        argv = ["env", "evaluate", f"ors:{sums}#sums", f"--openai.base_url={fake.base_url}"]
        argv += ["--openai.server_type=vllm", f"--env.data_dir_to_save_evals={tmp_path}"]
        assert atropos_main([*argv, "--env.use_wandb=false"]) == 0
    samples = [json.loads(s) for s in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["index"] for s in samples) == [0, 1]  # the test split's two tasks
    assert all(s["score"] == 1.0 for s in samples)
    metrics = json.loads((tmp_path / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/avg_score": 1.0, "eval/finished": 1.0}  # the names OpenEnv's has


def test_a_tool_that_raises_fails_the_group_never_scores_it(counter: str, tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=lambda prompt: call("fail")) as fake:
        status = process(f"ors:{counter}#counter", fake.base_url, out, steps=1)
    assert status == 1 and not out.exists()  # no group written: the run stops, failing
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert json.dumps(metrics).count('"failed/ors_tool_error"') >= 1


def test_an_unreachable_server_is_one_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from atropos.net import free_port

    with FakeInferenceServer(responder=sums_policy) as fake:
        status = process(f"ors:http://127.0.0.1:{free_port()}", fake.base_url, tmp_path / "x.jsonl")
    assert status != 0
    assert "ors_unreachable" in capsys.readouterr().err


def test_unknown_env_names_the_ones_served(
    counter: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with FakeInferenceServer(responder=counter_policy) as fake:
        status = process(f"ors:{counter}#nope", fake.base_url, tmp_path / "x.jsonl")
    assert status != 0
    assert f"ors:{counter}#counter" in capsys.readouterr().err


def test_a_malformed_spec_is_one_clear_error() -> None:
    with pytest.raises(registry.EnvNotFound, match="ors:URL or ors:URL#ENV"):
        registry.get("ors:localhost:8000")


def test_against_the_local_cpu_server(counter: str, tmp_path: Path) -> None:
    """`atropos local serve tiny` as the policy: its replies are noise, so what is checked is
    the mechanism (groups written, token-exact with the server's ids and logprobs)."""
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    out = tmp_path / "groups.jsonl"
    with local_tiny_server() as url:
        extra = ["--openai.model_name=atropos-tiny", "--env.tokenizer_name=tiny"]
        extra += ["--env.max_token_length=1024", "--env.max_gen_per_turn=32"]
        extra += ["--env.ensure_scores_are_not_same=false", "--env.max_turns=2"]
        assert process(f"ors:{counter}#counter", url, out, *extra, steps=1) == 0
    (group,) = groups(out)
    assert group["token_source"] == "server" and len(group["tokens"]) == 2
    pairs = zip(group["inference_logprobs"], group["tokens"], strict=True)
    assert all(len(lp) == len(t) for lp, t in pairs)


def test_a_registered_remote_environment_is_listed_with_its_protocol_and_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry.register("remote-counter", "ors:http://127.0.0.1:9#counter")
    try:
        spec = registry.specs()["remote-counter"]
        assert (spec.source, spec.origin) == ("ors", "http://127.0.0.1:9")
        assert atropos_main(["env", "list"]) == 0  # described without asking the server
        (row,) = [r for r in capsys.readouterr().out.splitlines() if "remote-counter" in r]
        assert row.split()[1:3] == ["ors", "http://127.0.0.1:9"]
        assert registry.get("remote-counter").url == "http://127.0.0.1:9"
    finally:
        registry._registered.pop("remote-counter")
