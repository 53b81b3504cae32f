"""The `letter_counting` environment: tiers, item generation, strict scoring, the curriculum,
checkpoints, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
from functools import partial

import pytest

from atropos.environments import letter_counting
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.letter_counting import LetterCounting, LetterCountingConfig
from atropos.environments.letter_counting.letters import (
    TIERS,
    Curriculum,
    make_item,
    parse_answer,
    pick_letters,
    question,
    read_words,
    score_answer,
    split_words,
)
from atropos.envs import registry

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>Counting letter by letter.</think>\n"


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, LetterCounting)


_SINGLE = re.compile(r"How many ([a-z])s are in the string ([a-z]+)\?")
_MULTI = re.compile(r"Count the occurrences of the letters (.+?) in the string ([a-z]+)\n")


def truth(prompt: str) -> tuple[str, list[str]]:
    if m := _SINGLE.search(prompt):
        return m.group(2), [m.group(1)]
    m = _MULTI.search(prompt)
    assert m, prompt
    return m.group(2), re.findall(r"'([a-z])'", m.group(1))


def answer(prompt: str, right: bool = True) -> str:
    text, letters = truth(prompt)
    counts = {letter: text.count(letter) + (0 if right else 1) for letter in letters}
    body = json.dumps(counts) if len(letters) > 1 else str(counts[letters[0]])
    return f"<think>I count each letter of the string one at a time.</think><answer>{body}</answer>"


# ----- data and generation ------------------------------------------------------------------


def test_the_word_list_and_its_split():
    words = read_words()
    assert len(words) >= 500 and len(set(words)) == len(words)
    assert all(w.isalpha() and w == w.lower() and 3 <= len(w) <= 30 for w in words)
    train, held_out = split_words(words)
    assert len(held_out) == len(words) - int(0.95 * len(words))
    assert sorted(train + held_out) == sorted(words) and (train, held_out) == split_words(words)
    for level in range(1, 6):  # every word tier has words to pick from
        tier = TIERS[level]
        assert sum(tier.min_length <= len(w) <= tier.max_length for w in train) >= 20


def test_the_tier_table():
    assert sorted(TIERS) == list(range(1, 11))
    one, ten = TIERS[1], TIERS[10]
    assert (one.min_length, one.max_length, one.max_letters, one.random_string) == (3, 8, 1, False)
    assert (ten.min_length, ten.max_length, ten.min_letters, ten.max_letters) == (400, 500, 35, 50)
    assert [TIERS[n].random_string for n in range(1, 11)] == [False] * 5 + [True] * 5


@pytest.mark.parametrize("level", range(1, 11))
def test_items_fit_their_tier(level):
    words, rng, tier = read_words(), random.Random(level), TIERS[level]
    for _ in range(30):
        item = make_item(level, words, rng)
        text, letters = item["text"], item["letters"]
        assert tier.min_length <= len(text) <= tier.max_length and item["level"] == level
        assert (text in words) != tier.random_string
        assert len(set(letters)) == len(letters) and 1 <= len(letters) <= min(26, tier.max_letters)
        if len(letters) > 1:
            assert len(letters) >= max(2, tier.min_letters) or len(letters) == 26
            assert item["expected"] == {x: text.count(x) for x in letters}
        else:
            assert item["expected"] == text.count(letters[0])
        assert truth(item["prompt"]) == (text, letters)
    if level == 1:
        assert all(len(make_item(1, words, rng)["letters"]) == 1 for _ in range(50))


def test_letters_lean_towards_those_present_and_never_repeat():
    rng = random.Random(7)
    picks = [pick_letters("strawberry", 1, rng)[0] for _ in range(400)]
    present = sum(p in "strawberry" for p in picks) / len(picks)
    assert 0.4 < present < 0.8  # bias drawn from [0.3, 0.9]; 7 of 26 letters by chance alone
    everything = pick_letters("abc", 50, rng)
    assert sorted(everything) == list(string.ascii_lowercase)  # both pools exhausted: 26


def test_question_formats():
    single = question("banana", ["a"])
    assert single.startswith("How many as are in the string banana?")
    assert single.endswith("<answer>{number}</answer>")
    multi = question("banana", ["a", "n", "z"])
    assert "letters 'a', 'n', and 'z' in the string banana\n" in multi
    assert multi.endswith('<answer>{"a": 0, "n": 0, "z": 0}</answer>')
    assert "'a' and 'n'" in question("banana", ["a", "n"])


# ----- scoring ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "expected", "score"),
    [
        (THINK + "<answer>3</answer>", 3, 1.0),
        (THINK + "The answer: <answer> 3 </answer>", 3, 1.0),
        (THINK + "<answer>4</answer>", 3, 0.0),
        ("<answer>3</answer>", 3, 0.0),  # no think block
        ("<think>a</think><think>b</think><answer>3</answer>", 3, 0.0),  # two think blocks
        ("<think>unclosed <answer>3</answer>", 3, 0.0),
        ("</think>backwards<think><answer>3</answer>", 3, 0.0),
        ("<think><answer>3</answer></think>", 3, 0.0),  # the answer is only inside thinking
        (THINK + "<answer>3</answer><answer>3</answer>", 3, 0.0),  # two answers
        (THINK + "<answer>3</answer><answer>x</answer>", 3, 0.0),
        (THINK + "<answer>3", 3, 0.0),  # unclosed
        (THINK + "<answer>three</answer>", 3, 0.0),
        (THINK + "<answer>3.0</answer>", 3, 0.0),
        (THINK + '<answer>{"a": 3}</answer>', 3, 0.0),  # JSON where a number is wanted
        (THINK + '<answer>{"a": 3, "n": 2}</answer>', {"a": 3, "n": 2}, 1.0),
        (THINK + '<answer>{"n": 2, "a": 3}</answer>', {"a": 3, "n": 2}, 1.0),  # key order
        (THINK + '<answer>{"a": 3}</answer>', {"a": 3, "n": 2}, 0.0),  # a key missing
        (THINK + '<answer>{"a": 3, "n": 2, "b": 1}</answer>', {"a": 3, "n": 2}, 0.0),  # extra
        (THINK + '<answer>{"a": 3, "m": 2}</answer>', {"a": 3, "n": 2}, 0.0),  # wrong key
        (THINK + '<answer>{"a": 3, "n": 1}</answer>', {"a": 3, "n": 2}, 0.0),  # wrong count
        (THINK + '<answer>{"a": "3", "n": 2}</answer>', {"a": 3, "n": 2}, 0.0),  # a string
        (THINK + '<answer>{"a": true, "n": 2}</answer>', {"a": 1, "n": 2}, 0.0),  # a boolean
        (THINK + "<answer>[3, 2]</answer>", {"a": 3, "n": 2}, 0.0),  # not an object
        (THINK + "<answer>{a: 3, n: 2}</answer>", {"a": 3, "n": 2}, 0.0),  # not JSON
    ],
)
def test_strict_scoring(completion, expected, score):
    assert score_answer(completion, expected) == score


def test_parse_answer_returns_the_value():
    assert parse_answer(THINK + "<answer>12</answer>", multiple=False) == 12
    assert parse_answer(THINK + '<answer>{"a": 1}</answer>', multiple=True) == {"a": 1}
    assert parse_answer("<answer>12</answer>", multiple=False) is None


def test_score_group_rules():
    env = make()
    item = {"expected": 3, "level": 3}
    mixed = [1.0, 0.0, 1.0, 0.0]
    assert env.score_group(item, [rollout()] * 4, mixed) == mixed
    # a truncated completion scores 0 (here: 3 of 4 right becomes 2 of 4)
    rollouts = [rollout(finish="length"), rollout(), rollout(), rollout()]
    assert env.score_group(item, rollouts, [1.0, 1.0, 1.0, 0.0]) == [0.0, 1.0, 1.0, 0.0]
    # a completion under 10 trained tokens drops the group
    assert env.score_group(item, [rollout(9)] + [rollout()] * 3, mixed) is None
    # too easy (mean > 0.8) and too hard (mean < 0.2) are skipped...
    assert env.score_group(item, [rollout()] * 4, [1.0] * 4) is None
    assert env.score_group(item, [rollout()] * 4, [0.0] * 4) is None
    five = make(group_size=5)
    edge = [1.0, 1.0, 1.0, 1.0, 0.0]  # exactly 0.8: kept (only above it is too easy)
    assert five.score_group(item, [rollout()] * 5, edge) == edge
    # ...but still counted by the curriculum, as was every group above (the mean of the
    # completions long enough to keep, for the dropped one)
    assert env.curriculum.scores == pytest.approx([0.5, 0.5, 1 / 3, 1.0, 0.0])
    # all equal: dropped when the config says so (thresholds opened up to reach it)
    wide = make(difficulty_increase_threshold=1.0, difficulty_decrease_threshold=0.0)
    assert wide.score_group(item, [rollout()] * 4, [1.0] * 4) is None
    keep = make(
        difficulty_increase_threshold=1.0,
        difficulty_decrease_threshold=0.0,
        ensure_scores_are_not_same=False,
    )
    assert keep.score_group(item, [rollout()] * 4, [1.0] * 4) == [1.0] * 4


# ----- the curriculum -----------------------------------------------------------------------


def test_curriculum_moves_on_a_full_half_window_and_resets():
    c = Curriculum(level=3, window=20)
    assert c.min_samples == 10
    assert [c.record(0.9, 3) for _ in range(9)] == [0] * 9 and c.level == 3
    assert c.record(0.9, 3) == 1 and (c.level, c.scores) == (4, [])  # 10 > 0.8: up, reset
    assert c.record(0.0, 3) == 0 and c.scores == []  # a group from the old tier is ignored
    for _ in range(9):
        c.record(0.1, 4)
    assert c.record(0.1, 4) == -1 and c.level == 3  # < 0.2: down
    for _ in range(30):  # in between: no change; the window keeps the last 20
        assert c.record(0.5, 3) == 0
    assert len(c.scores) == 20 and c.success_rate == 0.5
    assert Curriculum(window=150).min_samples == 75 and Curriculum(window=4).min_samples == 10


def test_curriculum_stays_within_its_bounds():
    top = Curriculum(level=10, window=10)
    assert [top.record(1.0, 10) for _ in range(10)][-1] == 0 and top.level == 10
    bottom = Curriculum(level=1, window=10, lowest=1)
    assert [bottom.record(0.0, 1) for _ in range(10)][-1] == 0 and bottom.level == 1
    assert len(top.scores) == 10  # not reset without a change


def test_the_env_climbs_and_generates_harder_items():
    env = make(difficulty_window_size=20, starting_difficulty_level=5)
    asyncio.run(env.setup())
    for _ in range(10):
        item = asyncio.run(env.get_next_item())
        assert item["level"] == 5
        assert env.score_group(item, [rollout()] * 4, [1.0] * 4) is None  # too easy: skipped
    assert env.curriculum.level == 6
    harder = asyncio.run(env.get_next_item())
    assert harder["level"] == 6 and len(harder["text"]) >= 40
    asyncio.run(env.wandb_log())
    assert env.metrics["curriculum/difficulty_level"] == 6
    assert env.metrics["curriculum/samples_in_window"] == 0
    assert env.metrics["train/percent_correct"] == 1.0


def test_items_are_reproducible_from_the_seed():
    first, second = make(), make()
    asyncio.run(first.setup())
    asyncio.run(second.setup())
    for _ in range(5):
        assert asyncio.run(first.get_next_item()) == asyncio.run(second.get_next_item())


def test_curriculum_state_is_checkpointed_and_restored(tmp_path):
    env = make(difficulty_window_size=20)
    env.checkpoint_dir = str(tmp_path)
    env.curriculum.level = 7
    env.curriculum.scores = [0.5, 0.25]
    env.iter = 12
    path = env.save_checkpoint(40)
    assert path is not None and path.is_file()
    fresh = make(difficulty_window_size=20)
    fresh.checkpoint_dir, fresh.curr_step = str(tmp_path), 40
    assert fresh.load_checkpoint() == {"iter": 12, "level": 7, "recent_scores": [0.5, 0.25]}
    assert (fresh.curriculum.level, fresh.curriculum.scores, fresh.iter) == (7, [0.5, 0.25], 12)


def test_metrics_are_logged_and_reset():
    env = make()
    item = {"expected": 3, "level": 3}
    env.score_group(item, [rollout()] * 4, [1.0, 0.0, 0.0, 1.0])
    asyncio.run(env.wandb_log({"x": 1}))
    assert env.metrics == {
        "x": 1,
        "curriculum/difficulty_level": 3,
        "curriculum/samples_in_window": 1,
        "curriculum/recent_success_rate": 0.5,
        "train/percent_correct": 0.5,
        "errors/format_error_rate": 1.0,  # the rollouts' text "x" has no answer at all
    }


# ----- evaluation data ----------------------------------------------------------------------


def test_the_eval_fixture_answers_are_right():
    rows = read_jsonl(data_path("letter_counting", "eval.jsonl"))
    assert len(rows) == 30 and sorted({r["DifficultyLevel"] for r in rows}) == list(range(1, 11))
    for row in rows:
        text, letters = truth(row["Prompt"])
        expected = json.loads(row["Answer"])
        if len(letters) == 1:
            assert expected == text.count(letters[0])
        else:
            assert expected == {x: text.count(x) for x in letters}


def test_the_hub_eval_set_is_read_when_named(monkeypatch):
    rows = [
        {"Prompt": "How many as are in the string aa?", "Answer": "2", "DifficultyLevel": 1},
        {"Prompt": "p", "Answer": '{"a": 1, "b": 0}', "DifficultyLevel": 2},
    ]
    calls = fake_hub(monkeypatch, rows)
    items = make(eval_dataset_name="NousResearch/Letter-Counting-Eval").load_eval()
    assert [(c.name, c.split) for c in calls] == [("NousResearch/Letter-Counting-Eval", "train")]
    assert [i["expected"] for i in items] == [2, {"a": 1, "b": 0}]
    assert [i["level"] for i in items] == [1, 2]


def test_an_unreadable_eval_answer_names_its_row(monkeypatch):
    fake_hub(monkeypatch, [{"Prompt": "p", "Answer": "3"}, {"Prompt": "q", "Answer": "many"}])
    with pytest.raises(ValueError, match="Letter-Counting-Eval row 2: Answer 'many' is neither"):
        make(eval_dataset_name="NousResearch/Letter-Counting-Eval").load_eval()


# ----- against a fake inference server ------------------------------------------------------


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, letter_counting.demo_responder)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_evaluate_reports_overall_and_per_tier_accuracy(tmp_path):
    def responder(prompt: str) -> str:  # right on words, wrong on random strings
        return answer(prompt, right=len(truth(prompt)[0]) < 40)

    run = evaluate_against(make, responder, tmp_path)
    metrics = run.metrics
    assert metrics["eval/percent_correct"] == 0.5
    assert [metrics[f"eval/percent_correct_L{n}"] for n in range(1, 11)] == [1.0] * 5 + [0.0] * 5
    assert run.temperature == 0.6
    assert len(run.samples) == 30


def test_process_end_to_end_writes_jsonl_and_html(tmp_path):
    run = process_through_cli(
        LetterCounting, letter_counting.demo_responder, tmp_path / "letters.jsonl"
    )
    groups = run.groups
    assert len(groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    assert all(g["messages"][0][0]["role"] == "user" for g in groups)  # no system prompt
    assert "answer" in run.page
    env_metrics = run.metrics["env"]
    assert env_metrics["curriculum/difficulty_level"] == 3
    assert env_metrics["train/percent_correct"] == 0.5


def test_dropped_groups_are_counted_under_their_reason(tmp_path):
    calls: dict[str, int] = {}

    def responder(prompt: str) -> str:  # even-length strings: always right (too easy)
        text, _ = truth(prompt)
        calls[prompt] = calls.get(prompt, 0) + 1
        return answer(prompt, right=len(text) % 2 == 0 or calls[prompt] % 2 == 1)

    run = process_through_cli(LetterCounting, responder, tmp_path / "letters.jsonl", steps=4)
    dropped = run.metrics["dropped"]
    assert dropped.get("too_easy", 0) > 0 and "by_env" not in dropped
    assert len(run.groups) == 4 and all(sorted(g["scores"]) == [0.0, 1.0] for g in run.groups)


def test_demo_responder_alternates_and_ignores_other_prompts():
    prompt = question("strawberry", ["r", "z"])
    answers = [letter_counting.demo_responder(prompt) or "" for _ in range(2)]
    assert sorted(score_answer(a, {"r": 3, "z": 0}) for a in answers) == [0.0, 1.0]
    assert letter_counting.demo_responder("What is 2 + 2?") is None


def test_defaults_and_registration():
    config, [server] = env_defaults(LetterCounting)
    assert isinstance(config, LetterCountingConfig)
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert (config.starting_difficulty_level, config.difficulty_window_size) == (3, 150)
    assert (config.difficulty_increase_threshold, config.difficulty_decrease_threshold) == (
        0.8,
        0.2,
    )
    assert "letter_counting" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("letter_counting") is LetterCounting
