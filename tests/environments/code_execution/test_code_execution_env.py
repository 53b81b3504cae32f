"""The `code_execution` environment against the fake inference server: the contract check, a
process run writing JSONL and HTML, truncation overrides, pass@k evaluation, registration."""

from __future__ import annotations

import asyncio
import collections

import pytest

from atropos.environments import code_execution
from atropos.environments.code_execution import (
    SYSTEM_PROMPT,
    CodeExecution,
    CodeExecutionConfig,
    right_answer,
    wrong_answer,
)
from atropos.environments.code_execution.problems import load_problems
from atropos.envs import registry
from atropos.rewards.passk import mean_pass_at_k
from atropos.testing import FakeInferenceServer

from ..helpers import check_against, env_defaults, evaluate_against, make_env, process_with_runner

FIXTURE = load_problems("train") + load_problems("test")


def make(url: str, mode: str = "process", **env: object) -> CodeExecution:
    """Groups of 4, two sandboxes at a time, 5 s a run, unless `env` says otherwise."""
    env = {"max_concurrency": 2, "timeout_seconds": 5.0, **env}
    return make_env(CodeExecution, url, mode, **env)


def problem_in(prompt: str) -> dict:
    [item] = [i for i in FIXTURE if i["prompt"].strip() in prompt]
    return item


class Responder:
    """Answers fixture problems: `right(item, turn)` says whether this call gets the reference
    solution (turns count per problem)."""

    def __init__(self, right=lambda item, turn: turn % 2 == 0) -> None:
        self.right = right
        self.turns: collections.Counter[str] = collections.Counter()

    def __call__(self, prompt: str) -> str:
        item = problem_in(prompt)
        turn = self.turns[item["task_id"]]
        self.turns[item["task_id"]] += 1
        return right_answer(item) if self.right(item, turn) else wrong_answer(item)


def test_prompt_shows_the_statement_the_starter_and_the_answer_format():
    env = make("http://127.0.0.1:9/v1")
    humaneval = next(i for i in FIXTURE if i["starter"])
    system, user = env.prompt(humaneval)
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert (
        humaneval["prompt"] in user["content"] and humaneval["starter"].strip() in user["content"]
    )
    assert user["content"].endswith("### Answer: (use the provided format with backticks)")
    stdio = next(i for i in FIXTURE if i["io"])
    assert "standard input" in env.prompt(stdio)[1]["content"]
    assert humaneval["solution"] not in user["content"]


def test_score_is_plus_one_only_when_every_test_passes():
    env = make("http://127.0.0.1:9/v1")
    item = FIXTURE[0]

    async def main() -> list[float]:
        answers = [right_answer(item), wrong_answer(item), "I don't know.", "```python\ndef (\n```"]
        scores = [await env.score(item, a) for a in answers]
        await env.aclose()
        return scores

    assert asyncio.run(main()) == [1.0, -1.0, -1.0, -1.0]


def test_check_env_passes_against_a_vllm_server():
    report = check_against(make, Responder(), items=2)
    assert report.groups == 2 and report.token_sources == {"server"}


def test_process_writes_jsonl_and_html(tmp_path):
    out = tmp_path / "code.jsonl"
    with FakeInferenceServer(responder=Responder()) as fake:
        env = make(fake.base_url, total_steps=3, data_path_to_save_groups=str(out))
        run = process_with_runner(env)
    assert len(run.groups) == 3
    for group in run.groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
        assert "overrides" not in group  # none cut: every row scored, no overrides
        assert group["messages"][0][0]["content"] == SYSTEM_PROMPT
        assert "```python" in group["messages"][0][-1]["content"]
    assert "```python" in run.page
    assert env.metrics["train/percent_correct"] == 0.5


def test_a_sandbox_failure_fails_the_rollout_and_is_counted_by_reason(tmp_path, monkeypatch):
    """No sandbox can start (the run root is a file): every rollout is failed, none scored."""
    from atropos.envs.config import ResolvedConfig
    from atropos.envs.runner.process import ProcessRunner

    blocker = tmp_path / "root"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ATROPOS_SANDBOX_ROOT", str(blocker))
    out = tmp_path / "code.jsonl"
    with FakeInferenceServer(responder=Responder()) as fake:
        env = make(fake.base_url, total_steps=2, data_path_to_save_groups=str(out))
        resolved = ResolvedConfig(env.config, env.server_configs, env.manager_config, "process")
        runner = ProcessRunner(env, resolved)
        asyncio.run(runner.run(show_progress=False))
    # per item under the same name as its rollouts' outcome (failed/sandbox_<reason>)
    assert runner.failures["sandbox_start_failed"] >= 1
    assert set(runner.failures) == {"sandbox_start_failed"}
    assert env.sandbox_failures["start_failed"] >= 1
    assert not out.exists() or out.read_text().strip() == ""


