"""The `reasoning_gym` environment with the real reasoning-gym package: the task list, the
scorers' verdicts reproduced through answer extraction, the weighted mix, per-task settings,
the curriculum, evaluation per task, and five tasks through `process` against the CPU server."""

from __future__ import annotations

import collections
import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI"):  # CI installs the extra: a missing package fails there
    import reasoning_gym  # noqa: F401
else:
    pytest.importorskip("reasoning_gym")

from atropos.environments.reasoning_gym import (  # noqa: E402
    ReasoningGym,
    ReasoningGymConfig,
    extract_answer,
)
from atropos.environments.reasoning_gym.tasks import parse_tasks  # noqa: E402
from atropos.envs import cli  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

from .helpers import check_against, evaluate_against, make_env, read_jsonl, rollout  # noqa: E402

make = partial(make_env, ReasoningGym, validate=True)
VARIED = ["leg_counting", "basic_arithmetic", "spell_backward", "word_sorting", "maze"]


def right(item: dict[str, Any]) -> str:
    return f"<think>Working it out.</think>\n<answer>{item['answer']}</answer>"


# ----- the task list ------------------------------------------------------------------------


def test_tasks_from_a_string_and_from_a_list():
    specs = parse_tasks("leg_counting, basic_arithmetic:2.5,")
    assert [(s.name, s.weight, s.config) for s in specs] == [
        ("leg_counting", 1.0, {}),
        ("basic_arithmetic", 2.5, {}),
    ]
    listed = parse_tasks(["gcd:3", {"name": "chain_sum", "weight": 2, "config": {"min_terms": 3}}])
    assert [(s.name, s.weight, s.config) for s in listed] == [
        ("gcd", 3.0, {}),
        ("chain_sum", 2.0, {"min_terms": 3}),
    ]


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ("", "tasks is empty"),
        ("gcd,gcd:2", "gcd more than once"),
        ("gcd:lots", "the weight after ':' must be a number"),
        ("gcd:0", "greater than 0"),
        ([{"name": "gcd", "difficulty": 3}], "Extra inputs"),
    ],
)
def test_a_bad_task_list_is_refused(tasks, message):
    with pytest.raises(ValueError, match=message):
        ReasoningGymConfig(tasks=tasks)


def test_an_unknown_task_names_the_closest():
    with pytest.raises(ValueError, match="no task 'leg_countin'; did you mean 'leg_counting'"):
        ReasoningGymConfig(tasks="leg_countin,basic_arithmetic")


def test_a_misspelt_task_on_the_command_line_is_one_line_and_exit_2(capsys):
    assert cli.main(ReasoningGym, ["process", "--env.tasks", "no_such_task"], prog="rg") == 2
    err = capsys.readouterr().err
    assert err.startswith("rg process: error: --env.tasks: reasoning-gym has no task")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_misspelt_task_found_in_setup_is_a_config_error():
    from reasoning_gym.factory import DATASETS

    from atropos.environments.reasoning_gym.tasks import check_known
    from atropos.envs.config import ConfigError

    with pytest.raises(ConfigError, match="no task 'gcdd'; did you mean 'gcd'"):
        check_known(parse_tasks("gcdd"), DATASETS)


def test_an_unknown_task_setting_lists_the_tasks_settings():
    # refused as the config is read (a usage error), before any env is made
    with pytest.raises(ValueError, match="no setting 'max_legs'; its settings: min_animals"):
        make(tasks=[{"name": "leg_counting", "config": {"max_legs": 3}}])


# ----- answers and scoring ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("<think>hmm</think><answer> 42 </answer>", "42"),
        ("<answer>1</answer> no, <answer>2</answer>", "2"),  # the last block, as reasoning-gym
        ("<think>a</think>x<think>b</think>\n 7 \n", "7"),  # after the last </think>
        ("<think>a</think>   ", None),
        ("7", None),
        ("<answer>unclosed 7", None),
    ],
)
def test_answer_extraction(completion, answer):
    assert extract_answer(completion) == answer


