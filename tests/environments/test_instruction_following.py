"""The `ifeval` verifiers (each with a passing and a failing case, strict and loose), and the
`instruction_following` environment: data, scoring, group rules, the active-queue curriculum,
checkpoints, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import json
import logging
from functools import partial

import pytest

from atropos.environments import instruction_following
from atropos.environments.common import ifeval
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.common.ifeval.language import SUPPORTED, detects
from atropos.environments.instruction_following import (
    SYSTEM_PROMPT,
    InstructionFollowing,
    InstructionFollowingConfig,
    load_items,
    score_response,
    split_items,
    to_item,
)
from atropos.environments.instruction_following.active_queue import ActiveQueue, item_id
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

# (check, args, a response that follows it, one that does not)
CASES = [
    ("verify_keywords", {"keyword_list": ["tea", "Milk"]}, "Tea with milk.", "Tea, black."),
    ("verify_keywords", {"keyword_list": "tea, milk"}, "tea and MILK", "milk only"),
    ("verify_keyword_frequency", {"word": "cat", "N": 2}, "A cat and a cat.", "A cat, cats."),
    (
        "verify_keyword_frequency",
        {"word": "cat", "N": 2, "quantifier": "at least"},
        "cat cat cat",
        "cat",
    ),
    ("validate_forbidden_words", {"forbidden_words": ["bad"]}, "A badge is fine.", "Bad day."),
    ("verify_letter_frequency", {"letter": "z", "N": 2}, "pizza", "Zoe's pizza"),  # any case
    ("validate_response_language", {"language": "en"}, "This is the answer.", "C'est la vie."),
    ("validate_response_language", {"language": "ja"}, "これは猫です。", "这是一只猫。"),
    ("validate_response_language", {"language": "zh"}, "这是一只猫。", "これは猫です。"),
    ("validate_response_language", {"language": "uk"}, "Це їжак.", "Это ёжик."),
    ("validate_response_language", {"language": "ru"}, "Это ёжик.", "Це їжак."),
    ("validate_word_constraint", {"N": 3, "quantifier": "at least"}, "one two three", "one two"),
    ("validate_word_constraint", {"N": 3, "quantifier": "at most"}, "one - two", "a b c d"),
    ("validate_word_constraint", {"N": 10, "quantifier": "around"}, "w " * 11, "w " * 12),
    ("validate_word_constraint", {"N": 3, "quantifier": "less than"}, "a b", "a b c"),
    ("verify_sentence_constraint", {"N": 2, "quantifier": "at least"}, "Hi. Bye!", "Hi there."),
    (
        "verify_sentence_constraint",
        {"N": 1, "quantifier": "at most"},
        "Mr. Smith went home.",
        "He left. She stayed.",
    ),
    ("verify_paragraph_count", {"N": 2}, "One.\n* * *\nTwo.", "One.\n\nTwo."),
    ("verify_paragraph_count", {"N": 2}, "One.\n***\nTwo.\n", "One.\n* * *\n\n* * *\nTwo."),
    (
        "validate_paragraphs",
        {"N": 2, "first_word": "then", "i": 2},
        "First part.\n\n**Then** the rest.",
        "First part.\n\nAfter that.",
    ),
    ("validate_paragraphs", {"N": 2, "first_word": "then", "i": 2}, "A.\n\nThen.", "Then.\n\nA."),
    ("validate_placeholders", {"N": 2}, "At [place] on [date].", "At [place] on [ ]."),
    ("verify_postscript", {"postscript_marker": "P.S."}, "Hi.\n\np. s. see you", "Hi. P.S."),
    ("verify_postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.P.S more", "Hi.\nP.S. more"),
    ("verify_bullet_points", {"N": 2}, "* a\n- b", "* a\n* b\n* c"),
    ("verify_bullet_points", {"N": 1}, "* a\n* * *\n**bold**", "*a*"),
    ("validate_title", {}, "<<My Title>>\nText", "<< >> and <<\n>>"),
    ("validate_choice", {}, "Hmm. My answer is no.", "Maybe not."),
    ("validate_choice", {"options": "('Yes, I do.', 'No.')"}, "Yes, I do.", "Yes."),
    ("validate_choice", {"options": ["alpha", "beta"]}, "beta", "gamma"),
    ("validate_highlighted_sections", {"N": 2}, "*a* and **b**", "*a* and * *"),
    (
        "validate_sections",
        {"N": 2, "section_splitter": "SECTION"},
        "SECTION 1\na\nSECTION 2\nb",
        "SECTION 1\na\nSection 2\nb",
    ),
    (
        "validate_sections",
        {"N": 2, "section_splitter": "Part", "quantifier": "at least"},
        "Part 1 Part 2 Part 3",
        "Part 1 only",
    ),
    ("validate_json_format", {}, '```json\n{"a": 1}\n```', '{"a": 1} and more'),
    ("validate_repeat_prompt", {"original_prompt": "Say hi."}, "say hi. Hi!", "Hi! Say hi."),
    ("validate_two_responses", {}, "One.\n******\nTwo.", "Same.\n******\nSame."),
    ("validate_two_responses", {}, "One.\n******\nTwo.\n******", "One.\n******\n******\nTwo."),
    ("validate_uppercase", {}, "ALL CAPS, 100%!", "ALL CAPS but one"),
    ("validate_lowercase", {}, "all lower, 100%!", "all lower But one"),
    ("validate_frequency_capital_words", {"N": 2, "quantifier": "at least"}, "GO NOW", "Go NOW"),
    ("validate_frequency_capital_words", {"N": 1, "quantifier": "at most"}, "I go", "I GO"),
    (
        "validate_end",
        {"end_phrase": "Any questions?"},
        "Done. any questions?",
        "Any questions? No.",
    ),
    ("validate_start", {"start_phrase": "Dear team"}, "  Dear team, hi.", "Hi, dear team."),
    ("validate_quotation", {}, '  "Quoted."  ', '"Half quoted.'),
    ("validate_no_commas", {}, "No commas here.", "One, two."),
]


@pytest.mark.parametrize(("name", "args", "good", "bad"), CASES)
def test_each_verifier_passes_and_fails(name, args, good, bad):
    assert ifeval.verify(name, good, args) is True
    assert ifeval.verify(name, bad, args) is False


def test_every_check_has_a_case():
    assert {name for name, *_ in CASES} == set(ifeval.names())
    assert len(ifeval.names()) == 26


def test_blank_responses_follow_nothing():
    assert not ifeval.verify("validate_forbidden_words", "  \n", {"forbidden_words": ["x"]})


def test_null_and_foreign_arguments_are_left_out():
    args = {"N": 2, "quantifier": None, "word": "unused", "language": None}
    assert ifeval.verify("verify_bullet_points", "* a\n* b", args)
    fn = ifeval.get("validate_word_constraint")
    assert ifeval.accepted_args(fn, {"N": 3, "quantifier": None, "x": 1}) == {"N": 3}


def test_validate_reports_unusable_items_up_front():
    ifeval.validate("validate_word_constraint", {"N": "40", "quantifier": "at least"})
    with pytest.raises(ValueError, match="needs quantifier"):
        ifeval.validate("validate_word_constraint", {"N": 40})
    with pytest.raises(ValueError, match="unknown quantifier"):
        ifeval.validate("validate_word_constraint", {"N": 40, "quantifier": "about"})
    with pytest.raises(ValueError, match="cannot be checked offline"):
        ifeval.validate("validate_response_language", {"language": "bg"})
    with pytest.raises(ValueError, match="whole number"):
        ifeval.validate("verify_bullet_points", {"N": "three"})
    with pytest.raises(ifeval.UnknownCheck, match="did you mean verify_keywords"):
        ifeval.validate("verify_keyword", {})
    assert not ifeval.verify("verify_bullet_points", "* a", {"N": "three"})  # never raises


def test_unknown_names_list_the_known_ones_when_nothing_is_close():
    with pytest.raises(ifeval.UnknownCheck, match=r"known: .*validate_no_commas"):
        ifeval.get("zzz")


def test_language_rules():
    assert "fr" in SUPPORTED and "bg" not in SUPPORTED
    assert detects("Der Hund ist nicht hier, und die Katze schläft.", "de")
    assert not detects("Der Hund ist nicht hier, und die Katze schläft.", "nl")
    assert detects("Het is niet waar, maar de hond is bij ons.", "nl")
    assert detects("El perro está muy cansado y también tiene hambre.", "es")
    assert detects("Il cane è molto stanco e anche questo gatto.", "it")
    assert detects("O cão não está em casa, é muito tarde.", "pt")
    assert detects("Mimi ni mwalimu na yeye ni mwanafunzi wa kwanza.", "sw")
    assert detects("هذا كتاب جميل", "ar") and not detects("این کتاب پدر است", "ar")
    assert detects("این کتاب پدر است", "fa")
    assert detects("안녕하세요 세계", "ko") and detects("नमस्ते दुनिया", "hi")
    assert not detects("12345 !!!", "en") and not detects("xyz qrs", "en")  # no evidence


# ----- strict and loose -----------------------------------------------------------------------


def test_loose_forgives_a_preamble_a_sign_off_and_markdown():
    lower = [ifeval.scoring.Instruction("validate_lowercase")]
    preamble = "Sure! Here it is:\nall in lowercase."
    assert ifeval.scoring.follow(preamble, lower) == ifeval.scoring.PromptResult((False,), (True,))
    quoted = [ifeval.scoring.Instruction("validate_quotation")]
    signed = '"A quote."\nHope this helps!'
    assert ifeval.scoring.follow(signed, quoted) == ifeval.scoring.PromptResult((False,), (True,))
    starts = [ifeval.scoring.Instruction("validate_start", {"start_phrase": "Dear team"})]
    bold = "**Dear team**, the release is out."
    assert ifeval.scoring.follow(bold, starts) == ifeval.scoring.PromptResult((False,), (True,))
    assert ifeval.scoring.follow("NOT LOWER\nAT ALL", lower) == ifeval.scoring.PromptResult(
        (False,), (False,)
    )


def test_accuracy_at_prompt_and_instruction_level():
    both = [
        ifeval.scoring.Instruction("validate_lowercase"),
        ifeval.scoring.Instruction("validate_no_commas"),
    ]
    results = [
        ifeval.scoring.follow("all good here", both),  # strict 2/2
        ifeval.scoring.follow("Intro, then:\nlower, with a comma", both),  # strict 0/2, loose 1/2
        ifeval.scoring.follow("Intro:\nall lower no comma", both),  # strict 1/2, loose 2/2
    ]
    assert ifeval.scoring.accuracy(results) == {
        "prompt_level_strict_acc": 1 / 3,
        "inst_level_strict_acc": 3 / 6,
        "prompt_level_loose_acc": 2 / 3,
        "inst_level_loose_acc": 5 / 6,
    }
    assert ifeval.scoring.accuracy([])["prompt_level_loose_acc"] == 0.0


def test_google_ifeval_rows_map_onto_the_checks():
    row = {
        "prompt": "Write about dogs.",
        "instruction_id_list": [
            "length_constraints:number_words",
            "detectable_format:multiple_sections",
            "combination:repeat_prompt",
        ],
        "kwargs": [
            {"num_words": 5, "relation": "less than", "language": None},
            {"section_spliter": "Section", "num_sections": 2},
            {"prompt_to_repeat": "Write about dogs."},
        ],
    }
    instructions = ifeval.scoring.from_ifeval(row)
    assert instructions[0] == ifeval.scoring.Instruction(
        "validate_word_constraint", {"N": 5, "quantifier": "less than"}
    )
    assert instructions[1].args == {"quantifier": "at least", "section_splitter": "Section", "N": 2}
    text = "Write about dogs. Section 1 dogs Section 2 bark Section 3 loud"
    assert ifeval.scoring.follow(text, instructions).strict == (False, True, True)
    assert set(ifeval.scoring.IFEVAL_INSTRUCTIONS) >= {"punctuation:no_comma", "startend:quotation"}
    assert {name for name, _, _ in ifeval.scoring.IFEVAL_INSTRUCTIONS.values()} <= set(
        ifeval.names()
    )
    with pytest.raises(ValueError, match="unknown IFEval instruction"):
        ifeval.scoring.from_ifeval({"instruction_id_list": ["nope:nothing"], "kwargs": [{}]})


# ----- items ----------------------------------------------------------------------------------


def rlvr(prompt: str, **truth: object) -> dict:
    nulls = {"N": None, "quantifier": None, "word": None, "language": None}
    return {
        "messages": [{"role": "user", "content": prompt}],
        "ground_truth": json.dumps({**nulls, **truth}),
    }


def test_rows_become_items_with_only_their_arguments():
    item = to_item(rlvr("Use 3 bullets.", func_name="verify_bullet_points", N=3))
    assert {k: item[k] for k in ("prompt", "func_name", "args")} == {
        "prompt": "Use 3 bullets.",
        "func_name": "verify_bullet_points",
        "args": {"N": 3},
    }
    assert item["id"] == item_id(item) and len(item["id"]) == 16
    as_object = {"prompt": "p", "ground_truth": {"func_name": "validate_title"}}
    assert to_item(as_object)["args"] == {}
    with pytest.raises(ValueError, match="no prompt"):
        to_item({"messages": [], "ground_truth": "{}"})
    with pytest.raises(ValueError, match="not JSON"):
        to_item({"prompt": "p", "ground_truth": "{oops"})
    with pytest.raises(ValueError, match="no func_name"):
        to_item({"prompt": "p", "ground_truth": "{}"})


def test_unknown_checks_are_dropped_counted_and_named(caplog):
    rows = [
        rlvr("a", func_name="validate_lowercase"),
        rlvr("b", func_name="validate_lowercas"),
        rlvr("c", func_name="validate_lowercas"),
        rlvr("d", func_name="validate_response_language", language="bg"),
    ]
    with caplog.at_level(logging.WARNING, logger="atropos.env"):
        items = load_items(rows, "rows.jsonl")
    assert [i["prompt"] for i in items] == ["a"]
    message = caplog.records[-1].getMessage()
    assert "rows.jsonl: dropped 3 of 4 rows" in message
    assert "did you mean validate_lowercase? (x2)" in message
    assert "'bg' cannot be checked offline" in message


def test_the_fixture_is_rlvr_shaped_and_every_example_follows_its_instruction():
    rows = {
        s: read_jsonl(data_path("instruction_following", f"{s}.jsonl")) for s in ("train", "test")
    }
    assert (len(rows["train"]), len(rows["test"])) == (40, 10)
    used = set()
    for row in rows["train"] + rows["test"]:
        item = to_item(row)
        used.add(item["func_name"])
        example = row["example_response"]
        assert score_response(f"<think>ok</think>{example}", item["func_name"], item["args"]) == 1.0
        assert score_response(example, item["func_name"], item["args"]) == 0.0
    assert used == set(ifeval.names())
    prompts = [{r["messages"][0]["content"] for r in rows[s]} for s in ("train", "test")]
    assert not prompts[0] & prompts[1]


def test_split_items_is_deterministic():
    items = [{"id": str(i)} for i in range(100)]
    train, test = split_items(items, 0.05, 42)
    assert len(test) == 5 and (train, test) == split_items(items, 0.05, 42)
    assert split_items(items[:3], 0.05, 42)[1] and split_items(items[:2], 0.9, 42)[0]


# ----- scoring and group rules ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<think>plan</think>\nall lowercase.", 1.0),
        ("<think>plan</think>\nNot lowercase.", 0.0),
        ("all lowercase.", 0.0),  # no think block
        ("<think>a</think><think>b</think> all lowercase.", 0.0),  # two
        ("<think>never closed. all lowercase.", 0.0),
        ("</think>backwards<think> all lowercase.", 0.0),
        ("<think>plan</think> all lowercase. </think>", 0.0),  # a tag after the answer
        ("<think>plan</think>   ", 0.0),  # nothing after thinking
    ],
)
def test_strict_think_format(completion, score):
    assert score_response(completion, "validate_lowercase", {}) == score


def test_text_after_thinking_is_stripped_before_checking():
    assert score_response('<think>x</think>\n  "quoted"  \n', "validate_quotation", {}) == 1.0


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, InstructionFollowing)


def test_group_rules():
    env = make(max_token_length=100)
    item = env.queue.next()
    mixed = [1.0, 0.0, 1.0, 0.0]
    assert env.score_group(item, [rollout()] * 4, mixed) == mixed
    assert env.score_group(item, [rollout(9)] + [rollout()] * 3, mixed) is None  # < 10 tokens
    assert env.score_group(item, [rollout()] * 4, [1.0, 1.0, 1.0, 0.0]) == [1.0, 1.0, 1.0, 0.0]
    assert env.score_group(item, [rollout()] * 4, [1.0] * 4) is None  # 1.0 > 0.75: skipped
    assert env.score_group(item, [rollout()] * 4, [0.0] * 4) is None  # all equal
    # all correct and kept (ceiling raised): linear penalty above 75% of max_token_length
    lenient = make(max_token_length=100, max_group_average_for_training=1.0)
    lengths = [rollout(n - 5) for n in (70, 75, 90, 100)]
    assert lenient.score_group(item, lengths, [1.0] * 4) == pytest.approx([1.0, 1.0, 0.4, 0.0])
    assert lenient.score_group(item, [rollout()] * 4, [1.0] * 4) is None  # short: all equal


# ----- the active-queue curriculum -------------------------------------------------------------


def items(n: int) -> list[dict]:
    return [{"id": f"i{k}", "prompt": f"p{k}"} for k in range(n)]


def test_the_queue_retires_solved_items_and_refills_when_empty():
    q = ActiveQueue(items(3))
    a, b, c = q.next(), q.next(), q.next()
    assert [a["id"], b["id"], c["id"]] == ["i0", "i1", "i2"]
    assert q.record(a, [1.0, 1.0, 1.0, 0.0], 0.75) is False  # 0.75 is not above 0.75
    assert q.record(b, [1.0] * 4, 0.75) is True
    assert q.record(c, [0.0, 1.0], 0.75, single=True) is True  # one right is enough here
    assert [i["id"] for i in q.active] == ["i0"] and [i["id"] for i in q.solved] == ["i1", "i2"]
    assert q.attempts == {"i0": 1, "i1": 1, "i2": 1}
    assert q.record(q.next(), [1.0, 1.0, 1.0, 0.95 * 4 - 3], 1.0)  # mean 0.9875 >= 0.9
    assert not q.active and len(q.solved) == 3
    again = q.next()  # empty: refilled from the solved items, attempts restart
    assert again["id"] == "i1" and q.attempts == {"i1": 1} and len(q.active) == 2
    assert q.metrics() == {
        "curriculum/active_items": 2,
        "curriculum/solved_items": 0,
        "curriculum/total_items": 2,
        "curriculum/percent_solved": 0.0,
    }


def test_the_queue_serves_duplicates_when_everything_is_in_flight():
    q = ActiveQueue(items(2))
    first, second, extra = q.next(), q.next(), q.next()
    assert extra["id"] in {"i0", "i1"}
    q.record(first, [0.0], 0.75)
    q.record(extra, [0.0], 0.75)
    q.record(second, [0.0], 0.75)
    assert sorted(i["id"] for i in q.active) == ["i0", "i1"]  # each placed once


def test_the_queue_checkpoint_round_trip():
    q = ActiveQueue(items(4))
    first = q.next()
    q.record(first, [1.0], 0.75)
    q.next()  # i1 in flight when the checkpoint is taken
    state = json.loads(json.dumps(q.state()))
    fresh = ActiveQueue(items(4))
    fresh.restore({**state, "active": [*state["active"], "gone"]})
    assert [i["id"] for i in fresh.active] == ["i2", "i3", "i1"]  # in flight: back in the queue
    assert [i["id"] for i in fresh.solved] == ["i0"] and fresh.attempts == {"i0": 1, "i1": 1}


def test_the_env_curriculum_moves_and_is_checkpointed(tmp_path):
    env = make()
    asyncio.run(env.setup())
    total = env.queue.total
    assert total == 40
    first = asyncio.run(env.get_next_item())
    env.score_group(first, [rollout()] * 4, [1.0] * 4)  # solved: retired
    second = asyncio.run(env.get_next_item())
    env.score_group(second, [rollout()] * 4, [0.0, 1.0, 0.0, 0.0])  # back of the queue
    assert env.queue.solved == [first] and env.queue.active[-1] == second
    asyncio.run(env.wandb_log())
    assert env.metrics["curriculum/solved_items"] == 1
    assert env.metrics["curriculum/percent_solved"] == 1 / 40
    assert env.metrics["train/percent_correct"] == 5 / 8
    env.checkpoint_dir = str(tmp_path)
    env.save_checkpoint(10)
    fresh = make()
    fresh.checkpoint_dir, fresh.curr_step = str(tmp_path), 10
    fresh.load_checkpoint()
    assert fresh.queue.solved == [first] and fresh.queue.active[-1] == second
    assert fresh.iter == 2 and fresh.queue.attempts == env.queue.attempts


def test_a_failed_rollout_puts_its_item_back(monkeypatch):
    env = make()
    asyncio.run(env.setup())
    item = asyncio.run(env.get_next_item())

    async def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("the inference server is down")

    monkeypatch.setattr(env, "generate", unreachable)
    with pytest.raises(ConnectionError):
        asyncio.run(env.collect_trajectories(item))
    assert env.queue.active[0] == item and len(env.queue.active) == 40


# ----- the hub ----------------------------------------------------------------------------------


def test_the_hub_dataset_is_split_and_filtered(monkeypatch, caplog):
    rows = [rlvr(f"prompt {k}", func_name="validate_no_commas") for k in range(40)]
    rows.append(rlvr("broken", func_name="no_such_check"))
    calls = fake_hub(monkeypatch, rows)
    env = make(dataset_name="allenai/RLVR-IFeval")
    with caplog.at_level(logging.WARNING, logger="atropos.env"):
        train, test = env.load(), env.load_eval()
    assert calls == [("allenai/RLVR-IFeval", None, "train")]  # loaded once for both splits
    assert (len(train), len(test)) == (38, 2)
    assert not {i["id"] for i in train} & {i["id"] for i in test}
    assert "dropped 1 of 41 rows: no instruction check named 'no_such_check'" in caplog.text


# ----- against a fake inference server ----------------------------------------------------------


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, instruction_following.demo_responder)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_evaluate_scores_the_held_out_items(tmp_path):
    examples = {
        r["messages"][0]["content"]: r["example_response"]
        for r in read_jsonl(data_path("instruction_following", "test.jsonl"))
    }
    count = []

    def responder(prompt: str) -> str:
        count.append(1)
        example = next(v for k, v in examples.items() if k in prompt)
        return f"<think>ok</think>{example}" if len(count) % 2 else example

    run = evaluate_against(make, responder, tmp_path)
    assert run.metrics == {"eval/percent_correct": 0.5} and len(count) == 10
    assert run.temperature == 0.2


def test_process_end_to_end_writes_jsonl_and_html(tmp_path):
    run = process_through_cli(
        InstructionFollowing, instruction_following.demo_responder, tmp_path / "if.jsonl"
    )
    groups = run.groups
    assert len(groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    assert groups[0]["messages"][0][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert "think" in run.page
    env_metrics = run.metrics["env"]
    assert env_metrics["train/percent_correct"] == 0.5
    assert env_metrics["curriculum/solved_items"] == 0


def test_defaults_and_registration():
    config, [server] = env_defaults(InstructionFollowing)
    assert isinstance(config, InstructionFollowingConfig)
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert (config.max_group_average_for_training, config.test_set_ratio) == (0.75, 0.05)
    assert config.dataset_name is None and not config.solve_on_single_correct
    assert "instruction_following" in registry.names(), "run `pip install -e .`"
    assert registry.get("instruction_following") is InstructionFollowing
