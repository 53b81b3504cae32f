"""`evaluate` end to end for every evaluation env, through the command line and a fake inference
server whose answers are right on a known pattern of problems; exact metrics and samples."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from atropos.cli.main import main as atropos_main
from atropos.environments.evals import (
    AIMEEval,
    GPQAEval,
    GSM8KEval,
    IFEvalEval,
    Math500Eval,
    MMLUEval,
)
from atropos.environments.evals.base import THINKING_PROMPT
from atropos.rewards.passk import pass_at_k
from atropos.testing import FakeInferenceServer

from ..helpers import EvalFiles, evaluate
from .helpers import finder, make, problems, run_eval

THINK = "<think>Let me work it out.</think> "


def by_id(samples: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for sample in samples:
        grouped[sample["id"]].append(sample)
    return grouped


# ----- one env at a time --------------------------------------------------------------------------


def test_gsm8k(tmp_path):
    found = problems(GSM8KEval)
    find = finder(found)

    def responder(text: str) -> str:
        i, p = find(text)
        if i % 3 == 0:  # two different boxed answers: wrong
            return THINK + f"Either \\boxed{{{p.gold}}} or \\boxed{{{int(p.gold) + 1}}}."
        return THINK + f"The answer is \\boxed{{{p.gold}}}."

    metrics, samples, general = run_eval(GSM8KEval, responder, tmp_path)
    assert metrics == {
        "eval/accuracy": 0.6,
        "eval/pass@1": 0.6,
        "eval/answered": 1.0,
        "eval/truncated": 0.0,
        "eval/num_problems": 10,
        "eval/num_samples": 10,
    }
    assert [s["correct"] for s in samples] == [i % 3 != 0 for i in range(10)]
    first = samples[0]
    assert {k: first[k] for k in ("id", "sample", "gold", "extracted", "correct")} == {
        "id": "gsm8k-0",
        "sample": 0,
        "gold": "7",
        "extracted": "7 | 8",
        "correct": False,
    }
    assert first["completion"].startswith(THINK) and first["finish_reason"] == "stop"
    assert samples[6]["gold"] == "5300"  # "#### 5,300": commas removed
    params = general["generation_parameters"]
    assert (params["temperature"], params["n"], params["k"], params["max_new_tokens"]) == (
        0.6,
        1,
        [1],
        2048,
    )
    assert general["model_name"] == "atropos-tiny"
    assert (tmp_path / "evaluate_config.yaml").exists()


def test_math500_breaks_accuracy_down_by_level_and_subject(tmp_path):
    find = finder(problems(Math500Eval))

    def responder(text: str) -> str:
        i, p = find(text)
        return THINK + (f"So it is \\boxed{{{p.gold}}}." if i % 2 == 0 else "I am not sure.")

    metrics, samples, _ = run_eval(Math500Eval, responder, tmp_path)
    assert metrics == {
        "eval/accuracy": 0.5,
        "eval/pass@1": 0.5,
        "eval/level/1/accuracy": 1.0,
        "eval/level/2/accuracy": 0.5,
        "eval/level/3/accuracy": 0.25,
        "eval/subject/algebra/accuracy": 0.5,
        "eval/subject/counting_probability/accuracy": 0.5,
        "eval/subject/geometry/accuracy": 1.0,
        "eval/subject/intermediate_algebra/accuracy": 0.0,
        "eval/subject/number_theory/accuracy": 0.5,
        "eval/subject/prealgebra/accuracy": 0.5,
        "eval/answered": 0.5,
        "eval/truncated": 0.0,
        "eval/num_problems": 10,
        "eval/num_samples": 10,
    }
    assert samples[2]["id"] == "fixture/prealgebra/1.json"
    assert (samples[2]["level"], samples[2]["subject"]) == ("1", "Prealgebra")
    assert (samples[2]["extracted"], samples[2]["correct"]) == ("\\frac{5}{6}", True)
    assert (samples[1]["extracted"], samples[1]["correct"]) == (None, False)


def test_aime(tmp_path):
    find = finder(problems(AIMEEval))

    def responder(text: str) -> str:
        i, p = find(text)
        return THINK + (f"\\boxed{{{p.gold:03d}}}" if i in (1, 4) else "\\boxed{999}")

    metrics, samples, _ = run_eval(AIMEEval, responder, tmp_path, "--env.eval_temperature", "1.0")
    assert (metrics["eval/accuracy"], metrics["eval/pass@1"]) == (pytest.approx(1 / 3),) * 2
    assert metrics["eval/num_problems"] == 6
    assert [(s["id"], s["gold"], s["extracted"], s["correct"]) for s in samples[:2]] == [
        ("aime-1", 16, "999", False),
        ("aime-2", 401, "401", True),
    ]


def test_mmlu_with_few_shot_examples(tmp_path):
    find = finder(problems(MMLUEval, few_shot=1))

    def responder(text: str) -> str:
        i, p = find(text)
        right = p.subsets["subject"] == "astronomy" or i % 4 == 0
        letter = p.gold if right else "ABCD"[("ABCD".index(p.gold) + 1) % 4]
        return THINK + f"The best answer is: {letter}"

    metrics, samples, _ = run_eval(MMLUEval, responder, tmp_path, "--env.few_shot", "1")
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == pytest.approx(5 / 12)
    assert metrics["eval/subject/astronomy/accuracy"] == 1.0
    assert metrics["eval/subject/high_school_biology/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/subject/elementary_mathematics/accuracy"] == pytest.approx(1 / 3)
    assert metrics["eval/subject/high_school_geography/accuracy"] == 0.0
    assert samples[3]["subject"] == "high_school_biology" and samples[3]["extracted"] == "D"
    assert samples[0]["prompt"].count("The best answer is:") == 2  # one solved example


def test_mmlu_subject_filter(tmp_path):
    find = finder(problems(MMLUEval))
    metrics, samples, _ = run_eval(
        MMLUEval,
        lambda text: f"The best answer is: {find(text)[1].gold}",
        tmp_path,
        "--env.subjects",
        "astronomy,high_school_geography",
    )
    assert metrics["eval/num_problems"] == 6 and metrics["eval/accuracy"] == 1.0
    assert {s["subject"] for s in samples} == {"astronomy", "high_school_geography"}


def test_gpqa(tmp_path):
    find = finder(problems(GPQAEval))

    def responder(text: str) -> str:
        _, p = find(text)
        domain, wrong = p.subsets["domain"], "ABCD"[("ABCD".index(p.gold) + 1) % 4]
        if domain == "Physics":
            return THINK + f"**Answer:** {p.gold}"
        if domain == "Chemistry":  # two different letters: wrong
            return THINK + f"The answer is {p.gold}. No, the answer is {wrong}."
        return THINK + f"The best answer is: {wrong}"

    metrics, samples, _ = run_eval(GPQAEval, responder, tmp_path)
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == 3 / 8
    assert metrics["eval/domain/physics/accuracy"] == 1.0
    assert metrics["eval/domain/chemistry/accuracy"] == 0.0
    assert metrics["eval/domain/biology/accuracy"] == 0.0
    assert samples[0]["id"] == "gpqa-fx-phys-1" and samples[0]["gold"] == "D"
    assert samples[3]["extracted"] == "D,A"  # chemistry: both letters, and wrong


IFEVAL_RESPONSES = {
    1001: "The sea is wide and blue\nIt sings all day",  # no comma: followed
    1002: "Sure:\ni love warm oatmeal with berries.",  # a preamble: loose only
    1003: '"A bottle that keeps water cold."',  # quoted, but under 40 words
    1004: "* Put the phone away.\n* Take short breaks.\n* Set one goal per session.",
    1005: "<<Growing Food Up High>>\nA balcony garden needs sun. Compost keeps it healthy.",
    1006: "Dear Sam,\nThe weekend was fun.",  # no postscript
    1007: "A RAINBOW IS SUNLIGHT SPLIT INTO COLOURS BY RAIN DROPS.",
    1008: "Bean There\n******\nDaily Grind",
    1009: '```json\n{"name": "Tom", "age": 3}\n```',
    1010: "You will do great. Good luck!",  # the end phrase is missing
}


def test_ifeval_strict_and_loose_accuracy(tmp_path):
    find = finder(problems(IFEvalEval))

    def responder(text: str) -> str:
        _, p = find(text)
        return THINK + IFEVAL_RESPONSES[int(p.id.removeprefix("ifeval-"))]

    metrics, samples, _ = run_eval(IFEvalEval, responder, tmp_path)
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == 0.6
    assert metrics["eval/prompt_level_strict_acc"] == 0.6
    assert metrics["eval/inst_level_strict_acc"] == pytest.approx(8 / 12)
    assert metrics["eval/prompt_level_loose_acc"] == 0.7
    assert metrics["eval/inst_level_loose_acc"] == pytest.approx(9 / 12)
    by_key = {s["id"]: s for s in samples}
    assert (by_key["ifeval-1002"]["strict"], by_key["ifeval-1002"]["loose"]) == ([False], [True])
    assert by_key["ifeval-1003"]["strict"] == [False, True]
    assert by_key["ifeval-1003"]["gold"] == [
        "length_constraints:number_words",
        "startend:quotation",
    ]
    assert by_key["ifeval-1005"]["correct"] is True


# ----- sampling: n > 1, bounded concurrency, flags ------------------------------------------------


def test_with_several_samples_pass_at_k_is_the_estimator_on_the_sampled_correctness(tmp_path):
    find = finder(problems(GSM8KEval))
    calls: collections.Counter[int] = collections.Counter()

    def responder(text: str) -> str:
        i, p = find(text)
        j = calls[i]
        calls[i] += 1
        right = j < i % 5  # problem i gets i % 5 right answers out of 4
        return THINK + f"\\boxed{{{p.gold if right else '123456'}}}"

    flags = ("--env.eval_n", "4", "--env.eval_k", "1,2,4")
    metrics, samples, general = run_eval(GSM8KEval, responder, tmp_path, *flags)
    assert all(calls[i] == 4 for i in range(10))
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == 0.5
    assert metrics["eval/pass@2"] == pytest.approx((0 + 0.5 + 5 / 6 + 1 + 1) / 5)
    assert metrics["eval/pass@4"] == pytest.approx(0.8)
    assert metrics["eval/num_samples"] == 40
    grouped = by_id(samples)
    assert [s["sample"] for s in grouped["gsm8k-3"]] == [0, 1, 2, 3]
    counts = [(len(rows), sum(s["correct"] for s in rows)) for rows in grouped.values()]
    assert [c for _, c in counts] == [i % 5 for i in range(10)]
    for k in (1, 2, 4):
        expected = sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
        assert metrics[f"eval/pass@{k}"] == pytest.approx(expected)
    assert (general["generation_parameters"]["n"], general["generation_parameters"]["k"]) == (
        4,
        [1, 2, 4],
    )


def test_at_most_max_eval_workers_requests_are_in_flight():
    find = finder(problems(GSM8KEval))

    def run(workers: int) -> int:
        state = {"now": 0, "peak": 0}

        async def responder(text: str) -> str:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            await asyncio.sleep(0.05)
            state["now"] -= 1
            return f"\\boxed{{{find(text)[1].gold}}}"

        with FakeInferenceServer(responder=responder) as fake:
            config, [server] = GSM8KEval.config_init()
            env = GSM8KEval(
                config.model_copy(update={"max_eval_workers": workers}),
                [server.model_copy(update={"base_url": fake.base_url})],
            )

            assert evaluate(env)["eval/accuracy"] == 1.0
        return state["peak"]

    assert run(2) == 2
    assert run(16) > 2


def test_thinking_mode_system_prompt_and_token_limit_reach_the_server(tmp_path):
    find = finder(problems(AIMEEval))
    seen: list[str] = []

    def responder(text: str) -> str:
        seen.append(text)
        thought = "a long line of thought " * 20
        return f"<think>{thought}</think> \\boxed{{{find(text)[1].gold}}}"

    flags = ("--env.thinking_mode", "true", "--env.custom_system_prompt", "Be brief.")
    metrics, samples, general = run_eval(
        AIMEEval, responder, tmp_path, *flags, "--env.eval_max_tokens", "8"
    )
    assert all(THINKING_PROMPT in text and "Be brief." in text for text in seen)
    assert AIMEEval.system_prompt not in seen[0]  # the custom prompt replaces the benchmark's
    assert metrics["eval/truncated"] == 1.0 and metrics["eval/accuracy"] == 0.0
    assert metrics["eval/answered"] == 0.0  # cut inside <think>: no answer
    assert {s["finish_reason"] for s in samples} == {"length"}
    params = general["generation_parameters"]
    assert (params["max_new_tokens"], params["thinking_mode"]) == (8, True)


def test_atropos_env_evaluate_runs_a_registered_eval(tmp_path):
    find = finder(problems(AIMEEval))
    with FakeInferenceServer(responder=lambda t: f"\\boxed{{{find(t)[1].gold}}}") as fake:
        argv = ["env", "evaluate", "eval_aime", "--openai.base_url", fake.base_url]
        argv += ["--env.data_dir_to_save_evals", str(tmp_path), "--env.max_eval_items", "2"]
        assert atropos_main(argv) == 0
    written = EvalFiles(tmp_path)
    assert written.doc["results"]["atropos|aime|0"]["eval/accuracy"] == 1.0
    assert written.doc["results"]["all"]["eval/num_problems"] == 2
    assert len(written.samples) == 2


def test_a_bad_eval_k_is_a_usage_error(tmp_path, capsys):
    from atropos.envs import cli

    argv = ["evaluate", "--openai.base_url", "http://127.0.0.1:9/v1", "--env.eval_k", "5"]
    assert cli.main(GSM8KEval, argv) == 2
    assert "eval_k" in capsys.readouterr().err


def test_evaluate_can_be_called_without_setup(tmp_path):
    with FakeInferenceServer(responder=lambda t: "\\boxed{0}") as fake:
        env = make(GSM8KEval, data_dir_to_save_evals=str(tmp_path), max_eval_items=2)
        env.server_configs[0].base_url = fake.base_url
        metrics = evaluate(env)
    assert (metrics["eval/num_problems"], metrics["eval/accuracy"]) == (2, 0.0)


def _judge_fails(problem_id: str) -> bool:
    return int(problem_id.rsplit("-", 1)[-1]) % 3 == 0  # gsm8k-0, gsm8k-3, ...


class _FlakyJudgeGSM8K(GSM8KEval):
    """GSM8K graded as if by a judge that cannot answer for every third problem."""

    async def grade_samples(self, problem: Any, samples: list[Any]) -> list[Any]:
        from atropos.envs.judge import JudgeFailed

        if _judge_fails(problem.id):
            raise JudgeFailed("timeout", "judge: no answer within 5 s")
        return await super().grade_samples(problem, samples)


def test_a_judge_that_cannot_answer_leaves_the_problem_out_counted(tmp_path):
    found = problems(GSM8KEval)
    find = finder(found)
    failing = {p.id for p in found if _judge_fails(p.id)}
    assert 0 < len(failing) < len(found)

    def responder(text: str) -> str:
        return THINK + f"The answer is \\boxed{{{find(text)[1].gold}}}."

    metrics, samples, _ = run_eval(_FlakyJudgeGSM8K, responder, tmp_path)
    assert metrics["eval/num_failed"] == len(failing)
    assert metrics["eval/failed/judge_timeout"] == len(failing)
    assert metrics["eval/num_problems"] == len(found) - len(failing)
    assert metrics["eval/accuracy"] == 1.0  # the ungraded ones are not counted wrong
    assert not {s["id"] for s in samples} & failing