@pytest.mark.parametrize("task", VARIED)
def test_the_tasks_own_verdicts_on_right_and_wrong_answers(task):
    env = make(tasks=task, seed=7)
    state = env.states[task]
    for _ in range(5):
        item = state.next_item()
        entry = {k: item[k] for k in ("question", "answer", "metadata")}
        wrong = f"zz{item['answer']} and more"
        for answer in [item["answer"], wrong, "", "0"]:
            completion = f"<think>Let me see.</think>\n<answer>{answer}</answer>"
            expected = state.dataset.score_answer(extract_answer(completion), entry)
            assert env.score(item, completion) == expected
        assert env.score(item, right(item)) == 1.0
        assert env.score(item, f"<think>x</think><answer>{wrong}</answer>") < 1.0
        assert env.score(item, "no answer at all") == 0.0


def test_items_are_seeded():
    first = [make(seed=3).load() for _ in range(2)]
    assert first[0] == first[1]
    assert make(seed=4).load() != first[0]


# ----- the mix, per-task settings and the curriculum ------------------------------------------


def draw(env: ReasoningGym, n: int) -> list[dict[str, Any]]:
    import asyncio

    async def main() -> list[dict[str, Any]]:
        await env.setup()
        return [await env.get_next_item() for _ in range(n)]

    return asyncio.run(main())


def test_the_weighted_mix():
    items = draw(make(tasks="leg_counting:3,basic_arithmetic"), 400)
    counts = collections.Counter(item["task"] for item in items)
    assert set(counts) == {"leg_counting", "basic_arithmetic"}
    assert 0.68 < counts["leg_counting"] / 400 < 0.82
    assert len({item["question"] for item in items}) > 350  # fresh items, not a few repeated


def test_each_task_takes_its_own_settings():
    tasks = [
        {"name": "leg_counting", "config": {"min_animals": 2, "max_animals": 2}},
        {"name": "basic_arithmetic", "weight": 2, "config": {"min_terms": 4, "max_terms": 4}},
    ]
    items = draw(make(tasks=tasks), 40)
    legs = [i for i in items if i["task"] == "leg_counting"]
    sums = [i for i in items if i["task"] == "basic_arithmetic"]
    assert legs and sums
    assert all(len(i["metadata"]["animals"]) == 2 for i in legs)
    assert all(i["metadata"]["num_terms"] == 4 for i in sums)


def test_the_curriculum_raises_a_task_whose_accuracy_passes_the_threshold():
    env = make(tasks="leg_counting", curriculum=True, curriculum_window=4, curriculum_threshold=0.5)
    state = env.states["leg_counting"]
    item = state.next_item()
    assert (item["level"], state.settings()["max_animals"]) == (0, 1)
    group = [rollout(text=right(item)) for _ in range(4)]
    assert env.score_group(item, group[:2], [1.0, 0.0]) == [1.0, 0.0]
    assert state.level == 0 and state.window == [1.0, 0.0]  # not yet a full window
    env.score_group(item, group[:2], [1.0, 1.0])  # 3 of 4 right > 0.5
    assert state.level == 1 and state.window == []
    harder = state.next_item()
    assert harder["level"] == 1 and state.settings()["max_animals"] == 2
    env.score_group(item, group, [1.0] * 4)  # an item of the old level does not count
    assert state.level == 1 and state.window == []
    assert env.score(item, right(item)) == 1.0  # still scored by the dataset that made it
    restored = make(tasks="leg_counting", curriculum=True)
    restored.restore_state(env.checkpoint_state())
    assert restored.states["leg_counting"].level == 1


def test_no_curriculum_by_default_and_the_per_task_metrics():
    env = make(tasks="leg_counting,gcd", curriculum_window=1)
    item = env.states["gcd"].next_item()
    env.score_group(item, [rollout(text=right(item)), rollout()], [1.0, 0.0])
    assert env.states["gcd"].level == 0 and env.states["gcd"].curriculum is None
    pending = env.__dict__["_pending_means"]
    assert pending["train/accuracy/gcd"] == [1.0, 0.0]
    assert pending["errors/no_answer_rate"] == [0.0, 1.0]