def test_a_truncated_completion_gets_its_advantage_zeroed():
    item = FIXTURE[0]

    def responder(prompt: str) -> str:
        responder.calls += 1  # type: ignore[attr-defined]
        if responder.calls % 2:  # type: ignore[attr-defined]
            return right_answer(item)
        return "Let me think about this. " * 200 + right_answer(item)  # cut before the code

    responder.calls = 0  # type: ignore[attr-defined]
    with FakeInferenceServer(responder=responder) as fake:
        env = make(fake.base_url, group_size=2, max_token_length=256)

        async def main():
            group, backlog = await env.collect_trajectories(item)
            await env.aclose()
            return group

        group = asyncio.run(main())
    pairs = sorted(zip(group["scores"], group["overrides"], strict=True), key=lambda p: p[0])
    cut = {"set_advantage_to_zero": True, "outcome": "truncated/tokens"}
    assert pairs == [(-1.0, cut), (1.0, {})]


def test_evaluate_reports_unbiased_pass_at_k(tmp_path):
    test_items = load_problems("test")
    always = {i["task_id"] for i in test_items[:2]}
    once = {i["task_id"] for i in test_items[2:4]}

    def right(item, turn):
        return item["task_id"] in always or (item["task_id"] in once and turn == 0)

    run = evaluate_against(make, Responder(right), tmp_path, eval_k=2)
    metrics = run.metrics
    counts = [(4, 4)] * 2 + [(4, 1)] * 2 + [(4, 0)] * 4
    assert metrics["eval/pass@1"] == pytest.approx(mean_pass_at_k(counts, 1)) == 0.3125
    assert metrics["eval/pass@2"] == pytest.approx(mean_pass_at_k(counts, 2)) == 0.375
    assert metrics["eval/overlong_ratio"] == 0.0
    assert run.doc["results"]["all"] == metrics
    samples = run.samples
    assert len(samples) == 32 and sum(s["passed"] for s in samples) == 10
    assert {s["status"] for s in samples if not s["passed"]} <= {"error", "wrong_output"}


def test_demo_responder_gives_mixed_answers_for_fixture_prompts():
    env = make("http://127.0.0.1:9/v1")
    item = load_problems("test")[5]
    prompt = env.prompt(item)[1]["content"]
    answers = [code_execution.demo_responder(prompt) or "" for _ in range(2)]

    async def main() -> list[float]:
        scores = [await env.score(item, a) for a in answers]
        await env.aclose()
        return scores

    assert sorted(asyncio.run(main())) == [-1.0, 1.0]
    assert code_execution.demo_responder("What is 2 + 2?") is None


def test_defaults_and_registration():
    config, [server] = env_defaults(CodeExecution)
    assert isinstance(config, CodeExecutionConfig) and config.dataset_name is None
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert config.eval_samples == 4 and config.sandbox_provider == "auto"
    assert config.sandbox_image is None
    assert "code_execution" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("code_execution") is CodeExecution


def test_hub_names_pick_the_evaluation_set(monkeypatch):
    seen = []

    def fake_load(split, name=None, config=None):
        seen.append((split, name, config))
        return FIXTURE[:3]

    monkeypatch.setattr(code_execution, "load_problems", fake_load)
    env = make("http://127.0.0.1:9/v1", dataset_name="mbpp", dataset_config="sanitized")
    env.load()
    env.load_eval()
    other = make("http://127.0.0.1:9/v1", dataset_name="mbpp", eval_dataset_name="openai_humaneval")
    assert len(other.load_eval()) == 3
    assert len(make("http://127.0.0.1:9/v1", eval_limit=2).load_eval()) == 2
    assert seen == [
        ("train", "mbpp", "sanitized"),
        ("test", "mbpp", "sanitized"),
        ("test", "openai_humaneval", None),
        ("test", None, None),
    ]
