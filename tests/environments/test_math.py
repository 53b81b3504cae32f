"""The `math` environment: scoring rules, the four modes and their backlog round trips, data,
evaluation, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atropos import wire
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.math import MathConfig, MathEnv, demo_responder
from atropos.environments.math.data import HUB_EVAL_SETS, eval_items, to_item, train_items
from atropos.environments.math.prompts import judge_messages, retry_messages, rlaif_messages
from atropos.environments.math.scoring import (
    as_boxed,
    cosine_length_scores,
    most_dissimilar,
    rlaif_vote,
    verdict,
    verify,
)
from atropos.envs import cli, registry
from atropos.envs.config import ConfigError
from atropos.envs.judge import JudgeConfig
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    collect,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
)

TRAIN = train_items()
GOLD: dict[str, str] = {i["question"]: i["answer"] for i in TRAIN + eval_items()}
ZERO = {"set_advantage_to_zero": True}
PROBLEM = "Compute $17 \\times 23$."
ITEM = {"mode": "normal", "question": PROBLEM, "answer": "\\boxed{391}"}


def question_of(prompt: str) -> str:
    return max((q for q in GOLD if q in prompt), key=len)


def solution(prompt: str, right: bool = True, tail: str = "") -> str:
    gold = GOLD[question_of(prompt)]
    inner = gold.removeprefix("\\boxed{").removesuffix("}")
    boxed = gold if right else f"\\boxed{{{inner}+1}}"
    return f"<think>Working it out step by step.</think> {tail}The answer is {boxed}."


Reply = Callable[[str, int], str]


class Policy:
    """A scripted policy: one reply function per kind of prompt, given the prompt and how many
    prompts of that kind came before (choices of one request are answered in order)."""

    def __init__(
        self,
        solve: Reply | None = None,
        verify: Reply | None = None,
        retry: Reply | None = None,
        prefer: Reply | None = None,
    ) -> None:
        self.replies = {"solve": solve, "verify": verify, "retry": retry, "prefer": prefer}
        self.calls: Counter[str] = Counter()

    def __call__(self, prompt: str) -> str:
        kind = (
            "prefer"
            if "[START SOLUTION 1]" in prompt
            else "retry"
            if "[START VERIFICATION]" in prompt
            else "verify"
            if "[START SOLUTION]" in prompt
            else "solve"
        )
        reply = self.replies[kind]
        if reply is None:
            pytest.fail(f"unexpected {kind} prompt")
        n = self.calls[kind]
        self.calls[kind] += 1
        return reply(prompt, n)


def accepted(group: dict[str, Any]) -> bool:
    """Whether the trajectory API would take the group as it is, with no findings."""
    return wire.check_group(wire.decode_group(wire.encode(group))) == []


def alternate(prompt: str, n: int) -> str:
    return solution(prompt, right=n % 2 == 0)


def make(url: str, mode: str = "process", **env: Any) -> MathEnv:
    """Groups of 4; no judging and no length penalty unless `env` asks for them."""
    env = {"percent_to_judge": 0.0, "percent_length_penalty": 0.0, **env}
    return make_env(MathEnv, url, mode, **env)


def run(policy: Callable[[str], str], items: list[dict[str, Any]], **env: Any) -> list[Any]:
    """(group, backlog) per item, collected in order by one env (then `run.env`) against a fake
    server."""
    with FakeInferenceServer(responder=policy) as fake:
        run.env = make(fake.base_url, **env)  # type: ignore[attr-defined]
        return collect(run.env, *items)  # type: ignore[attr-defined]


# ----- scoring rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "right"),
    [
        ("<think>1/2 + 1/3</think> So \\boxed{\\frac{5}{6}}.", True),
        ("\\boxed{\\dfrac{5}{6}}", True),
        ("\\boxed{5/6}", True),
        ("\\boxed{\\frac{10}{12}}", True),  # equal, not identical
        ("The final answer is $\\frac{5}{6}$.", True),  # anchored LaTeX without a box
        ("5/6", False),  # bare text: nothing to extract
        ("\\boxed{0.8333}", False),
        ("<think>it is \\boxed{5/6}</think> I am not sure.", False),  # only after </think>
        ("<think>\\boxed{1}</think> no: \\boxed{5/6}", True),
        ("\\boxed{1} or \\boxed{5/6}", False),  # several different answers
        ("\\boxed{\\frac{5}{6}", False),  # unclosed box
        ("", False),
    ],
)
def test_verify_reads_the_boxed_answer_after_thinking(completion: str, right: bool) -> None:
    assert verify("\\boxed{\\frac{5}{6}}", completion) is right


def test_an_unparsable_gold_is_none_not_false() -> None:
    assert verify("\\boxed{}", "\\boxed{3}") is None
    assert as_boxed(" 7 ") == "\\boxed{7}" and as_boxed("\\boxed{7}") == "\\boxed{7}"


def test_cosine_length_penalty() -> None:
    assert cosine_length_scores([100, 200, 150, 100]) == [1.0, -1.0, 0.0, 1.0]
    assert cosine_length_scores([100, 110]) is None  # spread not above 10% of the shortest
    assert cosine_length_scores([100, 111]) == [1.0, -1.0]


def test_most_dissimilar_pair_and_ratios() -> None:
    assert most_dissimilar(["same", "same", "same"]) == (0, 1, 1.0)
    i, j, ratio = most_dissimilar(["\\boxed{4}", "It is \\boxed{4}", "\\boxed{4}"])
    assert (i, j) == (0, 1) and 0 < ratio < 1


@pytest.mark.parametrize(
    ("text", "choices", "expected"),
    [
        ("\\boxed{True}", ("True", "False"), "True"),
        ("<think>\\boxed{True}</think> wrong: \\boxed{false}", ("True", "False"), "False"),
        ("\\boxed{\\text{True}}", ("True", "False"), None),  # nested braces: not read
        ("True", ("True", "False"), None),
        ("\\boxed{Maybe}", ("True", "False"), None),
        ("<think>hm</think>", ("1", "2"), None),
    ],
)
def test_verdicts(text: str, choices: tuple[str, ...], expected: str | None) -> None:
    assert verdict(text, choices) == expected


def test_preference_votes_map_to_compare_letters() -> None:
    assert [rlaif_vote(t) for t in ("\\boxed{1}", "\\boxed{ 2 }", "\\boxed{3}", "1")] == [
        "A",
        "B",
        None,
        None,
    ]


def test_prompts_carry_the_problem_and_solutions() -> None:
    [system, user] = judge_messages("P?", "S.")
    assert "<think>" in system["content"] and "\\boxed{True}" in user["content"]
    assert user["content"].index("P?") < user["content"].index("S.")
    retry = retry_messages("P?", "S.", "V.")[1]["content"]
    assert retry.index("P?") < retry.index("S.") < retry.index("V.")
    prefer = rlaif_messages("P?", "first-sol", "second-sol")[1]["content"]
    assert prefer.index("first-sol") < prefer.index("second-sol") and "\\boxed{2}" in prefer


# ----- data ---------------------------------------------------------------------------------------


def test_fixtures_verify_and_wrong_answers_do_not() -> None:
    rows = read_jsonl(data_path("math", "train.jsonl"))
    assert len(rows) == len(TRAIN) == 40 and {"question", "final_answer"} <= set(rows[0])
    evals = eval_items()
    assert Counter(i["subset"] for i in evals) == {"aime24": 7, "math500": 8, "amc23": 6}
    assert not {i["question"] for i in TRAIN} & {i["question"] for i in evals}
    for item in TRAIN + evals:
        prompt = item["question"]
        assert verify(item["answer"], solution(prompt)) is True, item
        assert verify(item["answer"], solution(prompt, right=False)) is False, item


def test_rows_without_an_answer_are_skipped() -> None:
    assert to_item({"question": "q", "final_answer": ""}) is None
    assert to_item({"question": None, "final_answer": "1"}) is None


def test_hub_datasets_are_loaded_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def rows(name: str, split: str | None) -> list[Any]:
        if name == "zwhe99/DeepMath-103K":
            return [{"question": "hub q", "final_answer": "\\frac{1}{2}", "difficulty": 3.0},
                    {"question": "bad", "final_answer": None}]  # fmt: skip
        key = "question" if name == "math-ai/amc23" else "problem"
        return [{key: f"{name} problem", "answer": 12.0 if key == "question" else "12"}]

    calls = fake_hub(monkeypatch, rows)
    env = make("http://127.0.0.1:9", dataset_name="zwhe99/DeepMath-103K", eval_from_hub=True)
    assert env.load() == [
        {"mode": "normal", "question": "hub q", "answer": "\\boxed{\\frac{1}{2}}"}
    ]
    evals = env.load_eval()
    assert [i["subset"] for i in evals] == list(HUB_EVAL_SETS)
    assert evals[2] == {"question": "math-ai/amc23 problem", "answer": "\\boxed{12.0}",
                        "subset": "amc23"}  # fmt: skip
    splits = [(c.name, c.split) for c in calls]
    assert splits == [("zwhe99/DeepMath-103K", "train"), *HUB_EVAL_SETS.values()]


# ----- normal mode --------------------------------------------------------------------------------


def test_mixed_groups_score_plus_minus_one_with_server_tokens() -> None:
    [(group, backlog)] = run(Policy(solve=alternate), [ITEM])
    assert group["scores"] == [1.0, -1.0, 1.0, -1.0] and backlog == []
    assert group["overrides"] == [{}, {}, {}, {}] and len(group["inference_logprobs"]) == 4
    assert group["messages"][0][1]["content"] == PROBLEM and group["token_source"] == "server"
    metrics = asyncio.run(_logged(run.env))  # type: ignore[attr-defined]
    assert metrics["train/percent_correct"] == 0.5 and metrics["train/pass_at_groupsize"] == 1.0
    assert metrics["train/iter"] == 1 and metrics["train/math/normal_groups"] == 1


async def _logged(env: MathEnv) -> dict[str, Any]:
    await env.wandb_log({})
    return env.metrics


def test_mixed_groups_push_a_right_and_a_wrong_solution_to_judge() -> None:
    [(group, backlog)] = run(Policy(solve=alternate), [ITEM], percent_to_judge=1.0)
    assert group["scores"] == [1.0, -1.0, 1.0, -1.0]
    assert [(b["mode"], b["expected"]) for b in backlog] == [("judge", "True"), ("judge", "False")]
    right, wrong = (b["solution"] for b in backlog)
    assert right == " The answer is \\boxed{391}." and "<think>" not in wrong
    assert all(b["question"] == PROBLEM and b["answer"] == "\\boxed{391}" for b in backlog)


def test_truncated_answers_score_minus_one_with_their_advantage_zeroed() -> None:
    def solve(prompt: str, n: int) -> str:
        return solution(prompt) if n % 2 == 0 else "<think>" + "and then " * 300

    settings = {"max_token_length": 512, "min_completion_tokens": 16, "percent_to_judge": 1.0}
    [(group, backlog)] = run(Policy(solve=solve), [ITEM], **settings)
    assert group["scores"] == [1.0, -1.0, 1.0, -1.0]
    assert group["overrides"] == [{}, ZERO, {}, ZERO]
    assert backlog == []  # every wrong answer was cut off: no "False" example for judge
    assert len(group["tokens"][1]) == 512
    [(kept, _)] = run(Policy(solve=solve), [ITEM], **settings, mask_too_long_completions=False)
    assert kept["overrides"] == [{}, {}, {}, {}] and kept["scores"] == [1.0, -1.0, 1.0, -1.0]


def test_all_wrong_groups_and_unparsable_golds_are_dropped() -> None:
    wrong = Policy(solve=lambda prompt, n: solution(prompt, right=False))
    [(group, backlog)] = run(wrong, [ITEM])
    assert group is None and backlog == []
    bad = {"mode": "normal", "question": PROBLEM, "answer": "\\boxed{}"}
    [(group, _)] = run(Policy(solve=alternate), [bad])
    assert group is None and run.env.counts["dropped_bad_gold"] == 1  # type: ignore[attr-defined]


def test_completions_under_ten_trained_tokens_drop_the_group() -> None:
    [(group, _)] = run(Policy(solve=lambda p, n: "\\boxed{391}" if n else solution(p)), [ITEM])
    assert group is None


def test_problems_leaving_too_few_tokens_are_skipped_without_sampling() -> None:
    policy = Policy()  # any prompt would fail the test
    [(group, _)] = run(policy, [ITEM], max_token_length=300, min_completion_tokens=256)
    assert group is None and run.env.counts["skipped_long_prompts"] == 1  # type: ignore[attr-defined]


def varied(prompt: str, n: int) -> str:
    """Always right; the text after </think> differs in length and wording."""
    tails = ["", "Adding the parts carefully, term by term, we get the total. ", "", "Thus "]
    return solution(prompt, tail=tails[n % 4])


def test_all_correct_groups_are_dropped_but_send_distinct_answers_to_rlaif() -> None:
    [(group, backlog)] = run(Policy(solve=varied), [ITEM])
    assert group is None
    [pair] = backlog
    assert pair["mode"] == "rlaif" and pair["similarity"] < 0.975
    first, second = pair["pair"]
    assert (
        "Adding the parts" in first["messages"][-1]["content"] + second["messages"][-1]["content"]
    )
    assert all(len(s["tokens"]) == len(s["masks"]) == len(s["logprobs"]) for s in pair["pair"])
    # identical answers: nothing for rlaif
    [(_, backlog)] = run(Policy(solve=lambda p, n: solution(p)), [ITEM])
    assert backlog == []


def test_all_correct_groups_get_the_cosine_length_penalty_when_drawn() -> None:
    [(group, backlog)] = run(Policy(solve=varied), [ITEM], percent_length_penalty=1.0)
    lengths = [len(t) for t in group["tokens"]]
    assert group["scores"] == cosine_length_scores(lengths)
    assert max(group["scores"]) == 1.0 and min(group["scores"]) == -1.0
    assert [b["mode"] for b in backlog] == ["rlaif"]
    # lengths within 10% of the shortest: dropped even when drawn
    [(group, _)] = run(Policy(solve=lambda p, n: solution(p)), [ITEM], percent_length_penalty=1.0)
    assert group is None


def test_the_draws_are_seeded() -> None:
    env = make("http://127.0.0.1:9", random_seed=7)
    asyncio.run(env.setup())
    assert env.draws.random() == random.Random(7).random()


# ----- rlaif mode ---------------------------------------------------------------------------------


def prefer_first(prompt: str, n: int) -> str:
    return "<think>Both are right; the first is clearer.</think> \\boxed{1}"


def test_rlaif_trains_the_stored_pair_with_its_original_tokens() -> None:
    [(_, [pair])] = run(Policy(solve=varied), [ITEM])
    # the judge always answers "1": the first shown wins in each order, so the votes tie
    [(tie, _)] = run(Policy(prefer=prefer_first), [pair])
    assert tie is None

    def prefer_long(prompt: str, n: int) -> str:
        one = prompt.split("[START SOLUTION 1]", 1)[1].split("[END SOLUTION 1]", 1)[0]
        return "\\boxed{1}" if "Adding the parts" in one else "\\boxed{2}"

    policy = Policy(prefer=prefer_long)
    [(group, backlog)] = run(policy, [pair])
    assert policy.calls["prefer"] == 6  # --judge.votes 3, in both orders
    first, second = pair["pair"]
    winner = 0 if "Adding the parts" in first["messages"][-1]["content"] else 1
    assert group["scores"] == [1.0 if i == winner else -1.0 for i in range(2)]
    assert group["group_overrides"] == {"group_size": 2} and backlog == []
    assert group["tokens"] == [first["tokens"], second["tokens"]]
    assert group["masks"] == [first["masks"], second["masks"]]
    assert group["inference_logprobs"] == [first["logprobs"], second["logprobs"]]
    assert group["messages"] == [first["messages"], second["messages"]]
    assert accepted(group)


def test_the_rlaif_judge_can_have_its_own_server() -> None:
    [(_, [pair])] = run(Policy(solve=varied), [ITEM])
    with FakeInferenceServer(responder=lambda p: "\\boxed{2}" if "Adding" in p.split(
        "[START SOLUTION 2]")[1] else "\\boxed{1}") as judge:  # fmt: skip
        [(group, _)] = run(Policy(), [pair], judge=JudgeConfig(base_url=judge.base_url))
        assert judge.requests["/v1/chat/completions"] == 2
    assert sorted(group["scores"]) == [-1.0, 1.0]


# ----- judge and selfcorrect modes --------------------------------------------------------------


def judge_item(expected: str) -> dict[str, Any]:
    boxed = "\\boxed{391}" if expected == "True" else "\\boxed{392}"
    return {"mode": "judge", "question": PROBLEM, "answer": "\\boxed{391}",
            "solution": f" 17 * 23 is {boxed}.", "expected": expected}  # fmt: skip


def say(*verdicts: str) -> Reply:
    return lambda prompt, n: f"<think>Checking.</think> \\boxed{{{verdicts[n % len(verdicts)]}}}"


def test_judging_a_right_solution_rewards_the_right_verdicts() -> None:
    [(group, backlog)] = run(Policy(verify=say("True", "False")), [judge_item("True")])
    assert group["scores"] == [1.0, -1.0, 1.0, -1.0] and backlog == []
    assert "[START SOLUTION]" in group["messages"][0][1]["content"]
    assert group["overrides"] == [{}] * 4
    [(none, _)] = run(Policy(verify=say("False")), [judge_item("True")])
    assert none is None  # no right verdict: nothing to learn


def test_unparsed_or_truncated_verdicts_are_wrong() -> None:
    def verify_reply(prompt: str, n: int) -> str:
        return ["\\boxed{True}", "True, I think", "\\boxed{True}" + " and so on" * 300,
                "\\boxed{yes}"][n]  # fmt: skip

    [(group, _)] = run(Policy(verify=verify_reply), [judge_item("True")], max_token_length=700)
    assert group["scores"] == [1.0, -1.0, -1.0, -1.0]
    assert group["overrides"] == [{}, {}, ZERO, {}]


def test_judging_a_wrong_solution_scores_by_retries_and_queues_selfcorrect() -> None:
    policy = Policy(verify=say("False", "True", "True", "True"), retry=alternate)
    [(group, backlog)] = run(policy, [judge_item("False")])
    assert policy.calls["retry"] == 4  # one retry group, for the one right verdict
    assert group["scores"] == [0.5, -1.0, -1.0, -1.0]
    [replay] = backlog
    assert replay["mode"] == "selfcorrect" and replay["scores"] == [1.0, -1.0, 1.0, -1.0]
    assert "[START VERIFICATION]" in replay["sequences"][0]["messages"][1]["content"]
    metrics = asyncio.run(_logged(run.env))  # type: ignore[attr-defined]
    assert metrics["judge_train/percent_judge_correct"] == 0.25
    assert metrics["judge_train/judge_success_rate"] == 0.5
    # the replay trains the stored retry group exactly
    [(again, more)] = run(Policy(), [replay])
    assert more == [] and again["scores"] == [1.0, -1.0, 1.0, -1.0]
    for key, stored in (
        ("tokens", "tokens"),
        ("masks", "masks"),
        ("inference_logprobs", "logprobs"),
    ):
        assert again[key] == [s[stored] for s in replay["sequences"]]
    assert again["overrides"] == [{}] * 4
    assert accepted(group) and accepted(again)


def test_retries_that_all_agree_queue_nothing_and_truncated_retries_count_zero() -> None:
    def retry(prompt: str, n: int) -> str:
        return solution(prompt) if n % 2 == 0 else "<think>" + "hmm " * 400

    policy = Policy(verify=say("False", "True"), retry=retry)
    [(group, backlog)] = run(policy, [judge_item("False")], max_token_length=700)
    assert group["scores"] == [0.5, -1.0, 0.5, -1.0]
    [replay, _] = backlog
    assert replay["scores"] == [1.0, 0.0, 1.0, 0.0]
    [(again, _)] = run(Policy(), [replay], max_token_length=700)
    assert again["overrides"] == [{}, ZERO, {}, ZERO]
    policy = Policy(verify=say("False"), retry=lambda p, n: solution(p))
    [(group, backlog)] = run(policy, [judge_item("False")])
    assert group is None and backlog == []  # all 1.0, no penalty drawn: dropped


def test_unknown_modes_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown math mode 'exam'"):
        run(Policy(), [{**ITEM, "mode": "exam"}])


# ----- evaluation, config, registration -------------------------------------------------------


def test_evaluate_reports_each_subset_and_overall(tmp_path: Path) -> None:
    aime = {i["question"] for i in eval_items() if i["subset"] == "aime24"}

    def answer(prompt: str) -> str:
        return solution(prompt, right=not any(q in prompt for q in aime))  # aime: all wrong

    evaluation = evaluate_against(make, answer, tmp_path)
    assert evaluation.metrics == {
        "eval/aime24_percent_correct": 0.0,
        "eval/math500_percent_correct": 1.0,
        "eval/amc23_percent_correct": 1.0,
        "eval/overall_percent_correct": 14 / 21,
    }
    assert evaluation.temperature == 0.0
    samples = evaluation.samples
    assert len(samples) == 21 and {"subset", "completion", "score"} <= set(samples[0])
    assert asyncio.run(make("http://127.0.0.1:9", run_evaluation=False).evaluate()) == {}


def test_defaults_flags_and_registration() -> None:
    config, [server] = env_defaults(MathEnv)
    assert isinstance(config, MathConfig) and config.tokenizer_name == "tiny"
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "vllm")
    assert (config.percent_to_judge, config.percent_length_penalty) == (0.3, 0.1)
    assert (config.rlaif_max_similarity, config.judge.votes) == (0.975, 3)
    resolved = cli.parse(MathEnv, "process", ["--env.percent_to_judge", "0.5"])
    assert resolved.env.percent_to_judge == 0.5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="percent_length_penalty"):
        cli.parse(MathEnv, "process", ["--env.percent_length_penalty", "2"])
    assert registry.get("math") is MathEnv


def test_demo_responder_mixes_answers_and_verdicts() -> None:
    prompt = f"<|im_start|>user\n{PROBLEM}<|im_end|>"
    answers = [demo_responder(prompt) or "" for _ in range(4)]
    assert sorted(verify("\\boxed{391}", a) is True for a in answers) == [False, False, True, True]
    judged = judge_messages(PROBLEM, "It is \\boxed{391}.")[1]["content"]
    said = {verdict(demo_responder(judged) or "", ("True", "False")) for _ in range(2)}
    assert said == {"True", "False"}
    prefer = rlaif_messages(PROBLEM, "long " * 5 + "\\boxed{391}", "\\boxed{391}")[1]["content"]
    assert rlaif_vote(demo_responder(prefer) or "") == "B"
    assert demo_responder("What is the meaning of life?") is None


def test_check_env_passes_with_the_demo_policy() -> None:
    report = check_against(make, demo_responder, percent_to_judge=1.0)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_process_end_to_end_writes_jsonl_and_html(tmp_path: Path) -> None:
    written = process_through_cli(MathEnv, demo_responder, tmp_path / "math.jsonl", group_size=4)
    groups = written.groups
    assert len(groups) == 3 and all(sorted(g["scores"]) == [-1, -1, 1, 1] for g in groups)
    assert all(g["overrides"] == [{}] * 4 for g in groups)
    assert "boxed" in written.page
    metrics = written.metrics
    assert metrics["groups"] == 3 and metrics["env"]["train/percent_correct"] == 0.5
