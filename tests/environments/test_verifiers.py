"""verifiers environments through `atropos env process|evaluate verifiers:NAME`.

verifiers 0.4 cannot share our venv (it pins openai < 3, the `agents` extra needs 3), so the
runs use its own (`scripts/upstream_venv.py verifiers`: this project, editable, with the
`verifiers` extra and `uv`, from `requirements/verifiers.txt`), made once and reused. Two
tasksets written for these tests (`verifiers_tasksets/`): `vf_sums`, single-turn with two
weighted reward functions and a metric, and `vf_moons`, multi-turn with a tool served by a
verifiers toolset (an MCP server per rollout). The policy is the fake server with a scripted
responder (`verifiers_tasksets/responder.py`). Each row's score must equal what verifiers' own
rubric gives for the same conversation (`verifiers_tasksets/rescore.py`, in that venv).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.envs import registry
from atropos.install import install_hint
from atropos.testing import FakeInferenceServer, load_script

ROOT = Path(__file__).resolve().parents[2]
TASKSETS = Path(__file__).resolve().parent / "verifiers_tasksets"
VENV_SCRIPT = ROOT / "scripts" / "upstream_venv.py"
# the first test makes the venv (its fixture allows 25 minutes; ~3 on a quiet machine, past
# the suite's 300 s per test on a busy one)
pytestmark = pytest.mark.timeout(1800)
UV_CUTOFF = "2026-11-26T00:00:00Z"  # the harness programs' own dependencies, resolved as of


@pytest.fixture(scope="module")
def venv_bin() -> Path:
    """The verifiers venv's bin folder (made on first use: about 3 minutes)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(VENV_SCRIPT), "verifiers"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        timeout=1500,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, "could not make the verifiers venv (see stderr)"
    print(f"[verifiers] venv ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return Path(lines[-1]).parent


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    module = load_script(TASKSETS / "responder.py", "vf_responder")
    with FakeInferenceServer(responder=module.respond) as server:
        yield server


def run_in_venv(bin_dir: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a program of the verifiers venv with the test tasksets importable, its bin folder
    first on PATH (verifiers finds `uv` there) and the harness programs' dependencies pinned by
    date (`UV_EXCLUDE_NEWER`); 10 minutes at most."""
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(TASKSETS),
        "UV_EXCLUDE_NEWER": UV_CUTOFF,
    }
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def process(
    bin_dir: Path, fake: FakeInferenceServer, taskset: str, out: Path, *flags: str
) -> list[dict[str, Any]]:
    """`atropos env process verifiers:TASKSET` against the fake server; the groups written."""
    groups = out / f"{taskset}.jsonl"
    done = run_in_venv(
        bin_dir,
        [
            str(bin_dir / "atropos"), "env", "process", f"verifiers:{taskset}",
            "--openai.base_url", fake.base_url,
            "--env.data_path_to_save_groups", str(groups),
            *flags,
        ],
        out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in groups.read_text().splitlines()]


def rescored(bin_dir: Path, taskset: str, groups: Path) -> list[list[float]]:
    """verifiers' own rubric on each row's conversation (`rescore.py`, in the verifiers venv)."""
    done = run_in_venv(
        bin_dir, [str(bin_dir / "python"), str(TASKSETS / "rescore.py"), taskset, str(groups)],
        groups.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def trained_spans(masks: list[int]) -> int:
    """How many separate stretches of trained (unmasked) tokens a row has."""
    return sum(1 for i, m in enumerate(masks) if m != -100 and (i == 0 or masks[i - 1] == -100))


def check_token_fidelity(group: dict[str, Any]) -> None:
    """Server tokens with their logprobs; prompt and tool tokens masked with logprob 1.0."""
    assert group["token_source"] == "server"
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        for token, mask, logprob in zip(tokens, masks, logprobs, strict=True):
            assert mask in (-100, token)
            assert (logprob == 1.0) if mask == -100 else (logprob <= 0.0)


def test_a_single_turn_taskset_scores_as_its_own_rubric(venv_bin, fake, tmp_path):
    groups = process(
        venv_bin, fake, "vf_sums", tmp_path, "--env.total_steps", "3", "--env.group_size", "4"
    )
    assert len(groups) == 3 and all(len(g["tokens"]) == 4 for g in groups)
    for group in groups:
        check_token_fidelity(group)
        assert all(trained_spans(m) == 1 for m in group["masks"])
    scores = [g["scores"] for g in groups]
    assert rescored(venv_bin, "vf_sums", tmp_path / "vf_sums.jsonl") == scores
    # the responder is right on every other call: correct (1.0) + formatted (0.25 x 1.0)
    assert sorted({s for row in scores for s in row}) == [0.25, 1.25]
    lines = (tmp_path / "vf_sums.metrics.jsonl").read_text().splitlines()
    [metrics] = [m for m in map(json.loads, lines) if "verifiers/reward/correct" in m]
    assert metrics["verifiers/reward/correct"] == pytest.approx(0.5)
    assert metrics["verifiers/reward/formatted"] == 1.0
    assert metrics["verifiers/metric/reply_chars"] > 0


def test_a_multi_turn_taskset_with_a_tool_is_one_sequence_per_rollout(venv_bin, fake, tmp_path):
    groups = process(
        venv_bin, fake, "vf_moons", tmp_path, "--env.total_steps", "2", "--env.group_size", "3"
    )
    assert len(groups) == 2
    for group in groups:
        check_token_fidelity(group)
        assert len(group["tokens"]) == 3 and "group_overrides" not in group
        for messages, masks in zip(group["messages"], group["masks"], strict=True):
            roles = [m["role"] for m in messages]
            assert roles == ["user", "assistant", "tool", "assistant"]
            assert messages[1]["content"].startswith("<tool_call>")
            assert trained_spans(masks) == 2  # the call and the answer; the result is masked
    scores = [g["scores"] for g in groups]
    assert rescored(venv_bin, "vf_moons", tmp_path / "vf_moons.jsonl") == scores
    assert {s for row in scores for s in row} <= {0.5, 1.5}  # used the tool; right or not
    assert any(s == 1.5 for row in scores for s in row)


def test_evaluate_reports_each_reward_function(venv_bin, fake, tmp_path):
    done = run_in_venv(
        venv_bin,
        [
            str(venv_bin / "atropos"), "env", "evaluate", "verifiers:vf_sums",
            "--openai.base_url", fake.base_url, "--env.eval_size", "4",
            "--env.taskset_args", '{"offset": 100}',
            "--env.data_dir_to_save_evals", str(tmp_path / "eval"),
        ],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/mean_score"] == pytest.approx(0.75)
    assert metrics["eval/reward/correct"] == pytest.approx(0.5)
    assert metrics["eval/failed_runs"] == 0.0
    samples = (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()
    assert [json.loads(s)["task"]["name"] for s in samples] == ["102+3", "104+4", "110+7", "101+8"]


def test_an_unknown_taskset_is_one_line_and_exit_2(venv_bin, fake, tmp_path):
    done = run_in_venv(
        venv_bin,
        [str(venv_bin / "atropos"), "env", "process", "verifiers:vf_sumz",
         "--openai.base_url", fake.base_url, "--env.total_steps", "1"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "verifiers taskset 'vf_sumz': taskset 'vf_sumz' not found" in done.stderr


def test_in_our_venv_the_missing_extra_is_named():
    assert importlib.util.find_spec("verifiers") is None  # it lives in its own venv
    env_cls = registry.get("verifiers:anything")
    assert env_cls.name == "verifiers:anything"
    assert registry.missing_extras(env_cls, "verifiers:anything") == (
        f"verifiers:anything needs verifiers: {install_hint('verifiers')}"
    )


def test_family_names_need_a_family_that_takes_them():
    with pytest.raises(registry.EnvNotFound, match="'gsm8k' takes no name after ':'"):
        registry.get("gsm8k:main")
    with pytest.raises(registry.EnvNotFound, match="name a taskset"):
        registry.get("verifiers:")
