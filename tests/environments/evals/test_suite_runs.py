"""`atropos env evaluate NAME` for every suite, offline, against a fake inference server whose
answers are right on a known pattern of problems; the judged suites with the fake server as
their judge (the policy's server, or one of its own with `--judge.base_url`)."""

from __future__ import annotations

import collections
import re

import pytest

from atropos.environments.evals import ENVS, ArenaHardEval, MTBenchEval, SimpleQAEval
from atropos.environments.evals.base import subset_key
from atropos.environments.evals.judged import ARENA_JUDGE, MT_BENCH_JUDGE, SIMPLEQA_JUDGE
from atropos.testing import FakeInferenceServer

from .helpers import GRADED, answer, finder, make, run_named

THINK = "<think>Let me work it out.</think> "


@pytest.mark.parametrize("name", GRADED)
def test_each_graded_suite_runs_offline_with_atropos_env_evaluate(name, tmp_path):
    env = make(ENVS[name])
    found = env.load_problems()
    find = finder(found)

    def responder(text: str) -> str:
        i, problem = find(text)
        return THINK + (answer(env, problem) if i % 2 == 0 else answer(env, problem, right=False))

    metrics, samples = run_named(name, responder, tmp_path)
    right = (len(found) + 1) // 2
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == pytest.approx(right / len(found))
    assert metrics["eval/num_problems"] == metrics["eval/num_samples"] == len(found)
    assert metrics["eval/answered"] == 1.0 and metrics["eval/truncated"] == 0.0
    assert [s["correct"] for s in samples] == [i % 2 == 0 for i in range(len(found))]
    assert [s["id"] for s in samples] == [p.id for p in found]
    group = ENVS[name].suite.part_group
    labels = {s[group] for s in samples if group in s}
    assert bool(labels) is (len(ENVS[name].suite.parts) > 1)  # several parts: accuracy per part
    assert all(f"eval/{group}/{subset_key(label)}/accuracy" in metrics for label in labels)


def test_drop_logs_exact_match_and_f1(tmp_path):
    env = make(ENVS["eval_drop"])
    find = finder(env.load_problems())
    answers = ["Answer: 2", "Answer: Dunn", "Answer: 14", "Answer: May 1821", "Answer: the mill"]
    metrics, samples = run_named("eval_drop", lambda t: answers[find(t)[0]], tmp_path)
    assert [s["em"] for s in samples] == [1.0, 1.0, 0.0, 1.0, 0.0]  # "Dunn": a validated answer
    assert samples[4]["f1"] == pytest.approx(1 / 3)  # 2/3 of "textile mill", over two gold spans
    assert metrics["eval/em"] == metrics["eval/accuracy"] == pytest.approx(3 / 5)
    assert metrics["eval/f1"] == pytest.approx((3 + 1 / 3) / 5)


def test_subsets_flag_on_the_command_line(tmp_path):
    env = make(ENVS["eval_arc"])
    find = finder(env.load_problems())
    metrics, samples = run_named(
        "eval_arc",
        lambda t: answer(env, find(t)[1]),
        tmp_path,
        "--env.subsets",
        "ARC-Challenge",
    )
    assert (
        metrics["eval/num_problems"] == 3 and metrics["eval/subset/arc_challenge/accuracy"] == 1.0
    )
    assert {s["subset"] for s in samples} == {"ARC-Challenge"}


# ----- judged suites ---------------------------------------------------------------------------


def line_after(label: str, text: str) -> str:
    found = re.search(rf"{re.escape(label)}\s*(.*)", text)
    assert found, f"no {label!r} in {text[-300:]!r}"
    return found.group(1).split("<|")[0].strip()  # the chat template's end-of-turn mark cut


def test_simpleqa_with_a_judge_on_its_own_server(tmp_path):
    find = finder(make(SimpleQAEval).load_problems())
    answers = ["It is the Wren.", "Eight.", "I don't know.", "Na", "<think>counting legs"]
    judged: list[str] = []

    def judge(text: str) -> str:
        assert SIMPLEQA_JUDGE[:60] in text
        answer = line_after("Answer:", text.split("Reference answer:")[1])
        judged.append(answer)
        if "Wren" in answer:
            return "It names the same river. \\boxed{A}"
        if "know" in answer:
            return "The answer declines. \\boxed{C}"
        if answer.startswith("Na"):
            return "It matches the reference."  # no boxed grade: unparsed
        return "It contradicts the reference. \\boxed{B}"

    def policy(text: str) -> str:
        assert SIMPLEQA_JUDGE[:60] not in text, "the judge has a server of its own"
        return answers[find(text)[0]]

    with FakeInferenceServer(responder=judge) as judge_server:
        flags = ("--judge.base_url", judge_server.base_url, "--judge.model_name", "judge")
        metrics, samples = run_named("eval_simpleqa", policy, tmp_path, *flags)
    assert sorted(judged) == ["Eight.", "I don't know.", "It is the Wren.", "Na"]  # not the 5th
    grades = [s["grade"] for s in samples]
    assert grades == ["correct", "incorrect", "not_attempted", None, "not_attempted"]
    assert metrics["eval/accuracy"] == metrics["eval/pass@1"] == pytest.approx(1 / 5)
    assert (metrics["eval/correct"], metrics["eval/incorrect"]) == (0.25, 0.25)
    assert metrics["eval/not_attempted"] == 0.5 and metrics["eval/judge_unparsed"] == 1
    assert metrics["eval/correct_given_attempted"] == 0.5
    assert metrics["eval/f_score"] == pytest.approx(1 / 3)
    assert metrics["eval/topic/geography/accuracy"] == 0.5
    assert samples[0]["judge"] == ["It names the same river. \\boxed{A}"]


