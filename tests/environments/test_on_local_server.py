"""Every built-in environment end to end against `atropos local serve` (the CPU server over the
shipped tiny policy): the real tokenizer, real token ids and logprobs. Training environments run
`process`; the evaluation-only ones run `evaluate`.

The tiny policy only learned arithmetic, so its answers elsewhere are noise; what is checked is
the plumbing: groups of the configured size written with the server's own token ids (or, for the
documented exceptions, the env's own tokens), and the HTML page beside them. Where an env's own
rules would drop every group of noise, the run gets settings that keep them (letter counting's
difficulty band), or, for math, whose rules drop all-wrong groups, the verdict alternates right
and wrong (math-verify itself is tested in test_math.py). Judged environments get a separate
judge (a fake server that always answers A), so judge and policy run on different servers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from atropos.envs import registry  # noqa: E402
from atropos.envs.cli import main  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402

JUDGED = {"rlaif", "npc_arena"}
SEED_ENVS = ["arithmetic", "gsm8k", "tool_calling", "dataset", "rlaif", "npc_arena"]
MORE_ENVS: dict[str, list[str]] = {  # env -> the flags its run needs beyond the common ones
    "math": ["--env.min_completion_tokens", "16"],  # the default 1024 skips every prompt here
    "mcqa": [],
    "fundamentals": [],
    "letter_counting": ["--env.difficulty_decrease_threshold", "-1"],  # keep all-wrong groups
    "text_reversal": [],
    "instruction_following": [],
    "blackjack": [],
    "blackjack_thinking": [],
    "taxi": [],
    "code_execution": [],
    "tool_use_multiturn": [],
    "visual_counting": [],
    "sft_loader": [],
    "deep_research": ["--env.max_turns", "2", "--env.max_reply_tokens", "16"],  # noise is long
    "mcp_tools": ["--env.max_gen_per_turn", "16", "--env.max_token_length", "2048"],  # tools
    "ocr_vqa": [],
    "clevr": [],
    "clock_reading": [],
    "pixmo_count": [],
}
VISION = {"visual_counting", "ocr_vqa", "clevr", "clock_reading", "pixmo_count"}
EVAL_ENVS = ["eval_gsm8k", "eval_math500", "eval_aime", "eval_mmlu", "eval_gpqa", "eval_ifeval"]
OWN_TOKENS = {  # envs whose groups are not the server's token ids, and why
    "visual_counting": "retokenized",  # images are not in the tiny model; trained on the text
    "ocr_vqa": "retokenized",
    "clevr": "retokenized",
    "clock_reading": "retokenized",
    "pixmo_count": "retokenized",
    "sft_loader": "retokenized",  # fixed conversations; the server is never asked
}


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    # the tiny model was trained on 128 positions; longer prompts run (RoPE), as noise
    with local_tiny_server() as url:
        yield url


def judge_answer(prompt: str) -> str:
    lines = "consistency: A\nlore accuracy: A\nengagingness: A\n"
    rubric = "Consistency: 5\nLore accuracy: 5\nEngagingness: 5\n"
    return lines + rubric + "\\boxed{A}"


def common_flags(local_url: str) -> list[str]:
    return [
        "--openai.base_url",
        local_url,
        "--openai.server_type",
        "vllm",
        "--openai.model_name",
        "atropos-tiny",
        "--env.tokenizer_name",
        "tiny",
        "--env.max_token_length",
        "1024",
        "--env.use_wandb",
        "false",
    ]


def process(name: str, local_url: str, out: Path, extra: list[str]) -> int:
    argv = ["process", *common_flags(local_url), "--env.total_steps", "2"]
    argv += ["--env.group_size", "2", "--env.data_path_to_save_groups", str(out), *extra]
    return main(registry.get(name), argv)


def read_groups(out: Path) -> list[dict[str, Any]]:
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    assert out.with_suffix(".html").exists()
    return groups


@pytest.mark.parametrize("name", SEED_ENVS)
def test_process_runs_against_the_cpu_server(name: str, local_url: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.jsonl"
    argv: list[str] = []
    with FakeInferenceServer(responder=judge_answer) as judge:
        if name in JUDGED:
            argv += ["--judge.base_url", judge.base_url]
        status = process(name, local_url, out, argv)
        judged = len(judge.requests)
    assert status == 0
    groups = read_groups(out)
    assert all(len(g["tokens"]) == 2 and g["token_source"] == "server" for g in groups)
    assert all(len(g["inference_logprobs"][0]) == len(g["tokens"][0]) for g in groups)
    if name in JUDGED:  # the judge's own server judged, unless truncation decided every pair
        by_length = all(sorted(g["scores"]) == [-1.0, 1.0] for g in groups)
        assert judged > 0 or by_length


def alternating_verdicts() -> Callable[[str, str], bool]:
    verdicts = itertools.cycle([True, False])
    return lambda gold, completion: next(verdicts)


@pytest.mark.parametrize("name", sorted(MORE_ENVS))
def test_every_other_env_processes_against_the_cpu_server(
    name: str, local_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "math":  # noise is never right, and math drops all-wrong groups
        monkeypatch.setattr("atropos.environments.math.env.verify", alternating_verdicts())
    out = tmp_path / f"{name}.jsonl"
    assert process(name, local_url, out, MORE_ENVS[name]) == 0
    groups = read_groups(out)
    source = OWN_TOKENS.get(name, "server")
    expected_size = 1 if name == "sft_loader" else 2  # one conversation per group
    for g in groups:
        assert len(g["tokens"]) == len(g["masks"]) == len(g["scores"]) == expected_size
        assert g["token_source"] == source
        if source == "server":
            assert [len(lp) for lp in g["inference_logprobs"]] == [len(t) for t in g["tokens"]]
    if name == "math":
        assert all(sorted(g["scores"]) == [-1.0, 1.0] for g in groups)
    if name == "blackjack_thinking":  # per-step advantages, one per token
        assert all(
            [len(a) for a in g["advantages"]] == [len(t) for t in g["tokens"]] for g in groups
        )
    if name in VISION:  # the picture travels with the group, as base64 PNG
        assert all(img.startswith("iVBORw0KGgo") for g in groups for img in g["images"])
    if name == "sft_loader":
        assert all(o == {"sft": True} for g in groups for o in g["overrides"])


@pytest.mark.parametrize("name", EVAL_ENVS)
def test_every_eval_env_evaluates_against_the_cpu_server(
    name: str, local_url: str, tmp_path: Path
) -> None:
    out = tmp_path / name
    argv = ["evaluate", *common_flags(local_url), "--env.data_dir_to_save_evals", str(out)]
    argv += ["--env.max_eval_items", "3", "--env.eval_n", "2", "--env.eval_k", "1,2"]
    argv += ["--env.eval_max_tokens", "32"]
    assert main(registry.get(name), argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    (task, results), *_ = ((k, v) for k, v in metrics["results"].items() if k != "all")
    assert results["eval/num_problems"] == 3 and results["eval/num_samples"] == 6
    assert {"eval/pass@1", "eval/pass@2"} <= set(results)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and all(isinstance(s["completion"], str) for s in samples)
    assert metrics["config_general"]["model_name"] == "atropos-tiny"
