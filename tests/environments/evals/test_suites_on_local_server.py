"""The table's suites end to end against the CPU server over the shipped tiny policy (the real
tokenizer and chat template): `evaluate` of a few problems each. The tiny policy only learned
arithmetic, so its answers are noise; what is checked is the plumbing, with the judged suites'
judge on a fake server of its own. (`tests/environments/test_on_local_server.py` runs the first
six evaluation environments the same way.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from atropos.environments.evals import ENVS  # noqa: E402
from atropos.envs.cli import main  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402

from .helpers import JUDGED  # noqa: E402

COVERED_THERE = {"eval_gsm8k", "eval_math500", "eval_aime", "eval_gpqa"}
NAMES = sorted(set(ENVS) - COVERED_THERE)


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    with local_tiny_server() as url:
        yield url


def judge_answer(prompt: str) -> str:
    return "Fine.\nRating: 7\n[[A=B]] \\boxed{B}"  # a verdict every judged suite can read


@pytest.mark.parametrize("name", NAMES)
def test_each_suite_evaluates_against_the_cpu_server(name: str, local_url: str, tmp_path: Path):
    out = tmp_path / name
    argv = ["evaluate", "--openai.base_url", local_url, "--openai.model_name", "atropos-tiny"]
    argv += ["--env.tokenizer_name", "tiny", "--env.use_wandb", "false"]
    argv += ["--env.data_dir_to_save_evals", str(out), "--env.max_eval_items", "2"]
    argv += ["--env.eval_n", "2", "--env.eval_k", "1,2", "--env.eval_max_tokens", "16"]
    with FakeInferenceServer(responder=judge_answer) as judge:
        if isinstance(ENVS[name].suite.format, JUDGED):
            argv += ["--judge.base_url", judge.base_url]
        assert main(ENVS[name], argv) == 0
        judged = judge.requests["/v1/chat/completions"]
    results = json.loads((out / "metrics.json").read_text())["results"]["all"]
    assert results["eval/num_problems"] == 2 and results["eval/num_samples"] == 4
    assert {"eval/pass@1", "eval/pass@2"} <= set(results)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(isinstance(s["completion"], str) for s in samples)
    if isinstance(ENVS[name].suite.format, JUDGED):  # noise with an unclosed think is not judged
        answered = sum(s["extracted"] is not None for s in samples)
        assert judged >= answered and results["eval/judge_unparsed"] == 0
