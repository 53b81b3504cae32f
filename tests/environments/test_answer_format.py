"""The `answer_format` environment: each format's reader on hand-made answers, the score's two
terms, items and settings, metrics per format, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import json
from functools import partial

import pytest
from pydantic import ValidationError

from atropos.environments import answer_format
from atropos.environments.answer_format import (
    FORMATS,
    AnswerFormat,
    AnswerFormatConfig,
    read_answer,
    same_answer,
)

from .helpers import (
    env_defaults,
    evaluate_against,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>Let me recall it.</think>\n"

# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, AnswerFormat)


def item(fmt: str, answer: str = "Paris", key: str = "q7") -> dict:
    return {"id": key, "question": "Capital of France?", "answer": answer, "aliases": [],
            "format": fmt}  # fmt: skip


# ----- the formats ----------------------------------------------------------------------------


def test_there_are_at_least_ten_formats():
    assert len(FORMATS) >= 10 and all(name == f.name for name, f in FORMATS.items())


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("answer", ["Paris", "42", "William Shakespeare", "1,000", "3.5"])
def test_every_format_reads_what_it_writes(name, answer):
    fmt = FORMATS[name]
    written = fmt.write(answer, "q7")
    assert fmt.read(written, "q7") == answer
    assert fmt.read(answer, "q7") is None  # a bare answer follows no format
    assert "{key}" not in fmt.ask("q7")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("answer_tags", "It is <answer>Paris</answer>.", "Paris"),
        ("answer_tags", "<answer>Paris</answer> <answer>Lyon</answer>", None),  # twice
        ("answer_tags", "<answer>Paris", None),  # unclosed
        ("answer_tags", "<answer> </answer>", None),  # empty
        ("answer_tags", "<answer>Par\nis</answer>", None),  # two lines
        ("boxed", "So \\boxed{Paris}.", "Paris"),
        ("boxed", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("boxed", "\\boxed{Paris} or \\boxed{Lyon}", None),
        ("boxed", "\\boxed{Paris", None),
        ("double_brackets", "Answer: [[Paris]]", "Paris"),
        ("double_brackets", "[[Paris]] [[Lyon]]", None),
        ("final_answer_line", "I think so.\nFinal answer: Paris", "Paris"),
        ("final_answer_line", "Final answer: Paris\nDone.", None),  # not the last line
        ("final_answer_line", "Final answer: Lyon\nFinal answer: Paris", None),  # twice
        ("final_answer_line", "final answer: Paris", None),  # case
        ("markdown_section", "## Reasoning\nIt is.\n## Answer\nParis", "Paris"),
        ("markdown_section", "## Answer\nParis\nMore.", None),  # two lines under it
        ("markdown_section", "# Answer\nParis", None),
        ("json", '{"answer": "Paris"}', "Paris"),
        ("json", '{"answer": 3.5}', "3.5"),
        ("json", '```json\n{"answer": "Paris"}\n```', None),  # fenced: not the whole reply
        ("json", '{"answer": "Paris", "why": "known"}', None),  # another key
        ("json", '{"answer": true}', None),
        ("json", '{"answer": ["Paris"]}', None),
        ("json", "{'answer': 'Paris'}", None),  # not JSON
        ("yaml", "answer: Paris", "Paris"),
        ("yaml", 'answer: "Paris"', "Paris"),
        ("yaml", "answer: yes", "yes"),  # YAML's true, read as written
        ("yaml", "answer:\n  - Paris", None),
        ("yaml", '{"answer": "Paris"}', None),  # flow style
        ("yaml", "Answer: Paris", None),
        ("code_block", "```\nParis\n```", "Paris"),
        ("code_block", "```text\nParis\n```", "Paris"),
        ("code_block", "The answer:\n```\nParis\n```", None),
        ("code_block", "```\nParis\nLyon\n```", None),
        ("bullet_list", "- Reasoning: known.\n- Answer: Paris\n- Confidence: high", "Paris"),
        ("bullet_list", "- Answer: Paris\n- Reasoning: known.\n- Confidence: high", None),
        ("bullet_list", "- Reasoning: known.\n- Answer: Paris\n- Confidence: sure", None),
        ("bullet_list", "* Reasoning: a\n* Answer: Paris\n* Confidence: low", None),
        ("xml_attributes", '<answer id="q7" value="Paris"/>', "Paris"),
        ("xml_attributes", '<answer value="Paris" id="q7"></answer>', "Paris"),
        ("xml_attributes", '<answer id="q8" value="Paris"/>', None),  # another id
        ("xml_attributes", "<answer id='q7'>Paris</answer>", None),  # text, not an attribute
        ("xml_attributes", '<answer id="q7" value="Paris" note="x"/>', None),
        ("xml_attributes", '<!DOCTYPE a><answer id="q7" value="Paris"/>', None),
        ("csv_row", "id,answer\nq7,Paris", "Paris"),
        ("csv_row", 'id,answer\nq7,"1,000"', "1,000"),
        ("csv_row", "id,answer\nq7,1,000", None),  # three cells
        ("csv_row", "answer,id\nParis,q7", None),
        ("csv_row", "q7,Paris", None),
        ("markdown_table", "| id | answer |\n|---|---|\n| q7 | Paris |", "Paris"),
        ("markdown_table", "|id|answer|\n|:---|---:|\n|q7|Paris|", "Paris"),
        ("markdown_table", "| id | answer |\n| q7 | Paris |", None),  # no separator row
        ("markdown_table", "| id | answer |\n|---|---|\n| q7 | Paris |\n| q8 | Lyon |", None),
    ],
)
def test_readers_on_hand_made_answers(name, text, expected):
    assert FORMATS[name].read(text, "q7") == expected


@pytest.mark.parametrize(
    ("found", "gold", "aliases", "same"),
    [
        ("Paris", "Paris", [], True),
        ("  paris. ", "Paris", [], True),
        ('"Paris"', "Paris", [], True),
        ("**Paris**", "Paris", [], True),
        ("1,000", "1000", [], True),
        ("12.50", "12.5", [], True),
        ("carbon  dioxide", "carbon dioxide", [], True),
        ("CO2", "carbon dioxide", ["CO2"], True),
        ("Lyon", "Paris", [], False),
        ("12", "120", [], False),
    ],
)
def test_same_answer(found, gold, aliases, same):
    assert same_answer(found, gold, aliases) is same


# ----- scoring --------------------------------------------------------------------------------


def test_the_score_counts_the_format_and_optionally_the_answer():
    only_format, both = make(), make(answer_weight=1.0)
    json_item = item("json")
    right, wrong = THINK + '{"answer": "Paris"}', THINK + '{"answer": "Lyon"}'
    assert only_format.score(json_item, right) == only_format.score(json_item, wrong) == 1.0
    assert both.score(json_item, right) == 1.0 and both.score(json_item, wrong) == 0.5
    assert both.score(json_item, THINK + "Paris") == 0.0  # right, but not in the format
    answer_only = make(format_weight=0.0, answer_weight=1.0)
    assert answer_only.score(json_item, wrong) == 0.0 and answer_only.score(json_item, right) == 1.0


def test_thinking_mode_decides_what_is_read():
    thinking, plain = make(), make(thinking_mode=False)
    tags = item("answer_tags")
    assert thinking.score(tags, THINK + "<answer>Paris</answer>") == 1.0
    assert thinking.score(tags, "<answer>Paris</answer>") == 0.0  # no think block
    assert thinking.score(tags, "<think>a</think><think>b</think><answer>Paris</answer>") == 0.0
    assert plain.score(tags, "<answer>Paris</answer>") == 1.0
    # the answer inside the think block does not count
    assert read_answer(tags, "<think><answer>Paris</answer></think> Paris", True) is None


def test_settings_are_checked():
    assert make_env(AnswerFormat, formats="json, yaml", validate=True).config.formats == [
        "json",
        "yaml",
    ]
    with pytest.raises(ValidationError, match="unknown format 'jsno'; did you mean 'json'"):
        AnswerFormatConfig(formats="jsno")
    with pytest.raises(ValidationError, match="must be above 0"):
        AnswerFormatConfig(format_weight=0.0, answer_weight=0.0)
    assert AnswerFormatConfig().formats == list(FORMATS)


# ----- items and metrics ----------------------------------------------------------------------


def test_items_draw_their_format_from_the_chosen_ones_reproducibly():
    first, second = make(formats=["json", "csv_row"]), make(formats=["json", "csv_row"])
    for env in (first, second):
        asyncio.run(env.setup())
    drawn = [asyncio.run(first.get_next_item()) for _ in range(40)]
    assert drawn == [asyncio.run(second.get_next_item()) for _ in range(40)]
    assert {d["format"] for d in drawn} == {"json", "csv_row"}
    csv_item = next(d for d in drawn if d["format"] == "csv_row")
    [user] = [m for m in first.prompt(csv_item) if m["role"] == "user"]
    assert user["content"].startswith(csv_item["question"])
    assert f"`{csv_item['id']},<answer>`" in user["content"]
    assert first.prompt(csv_item)[0]["role"] == "system"  # the thinking prompt
    assert make(thinking_mode=False).prompt(csv_item)[0]["role"] == "user"


def test_eval_items_take_every_format_in_turn():
    items = make().load_eval()
    assert len(items) == 24
    assert [i["format"] for i in items[:12]] == list(FORMATS)
    assert all(i["id"].startswith("t") for i in items)


def test_a_dataset_with_other_field_names(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"What is {n} + {n}?", "target": 2 * n} for n in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = make(dataset_name=str(path), question_field="prompt", answer_field="target")
    train, test = env.load(), env.load_eval()
    assert len(train) + len(test) == 20 and len(test) == 1
    assert all(r["question"].startswith("What is") and r["id"].startswith("q") for r in train)
    with pytest.raises(ValueError, match="needs a 'question' and an 'answer'"):
        make(dataset_name=str(path)).load()


def test_metrics_per_format():
    env = make(ensure_scores_are_not_same=False)
    yaml_item = item("yaml")
    texts = [THINK + "answer: Paris", THINK + "answer: Lyon", THINK + "Paris", "answer: Paris"]
    scores = [env.score(yaml_item, t) for t in texts]
    assert scores == [1.0, 1.0, 0.0, 0.0]
    rollouts = [rollout(text=t) for t in texts]
    assert env.score_group(yaml_item, rollouts, scores) == scores
    asyncio.run(env.wandb_log())
    assert env.metrics["train/format_compliance"] == 0.5
    assert env.metrics["train/format_compliance/yaml"] == 0.5
    assert env.metrics["train/answer_accuracy/yaml"] == 0.25
    assert make().score_group(yaml_item, rollouts[:1] * 4, [1.0] * 4) is None  # all equal


# ----- against a fake inference server --------------------------------------------------------


def test_process_end_to_end(tmp_path):
    run = process_through_cli(AnswerFormat, answer_format.demo_responder, tmp_path / "af.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in run.groups)
    env_metrics = run.metrics["env"]
    assert env_metrics["train/format_compliance"] == 0.5
    assert any(k.startswith("train/format_compliance/") for k in env_metrics)


def test_evaluate_reports_compliance_per_format(tmp_path):
    chosen = [FORMATS[name] for name in ("json", "yaml", "boxed")]  # none repeats the id

    def responder(prompt: str) -> str:  # the asked format, always; the answer "unknown"
        return THINK + next(f for f in chosen if f.instruction in prompt).write("unknown", "")

    run = evaluate_against(make, responder, tmp_path, formats=["json", "yaml", "boxed"])
    metrics = run.metrics
    assert metrics["eval/format_compliance"] == 1.0 and metrics["eval/answer_accuracy"] == 0.0
    assert {metrics[f"eval/format_compliance/{n}"] for n in ("json", "yaml", "boxed")} == {1.0}
    assert len(run.samples) == 24 and run.temperature == 0.0


def test_defaults():
    config, _ = env_defaults(AnswerFormat)
    assert (config.formats, config.format_weight, config.answer_weight) == (list(FORMATS), 1, 0)
