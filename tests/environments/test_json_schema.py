"""The `json_schema` environment: the shipped models and examples, error introduction, the
reward on hand-made answers (validation, partial credit, kept values), items and settings,
and runs against the fake inference server."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from functools import partial

import pytest
from pydantic import ValidationError

from atropos.environments import json_schema
from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.json_schema import (
    SCHEMAS,
    JsonSchema,
    JsonSchemaConfig,
    available_schemas,
    schema_text,
)
from atropos.environments.json_schema.checks import Verdict, json_text, judge, kept_share
from atropos.environments.json_schema.corrupt import KINDS, corrupt, related

from .helpers import (
    env_defaults,
    evaluate_against,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>Field by field.</think>\n"
ROWS = read_jsonl(data_path("json_schema", "train.jsonl"))
TEST_ROWS = read_jsonl(data_path("json_schema", "test.jsonl"))
CARD = {"name": "Ada", "email": "ada@example.org", "tags": ["math"]}

# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, JsonSchema)


def answer(data: object) -> str:
    return f"{THINK}<json_output>\n{json.dumps(data)}\n</json_output>"


def card_item(task: str = "generate", **extra: object) -> dict:
    return {"id": "c1", "schema": "ContactCard", "request": "a card", "example": CARD,
            "task": task, **extra}  # fmt: skip


# ----- the shipped models and data ------------------------------------------------------------


def test_the_shipped_models_have_varied_shapes():
    schemas = [m.model_json_schema() for m in SCHEMAS.values()]
    text = json.dumps(schemas)
    assert len(SCHEMAS) >= 8
    features = ["$defs", "enum", '"null"', "pattern", "minimum", "minItems", "maxLength", '"date"']
    for feature in features:  # nested, enums, optional fields, constraints, dates
        assert feature in text, feature
    assert all(s.get("additionalProperties") is False for s in schemas)


def test_every_example_is_valid_and_every_model_is_used():
    for row in ROWS + TEST_ROWS:
        SCHEMAS[row["schema"]].model_validate_json(json.dumps(row["example"]))
    assert {r["schema"] for r in ROWS} == {r["schema"] for r in TEST_ROWS} == set(SCHEMAS)
    assert not {r["request"] for r in ROWS} & {r["request"] for r in TEST_ROWS}


def test_the_prompt_schema_leaves_out_generated_titles_but_not_fields_named_title():
    book = json.loads(schema_text(SCHEMAS["Book"]))
    assert "title" in book["properties"] and "title" not in book["properties"]["title"]
    assert "title" not in book and "title" not in book["$defs"]["Author"]


# ----- error introduction ---------------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_corruption_makes_distinct_mistakes_that_break_validation(row):
    model = SCHEMAS[row["schema"]]
    for seed in range(5):
        broken = corrupt(model, row["example"], random.Random(seed), count=3)
        assert judge(model, json.dumps(broken.data)).valid is False
        assert 1 <= len(broken.mistakes) <= 3
        paths = [m.path for m in broken.mistakes]
        assert not any(related(a, b) for i, a in enumerate(paths) for b in paths[i + 1 :])
        again = corrupt(model, row["example"], random.Random(seed), count=3)
        assert again == broken  # seeded
    assert judge(model, json.dumps(row["example"])).valid  # the row itself is left alone


def at(data, path):
    for key in path:
        data = data[key]
    return data


def test_each_kind_of_mistake_does_what_it_says():
    order = next(r for r in ROWS if r["schema"] == "Order")["example"]
    model = SCHEMAS["Order"]
    for seed in range(10):
        for kind in KINDS:
            corrupted = corrupt(model, order, random.Random(seed), kinds=[kind])
            [mistake], broken = corrupted.mistakes, corrupted.data
            assert mistake.kind == kind
            *parent, last = mistake.path
            if kind == "missing_required":
                assert last in at(order, parent) and last not in at(broken, parent)
            elif kind == "extra_field":
                assert last not in at(order, parent) and at(broken, mistake.path) == "unexpected"
            elif kind == "type_error":
                assert type(at(broken, mistake.path)) is not type(at(order, mistake.path))
            elif kind == "enum_error":
                assert at(broken, mistake.path) not in ("pending", "paid", "shipped", "cancelled")
            else:
                assert at(broken, mistake.path) != at(order, mistake.path)


def test_a_kind_with_nothing_to_break_is_an_error():
    with pytest.raises(ValueError, match="no mistake of enum_error makes this ContactCard"):
        corrupt(SCHEMAS["ContactCard"], CARD, random.Random(0), kinds=["enum_error"])


# ----- reading and judging answers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('<json_output>{"a": 1}</json_output>', '{"a": 1}'),
        ('Here:\n<json_output>\n```json\n{"a": 1}\n```\n</json_output>', '{"a": 1}'),
        ('<json_output>{"a": 1}</json_output><json_output>{}</json_output>', None),
        ('{"a": 1}', None),
        ('<json_output>{"a": 1}', None),
    ],
)
def test_json_text(text, found):
    assert json_text(text) == found


@pytest.mark.parametrize(
    ("data", "verdict"),
    [
        (CARD, Verdict(True, True, 1.0)),
        ({"name": "Ada", "email": "ada@example.org", "phone": None}, Verdict(True, True, 1.0)),
        ({"name": "Ada"}, Verdict(True, False, 0.75)),  # email missing
        ({**CARD, "email": "not an email"}, Verdict(True, False, 0.75)),
        ({**CARD, "name": 7, "tags": "math"}, Verdict(True, False, 0.5)),
        ({**CARD, "nickname": "A"}, Verdict(True, False, 0.8)),  # 4 of 5 keys
        (["Ada"], Verdict(True, False, 0.0)),
    ],
)
def test_judge(data, verdict):
    assert judge(SCHEMAS["ContactCard"], json.dumps(data)) == verdict
    assert judge(SCHEMAS["ContactCard"], "{name: Ada}") == Verdict(False, False, 0.0)


def test_kept_share_counts_only_untouched_values():
    original = {"a": 1, "b": {"c": 2, "d": [3, 4]}, "e": "x"}
    assert kept_share(original, [("a",)], original) == 1.0
    assert kept_share(original, [("a",)], {**original, "a": 9}) == 1.0  # a was broken
    changed = {"a": 1, "b": {"c": 2, "d": [3, 5]}, "e": "y"}
    assert kept_share(original, [("b",)], changed) == 0.5  # a kept, e changed; b's own
    assert kept_share(original, [], changed) == 0.6  # 3 of 5 leaves
    assert kept_share(original, [], "not an object") == 0.0
    assert kept_share({"a": 1}, [("a",)], {}) == 1.0  # nothing left to keep


# ----- scoring --------------------------------------------------------------------------------


def test_generate_scores_validation_with_optional_partial_credit():
    strict, partial_env = make(), make(partial_credit=0.5)
    item = card_item()
    assert strict.score(item, answer(CARD)) == 1.0
    assert strict.score(item, answer({"name": "Ada"})) == 0.0
    assert partial_env.score(item, answer({"name": "Ada"})) == 0.375  # 0.5 x 3/4 fields
    assert partial_env.score(item, f"{THINK}<json_output>nope</json_output>") == 0.0
    assert strict.score(item, f"<json_output>{json.dumps(CARD)}</json_output>") == 0.0  # think
    plain = make(thinking_mode=False)
    assert plain.score(item, f"<json_output>{json.dumps(CARD)}</json_output>") == 1.0


def test_a_fix_is_scored_by_validity_and_what_it_kept():
    env = make()
    mistakes = [{"kind": "type_error", "path": ["name"]}]
    item = card_item("fix", broken={**CARD, "name": 7}, mistakes=mistakes)
    assert env.score(item, answer(CARD)) == 1.0
    assert env.score(item, answer({**CARD, "name": "Ada Lovelace"})) == 1.0  # name was broken
    rewritten = {"name": "Bob", "email": "bob@example.org", "tags": ["x"]}
    assert env.score(item, answer(rewritten)) == 0.5  # valid, nothing kept
    assert env.score(item, answer({**CARD, "tags": []})) == 0.75  # email kept, tag lost
    assert env.score(item, answer(item["broken"])) == 0.0  # not fixed
    assert make(keep_weight=0.0).score(item, answer(rewritten)) == 1.0


# ----- settings and items ---------------------------------------------------------------------


def test_settings_are_checked():
    config = JsonSchemaConfig(schemas="Order, Book", error_types="enum_error")
    assert (config.schemas, config.error_types) == (["Order", "Book"], ["enum_error"])
    assert JsonSchemaConfig().schemas == list(SCHEMAS)
    with pytest.raises(ValidationError, match="unknown schema 'Ordr'; did you mean 'Order'"):
        JsonSchemaConfig(schemas="Ordr")
    with pytest.raises(ValidationError, match="unknown error type 'typo_error'"):
        JsonSchemaConfig(error_types=["typo_error"])


def test_a_users_own_models(tmp_path, monkeypatch):
    (tmp_path / "my_schemas.py").write_text(
        "from pydantic import BaseModel\n"
        "class Point(BaseModel):\n    x: int\n    y: int\n"
        "SCHEMAS = {'Point': Point}\n"
    )
    (tmp_path / "not_schemas.py").write_text("SCHEMAS = {'x': 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(available_schemas("my_schemas")) == {*SCHEMAS, "Point"}
    assert JsonSchemaConfig(schema_module="my_schemas", schemas="Point").schemas == ["Point"]
    with pytest.raises(ValueError, match="not_schemas needs a SCHEMAS dict"):
        available_schemas("not_schemas")
    rows = tmp_path / "points.jsonl"
    points = [
        {"schema": "Point", "request": f"point {n}", "example": {"x": n, "y": 1}} for n in range(8)
    ]
    rows.write_text("".join(json.dumps(p) + "\n" for p in points))
    env = make(dataset_name=str(rows), schema_module="my_schemas", schemas=["Point"])
    assert len(env.load()) == 7 and env.load()[0]["id"].startswith(str(rows))
    sys.modules.pop("my_schemas", None)


def test_a_row_with_an_invalid_example_is_named(tmp_path):
    rows = tmp_path / "bad.jsonl"
    rows.write_text(
        3 * (json.dumps({"schema": "ContactCard", "request": "r", "example": {}}) + "\n")
    )
    with pytest.raises(ValueError, match=r"bad\.jsonl test row 0: its example is not a valid Con"):
        make(dataset_name=str(rows)).load_split("test")


@pytest.mark.parametrize(("task", "fixes"), [("generate", 0), ("fix", 40), ("mixed", None)])
def test_tasks_are_drawn_as_configured_and_reproducibly(task, fixes):
    first, second = make(task=task), make(task=task)
    for env in (first, second):
        asyncio.run(env.setup())
    drawn = [asyncio.run(first.get_next_item()) for _ in range(40)]
    assert drawn == [asyncio.run(second.get_next_item()) for _ in range(40)]
    count = sum(d["task"] == "fix" for d in drawn)
    assert count == fixes if fixes is not None else 10 < count < 30
    for d in drawn:
        if d["task"] == "fix":
            assert not judge(SCHEMAS[d["schema"]], json.dumps(d["broken"])).valid
            assert 1 <= len(d["mistakes"]) <= 2
            [user] = [m for m in first.prompt(d) if m["role"] == "user"]
            assert json.dumps(d["broken"], indent=2, ensure_ascii=False) in user["content"]


def test_eval_items_are_each_test_row_twice():
    items = make().load_eval()
    assert len(items) == 2 * len(TEST_ROWS)
    assert [i["task"] for i in items[:2]] == ["generate", "fix"]
    assert items == make().load_eval()
    assert len(make(schemas=["Order"]).load_eval()) == 2


def test_metrics():
    env = make(ensure_scores_are_not_same=False)
    mistakes = [{"kind": "type_error", "path": ["name"]}]
    item = card_item("fix", broken={**CARD, "name": 7}, mistakes=mistakes)
    texts = [answer(CARD), answer({**CARD, "tags": []}), answer({"name": 1}), "no json"]
    scores = [env.score(item, t) for t in texts]
    assert scores == [1.0, 0.75, 0.0, 0.0]
    assert env.score_group(item, [rollout(text=t) for t in texts], scores) == scores
    asyncio.run(env.wandb_log())
    m = env.metrics
    assert m["train/valid_rate"] == m["train/valid_rate/fix"] == 0.5
    assert m["train/valid_rate/ContactCard"] == 0.5
    assert (m["train/kept_share"], m["errors/no_json_rate"]) == (0.75, 0.25)


# ----- against a fake inference server --------------------------------------------------------


def test_process_end_to_end(tmp_path):
    run = process_through_cli(JsonSchema, json_schema.demo_responder, tmp_path / "js.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in run.groups)
    assert run.metrics["env"]["train/valid_rate"] == 0.5


def test_evaluate_reports_valid_rates(tmp_path):
    run = evaluate_against(make, json_schema.demo_responder, tmp_path)
    metrics = run.metrics
    assert metrics["eval/valid_rate"] == 0.5 and metrics["eval/no_json_rate"] == 0.0
    assert {"eval/valid_rate/fix", "eval/valid_rate/generate", "eval/valid_rate/Order"} <= set(
        metrics
    )
    assert len(run.samples) == 16 and run.temperature == 0.0


def test_defaults():
    config, _ = env_defaults(JsonSchema)
    assert (config.task, config.partial_credit, config.max_errors) == ("mixed", 0.0, 2)