def test_a_config_file_lists_tasks_with_their_settings(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "env:\n"
        "  tasks:\n"
        "    - gcd:2\n"
        "    - name: leg_counting\n"
        "      config: {min_animals: 1, max_animals: 1}\n"
    )
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer() as fake:
        argv = ["process", "--config", str(config), f"--openai.base_url={fake.base_url}"]
        argv += [
            "--env.total_steps=6",
            "--env.group_size=2",
            f"--env.data_path_to_save_groups={out}",
        ]
        assert cli.main(ReasoningGym, argv) == 0
    questions = [g["messages"][0][1]["content"] for g in read_jsonl(out)]
    assert len(questions) == 6
    legs = [q for q in questions if "how many legs" in q]
    assert legs and all("," not in q.partition("if you have")[2] for q in legs)  # one animal
    assert len(legs) < 6  # gcd too


def test_tasks_that_are_neither_text_nor_a_list_are_refused():
    with pytest.raises(ValueError, match="must be a 'name\\[:weight\\],...' string or a list"):
        ReasoningGymConfig.model_validate({"tasks": 3})


def test_check_env_passes():
    answer = "<think>x</think><answer>4</answer>"
    report = check_against(make, lambda prompt: answer, ensure_scores_are_not_same=False)
    assert report.groups == 3 and report.token_sources == {"server"}


# ----- evaluation ---------------------------------------------------------------------------


def test_evaluate_reports_accuracy_per_task(tmp_path: Path):
    settings = {"tasks": "leg_counting,gcd", "eval_size": 4}
    answers = {item["question"]: item for item in make(**settings).load_eval()}
    assert len(answers) == 8

    def respond(prompt: str) -> str:  # right on leg counting, wrong on gcd
        item = next(i for q, i in answers.items() if q.strip() in prompt)
        return right(item) if item["task"] == "leg_counting" else "<answer>nope</answer>"

    ev = evaluate_against(make, respond, tmp_path, **settings)
    assert ev.metrics["eval/accuracy/leg_counting"] == 1.0
    assert ev.metrics["eval/accuracy/gcd"] == 0.0
    assert ev.metrics["eval/accuracy"] == 0.5
    assert {s["task"] for s in ev.samples} == {"leg_counting", "gcd"} and len(ev.samples) == 8
    train = {item["question"] for item in draw(make(**settings), 50)}
    assert not train & set(answers)  # eval items are apart from training items


# ----- five tasks through `process` against the CPU server ------------------------------------


@pytest.fixture(scope="module")
def local_url():
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server() as url:
        yield url


@pytest.mark.parametrize("task", VARIED)
def test_process_against_the_cpu_server(task: str, local_url: str, tmp_path: Path):
    from atropos.envs.cli import main

    out = tmp_path / f"{task}.jsonl"
    argv = ["process", "--openai.base_url", local_url, "--openai.server_type", "vllm"]
    argv += ["--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny"]
    argv += ["--env.max_token_length", "1024", "--env.total_steps", "2"]
    argv += ["--env.group_size", "2", "--env.data_path_to_save_groups", str(out)]
    argv += ["--env.tasks", task]
    assert main(ReasoningGym, argv) == 0
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").exists()
    for g in groups:
        assert len(g["tokens"]) == len(g["masks"]) == len(g["scores"]) == 2
        assert g["token_source"] == "server"
        assert [len(lp) for lp in g["inference_logprobs"]] == [len(t) for t in g["tokens"]]
        assert all(0.0 <= s <= 1.0 for s in g["scores"])
        assert g["messages"][0][1]["role"] == "user"


def test_a_scorer_failing_on_an_answer_scores_it_0_and_counts_it_invalid(monkeypatch):
    env = make(tasks="leg_counting", seed=7)
    state = env.states["leg_counting"]
    item = state.next_item()

    def choke(answer: str | None, entry: dict[str, Any]) -> float:
        raise ValueError(f"cannot parse {answer!r}")

    monkeypatch.setattr(state.dataset, "score_answer", choke)
    text = "<think>Hm.</think>\n<answer>many legs</answer>"
    assert env.score(item, text) == 0.0
    assert env.invalid_reason(item, rollout(text=text)) == "unscorable_answer"
    assert env.invalid_reason(item, rollout(text=text)) is None  # read once, then forgotten
    assert env.invalid_reason(item, rollout(text="no answer at all")) == "no_answer"
