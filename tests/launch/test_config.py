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


def test_eval_every_is_passed_to_the_env(tmp_path: Path) -> None:
    run = config.parse({**MINIMAL, "envs": [{"name": "arithmetic", "eval_every": 5}]})
    env = local.place(build(run, tmp_path)).get("arithmetic")
    assert env.argv[env.argv.index("--env.eval_every") + 1] == "5"
    plain = local.place(build(config.parse(MINIMAL), tmp_path)).get("arithmetic")
    assert "--env.eval_every" not in plain.argv
    assert any("eval_every" in line for line in problems({**MINIMAL, "envs": [
        {"name": "arithmetic", "eval_every": 0}]}))  # fmt: skip


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
        assert text.count("-m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-4B") == 3
        assert text.count("VLLM_SERVER_DEV_MODE=1") == 3
        assert (
            "--server-url http://127.0.0.1:" in text and text.count("/v1,http") == 4
        )  # --server-url and ATROPOS_SERVER_URLS
    assert os.fspath(plan.run_dir).endswith(run.run.name)


def test_too_many_gpus_for_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    plan = build(config.load(EXAMPLES / "gpu-vllm.yaml"))
    with pytest.raises(local.PlacementError, match="asks for 8 GPUs .* this machine has 1"):
        local.place(plan)


VLLM = {"name": "vllm", "type": "vllm", "model": "Qwen/Qwen3-4B"}


def test_vllm_runs_as_a_module_in_dev_mode_with_its_own_python(tmp_path: Path) -> None:
    venv = tmp_path / "vllm-venv" / "bin" / "python"
    venv.parent.mkdir(parents=True)
    venv.write_text("#!/bin/sh\n")
    venv.chmod(0o755)
    servers = [
        {**VLLM, "python": str(venv), "environ": {"OMP_NUM_THREADS": "1"}},
        {**VLLM, "name": "plain", "environ": {"VLLM_SERVER_DEV_MODE": "0"}},
    ]
    plan = local.place(build(config.parse({**MINIMAL, "inference": servers}), tmp_path))
    book = local.book_of(plan)

    def argv(name: str) -> list[str]:
        proc = plan.get(name)
        return [fill(a, proc, book, python="/our/python", run_dir=tmp_path) for a in proc.argv]

    port = book["vllm"][1]
    assert argv("vllm") == [
        str(venv), "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-4B",
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "Qwen/Qwen3-4B",
        "--tensor-parallel-size", "1",
    ]  # fmt: skip
    assert plan.get("vllm").environ == {"VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"}
    assert plan.get("plain").environ == {"VLLM_SERVER_DEV_MODE": "0"}  # the user's wins
    assert argv("plain")[0] == "/our/python"  # no python: of its own
    for other in ("api", "trainer", "arithmetic"):
        assert argv(other)[0] == "/our/python"  # python: is that server's only
    shown = describe(plan, book, python="/our/python")
    assert f"{venv} -m vllm.entrypoints.openai.api_server" in shown


def test_a_servers_python_must_exist_here_on_the_local_backend(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "python"
    run = config.parse({**MINIMAL, "inference": [{**VLLM, "python": str(missing)}]})
    with pytest.raises(local.PlacementError) as err:
        local.place(build(run, tmp_path))
    assert str(err.value).startswith(f"vllm: python: no Python at {missing} (")
    assert local.place(build(run, tmp_path), strict=False).get("vllm").python == str(missing)
    url = {**MINIMAL, "inference": [{"type": "url", "url": "http://h/v1", "python": "py"}]}
    assert problems(url) == [
        "run.yaml: inference[0]: python is for a server launch starts; a url server is running"
    ]
