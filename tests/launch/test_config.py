"""The run file: validation messages, --set overrides, and the plan it resolves into."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from atropos.launch import config, local
from atropos.launch.plan import build, fill, flags
from atropos.launch.show import describe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "launch"

MINIMAL = {
    "inference": [{"name": "policy", "type": "local", "model": "tiny"}],
    "envs": [{"name": "arithmetic"}],
    "trainer": {"model": "tiny"},
}


def problems(data: dict, *overrides: str) -> list[str]:
    with pytest.raises(config.LaunchConfigError) as err:
        config.parse(data, overrides, origin="run.yaml")
    return err.value.lines


def test_unknown_keys_name_the_path_and_the_nearest_key() -> None:
    data = {**MINIMAL, "run": {"backnd": "ray"}, "envs": [{"name": "x", "replica": 2}]}
    assert problems(data) == [
        "run.yaml: run.backnd: unknown key; did you mean backend?",
        "run.yaml: envs[0].replica: unknown key; did you mean replicas?",
    ]


def test_rules_are_named_with_the_value() -> None:
    data = {**MINIMAL, "envs": [{"name": "arithmetic", "replicas": 0}]}
    (line,) = problems(data)
    assert line.startswith("run.yaml: envs[0].replicas: Input should be greater than or equal to 1")
    assert "(got 0)" in line
    assert problems({"envs": [{"name": "a"}]}) == ["run.yaml: trainer: required"]


def test_cross_field_rules() -> None:
    url_without = {**MINIMAL, "inference": [{"type": "url"}]}
    assert problems(url_without) == [
        "run.yaml: inference[0]: type url needs url: the server's OpenAI base URL"
    ]
    both = {**MINIMAL, "trainer": {"model": "tiny", "command": "python t.py"}}
    assert "exactly one" in problems(both)[0]
    wrong_server = {**MINIMAL, "envs": [{"name": "a", "servers": ["polcy"]}]}
    assert "no inference server 'polcy'; did you mean policy?" in problems(wrong_server)[0]


def test_set_overrides_any_field() -> None:
    run = config.parse(
        MINIMAL,
        ["envs.0.replicas=3", "trainer.args.steps=7", "run.backend=ray", "api.args={a: 1}"],
    )
    assert run.envs[0].replicas == 3
    assert run.trainer.args == {"steps": 7}
    assert run.run.backend == "ray"
    assert run.api.args == {"a": 1}
    assert MINIMAL["envs"] == [{"name": "arithmetic"}]  # the caller's data is untouched
    assert "the list has 1 entries" in problems(MINIMAL, "envs.3.replicas=2")[0]
    assert "expected KEY.PATH=VALUE" in problems(MINIMAL, "envs")[0]


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(config.LaunchConfigError, match="cannot read it"):
        config.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(config.LaunchConfigError, match="not valid YAML at line 2"):
        config.load(bad)


def test_flags_spelling() -> None:
    assert flags({"max_staleness": 2, "insecure": True, "off": None}) == [
        "--max-staleness", "2", "--insecure",
    ]  # fmt: skip


def test_plan_wires_urls_and_start_order(tmp_path: Path) -> None:
    run = config.parse({**MINIMAL, "envs": [{"name": "arithmetic", "replicas": 2}]})
    plan = local.place(build(run, tmp_path))
    assert [[p.name for p in tier] for tier in plan.tiers()] == [
        ["api", "policy"], ["trainer", "arithmetic-0", "arithmetic-1"],
    ]  # fmt: skip
    book = local.book_of(plan)
    api_port, server_port = book["api"][1], book["policy"][1]
    env = plan.get("arithmetic-1")
    argv = [fill(a, env, book, python="py", run_dir=tmp_path) for a in env.argv]
    assert argv[argv.index("--env.rollout_server_url") + 1] == f"http://127.0.0.1:{api_port}"
    assert argv[argv.index("--env.env_key") + 1] == "atropos/arithmetic-1"
    servers = yaml.safe_load(
        fill(env.files["config/arithmetic-1.yaml"], env, book, python="py", run_dir=tmp_path)
    )["openai"]
    assert servers == [
        {
            "base_url": f"http://127.0.0.1:{server_port}/v1",
            "model_name": "atropos-tiny",
            "server_type": "vllm",
            "api_key": "none",
        }
    ]
    trainer = plan.get("trainer")
    targs = [fill(a, trainer, book, python="py", run_dir=tmp_path) for a in trainer.argv]
    assert targs[targs.index("--server-url") + 1] == f"http://127.0.0.1:{server_port}/v1"
    assert set(trainer.after) == {"api", "policy"}


@pytest.mark.parametrize("name", ["local", "gpu-vllm"])
def test_shipped_examples_dry_run(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    run = config.load(EXAMPLES / f"{name}.yaml")
    plan = local.place(build(run))
    text = describe(plan, local.book_of(plan), python="python")
    assert "step 2: start trainer, " in text
    if name == "gpu-vllm":
        assert [p.gpu_ids for p in plan.processes if p.gpus] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert text.count("vllm serve Qwen/Qwen3-4B") == 3
        assert (
            "--server-url http://127.0.0.1:" in text and text.count("/v1,http") == 4
        )  # --server-url and ATROPOS_SERVER_URLS
    assert os.fspath(plan.run_dir).endswith(run.run.name)


def test_too_many_gpus_for_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    plan = build(config.load(EXAMPLES / "gpu-vllm.yaml"))
    with pytest.raises(local.PlacementError, match="asks for 8 GPUs .* this machine has 1"):
        local.place(plan)