MT_RATINGS = {  # category -> the judge's answer for turn 1 and turn 2
    "writing": ("Vivid.\nRating: 9", "Rating: 9"),
    "math": ("Right.\nRating: 8", "Slightly off.\nRating: 6"),
    "reasoning": ("Rating: 10", "I like it."),  # turn 2 unparsed
    "coding": ("Rating: 3", "Rating: 3"),
}


def test_mt_bench_two_turns_rated_by_the_policys_own_server(tmp_path):
    found = make(MTBenchEval).load_problems()
    find = finder(found)
    requests: list[str] = []

    def responder(text: str) -> str:
        if MT_BENCH_JUDGE[:60] in text:
            _, problem = find(text)
            turn = int(line_after("Rate the assistant's answer to turn", text)[0])
            return MT_RATINGS[problem.subsets["category"]][turn - 1]
        requests.append(text)
        i, problem = find(text)
        turn = 2 if problem.data["turns"][1] in text else 1
        return f"<think>Turn {turn}.</think>Answer {turn} to {problem.id}."

    flags = ("--env.eval_n", "2", "--env.eval_k", "1,2")
    metrics, samples = run_named("eval_mt_bench", responder, tmp_path, *flags)
    assert len(requests) == 4 * 2 * 2  # n = 2 first answers, each continued once
    second = [r for r in requests if "Now rewrite it" in r]
    assert second and all("Answer 1 to mt_bench-9001." in r for r in second)
    assert all("<think>Turn 1" not in r for r in second)  # the history holds the answer part
    assert [s["ratings"] for s in samples[::2]] == [[9, 9], [8, 6], [10, None], [3, 3]]
    assert samples[0]["answers"] == ["Answer 1 to mt_bench-9001.", "Answer 2 to mt_bench-9001."]
    assert metrics["eval/accuracy"] == metrics["eval/pass@2"] == 0.25  # mean >= 8, all rated
    assert metrics["eval/mt_bench_score"] == pytest.approx(48 / 7)
    assert (metrics["eval/turn_1/score"], metrics["eval/turn_2/score"]) == (7.5, 6.0)
    assert metrics["eval/category/math/score"] == 7.0 and metrics["eval/judge_unparsed"] == 2
    assert metrics["eval/num_samples"] == 8


def test_arena_hard_judged_in_both_orders_against_the_baseline(tmp_path):
    found = make(ArenaHardEval).load_problems()
    find = finder(found)
    answers = {
        "arena_hard-fx-arena-1": "Lists change, tuples do not: a list for a queue, a tuple a key.",
        "arena_hard-fx-arena-2": "Rinse, boil with twice the water, then simmer covered.",
        "arena_hard-fx-arena-3": "<think>GROUP BY customer_id, so",  # cut inside its think block
    }
    asked: collections.Counter[str] = collections.Counter()

    def responder(text: str) -> str:
        if ARENA_JUDGE[:60] not in text:
            return answers[find(text)[1].id]
        _, problem = find(text)
        asked[problem.id] += 1
        model_first = text.index(answers[problem.id]) < text.index(problem.gold)
        if problem.id.endswith("1"):  # the model's answer is much better, in either order
            return "[[A>>B]]" if model_first else "[[B>>A]]"
        return "Both fine, the first a little better. [[A>B]]"  # a judge biased to position A

    metrics, samples = run_named("eval_arena_hard", responder, tmp_path)
    assert asked == {"arena_hard-fx-arena-1": 2, "arena_hard-fx-arena-2": 2}  # no answer: no judge
    assert [s["win_share"] for s in samples] == [1.0, 0.5, 0.0]
    assert [s["correct"] for s in samples] == [True, False, False]
    assert metrics["eval/win_rate"] == pytest.approx(0.5)
    assert metrics["eval/accuracy"] == pytest.approx(1 / 3) and metrics["eval/judge_unparsed"] == 0
    assert samples[0]["gold"].startswith("Lists are mutable")  # the baseline answer
