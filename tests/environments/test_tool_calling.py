"""The `tool_calling` environment: parsing, matching, scoring, group rules, data, and runs
against the fake inference server."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from functools import partial

import pytest

from atropos.environments import tool_calling
from atropos.environments.common.data_loading import HubUnavailable
from atropos.environments.common.tool_calls import (
    ParsedCalls,
    count_matched,
    matches,
    parse_completion,
    parse_openai,
    parse_text,
    score_calls,
)
from atropos.environments.tool_calling import (
    SYSTEM_PREAMBLE,
    ToolCalling,
    ToolCallingConfig,
    load_rows,
    score_item,
    score_message,
    split_rows,
    to_item,
)
from atropos.envs import registry
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_with_runner,
    rollout,
)


def block(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def as_block(c: dict) -> str:
    return block(c["name"], **c["arguments"])


def call(name: str, **arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


WEATHER = call("get_weather", city="Oslo", unit="celsius")
TIME = call("get_time", timezone="Europe/Oslo")
ITEM = {"system": "", "request": "Weather and time in Oslo?", "expected": [WEATHER, TIME]}


# ----- parsing ---------------------------------------------------------------------------------


def test_hermes_blocks_are_read_and_bad_ones_counted_not_raised():
    text = (
        "Sure.\n<tool_call>\n"
        + json.dumps(WEATHER)
        + "\n</tool_call>\n<tool_call>{'name': 'f'}</tool_call>"  # not JSON
        + '<tool_call>{"arguments": {}}</tool_call>'  # no name
        + '<tool_call>{"name": "f", "arguments": [1]}</tool_call>'  # arguments not an object
        + "<tool_call>"  # never closed
    )
    parsed = parse_text(text)
    assert parsed.calls == [WEATHER] and parsed.malformed == 4


def test_no_tool_call_at_all_is_no_calls():
    assert parse_text("It is sunny in Oslo.") == ParsedCalls([], 0)
    assert score_item(ITEM, "It is sunny in Oslo.") == -1.0
    assert score_item(ITEM, "It is sunny in Oslo.", partial=True) == -1.0


def test_blocks_inside_thinking_are_not_calls():
    text = "<think>maybe " + block("get_time", timezone="UTC") + "?</think>" + as_block(WEATHER)
    assert parse_text(text).calls == [WEATHER]


def test_arguments_as_a_json_string_are_decoded():
    text = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>'
    assert parse_text(text).calls == [call("get_weather", city="Oslo")]
    assert parse_text('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>').malformed == 1


def openai_calls(*calls: dict) -> list[dict]:
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for i, c in enumerate(calls)
    ]


def test_openai_tool_calls_with_json_string_arguments():
    message = {"role": "assistant", "content": None, "tool_calls": openai_calls(TIME, WEATHER)}
    assert score_message(ITEM, message) == 1.0
    assert score_item(ITEM, json.dumps(message)) == 1.0  # a serialized reply, as completion text
    message["tool_calls"][0]["function"]["arguments"] = "{not json"
    assert parse_openai(message["tool_calls"]).malformed == 1
    assert score_message(ITEM, message) == -1.0
    assert score_message(ITEM, message, partial=True) == pytest.approx(2 * 1 / 3 - 1)


def test_openai_calls_and_content_blocks_both_count():
    message = {"content": as_block(WEATHER), "tool_calls": openai_calls(TIME)}
    assert score_message(ITEM, message) == 1.0
    assert parse_completion('{"tool_calls": "broken"').calls == []  # not JSON: text rules


# ----- matching --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        (as_block(WEATHER) + as_block(TIME), 1.0),  # exact
        (as_block(TIME) + "\n" + as_block(WEATHER), 1.0),  # parallel calls in another order
        (as_block(WEATHER), -1.0),  # a missing call
        (as_block(WEATHER) + as_block(TIME) + block("get_time", timezone="UTC"), -1.0),  # extra
        (as_block(WEATHER) + as_block(WEATHER), -1.0),  # one call cannot match twice
        (as_block(WEATHER) + as_block(TIME) + "<tool_call>{bad</tool_call>", -1.0),  # malformed
        (
            block("get_weather", city="Oslo", unit="celsius", days=3) + as_block(TIME),
            1.0,
        ),  # extra key
        (block("get_weather", city="Oslo") + as_block(TIME), -1.0),  # a missing argument
        (block("get_weather", city="oslo", unit="celsius") + as_block(TIME), -1.0),  # wrong value
        (block("weather", city="Oslo", unit="celsius") + as_block(TIME), -1.0),  # wrong name
    ],
)
def test_structural_match_is_order_insensitive_and_one_to_one(answer, score):
    assert score_item(ITEM, answer) == score


def test_extra_top_level_keys_are_allowed_but_expected_ones_are_required():
    assert matches(WEATHER, {**WEATHER, "id": "call_1"})
    assert not matches({**WEATHER, "id": "call_1"}, WEATHER)
    assert not matches(WEATHER, {"name": "get_weather", "arguments": "Oslo"})


def test_argument_types_must_match_unless_lenient():
    expected = [call("get_forecast", city="Oslo", days=3)]
    as_string = block("get_forecast", city="Oslo", days="3")
    assert score_calls(expected, parse_text(as_string)) == -1.0
    assert score_calls(expected, parse_text(as_string), lenient=True) == 1.0
    assert score_calls(expected, parse_text(block("get_forecast", city="Oslo", days=3.0))) == 1.0
    flag = [call("play", shuffle=True)]
    assert score_calls(flag, parse_text(block("play", shuffle=1))) == -1.0
    assert score_calls(flag, parse_text(block("play", shuffle="true")), lenient=True) == 1.0
    assert score_calls(flag, parse_text(block("play", shuffle="yes")), lenient=True) == -1.0


def test_nested_arguments_match_exactly_below_the_first_level():
    expected = [call("book", route={"from": "LHR", "to": "JFK"}, pax={"adults": 2, "kids": [1]})]
    same = block("book", pax={"kids": [1], "adults": 2}, route={"to": "JFK", "from": "LHR"})
    assert score_calls(expected, parse_text(same)) == 1.0
    extra_inner = block(
        "book", route={"from": "LHR", "to": "JFK", "via": "DUB"}, pax={"adults": 2, "kids": [1]}
    )
    assert score_calls(expected, parse_text(extra_inner)) == -1.0
    inner_type = block("book", route={"from": "LHR", "to": "JFK"}, pax={"adults": "2", "kids": [1]})
    assert score_calls(expected, parse_text(inner_type)) == -1.0
    list_order = block(
        "book", route={"from": "LHR", "to": "JFK"}, pax={"adults": 2, "kids": [1, 0]}
    )
    assert score_calls(expected, parse_text(list_order)) == -1.0


def test_matching_is_a_maximum_matching_not_greedy():
    loose, strict = call("f", a=1), call("f", a=1, b=2)
    # greedy would pair the first call with `loose` and leave `strict` unmatched
    assert count_matched([loose, strict], [call("f", a=1, b=2), call("f", a=1)]) == 2


@pytest.mark.parametrize(
    ("answer", "partial"),
    [
        (as_block(WEATHER) + as_block(TIME), 1.0),  # k=2 of E=2, X=0
        (as_block(WEATHER), 0.0),  # k=1, E=2, X=0: 2*1/2-1
        (as_block(WEATHER) + block("f"), -1 / 3),  # k=1, E=2, X=1: 2*1/3-1
        (as_block(WEATHER) + as_block(TIME) + block("f"), 1 / 3),  # k=2, X=1: 2*2/3-1
        (as_block(WEATHER) + as_block(TIME) + "<tool_call>{</tool_call>", 1 / 3),  # malformed: X
        (block("f") + block("g"), -1.0),  # nothing matched
        ("no calls", -1.0),
    ],
)
def test_partial_credit_values(answer, partial):
    assert score_item(ITEM, answer, partial=True) == pytest.approx(partial)
    assert score_item(ITEM, answer) == (1.0 if partial == 1.0 else -1.0)


# ----- data ------------------------------------------------------------------------------------


def row(system: str, human: str, gpt: str) -> dict:
    turns = [("system", system), ("human", human), ("gpt", gpt)]
    return {"conversations": [{"from": f, "value": v} for f, v in turns if v is not None]}


def test_rows_become_items_and_bad_rows_are_named():
    item = to_item(row("<tools>[]</tools>", "Weather in Oslo?", as_block(WEATHER)), "r1")
    assert item == {
        "system": "<tools>[]</tools>",
        "request": "Weather in Oslo?",
        "expected": [WEATHER],
    }
    openai_style = {
        "conversations": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": as_block(TIME)},
        ]
    }
    assert to_item(openai_style, "r2")["expected"] == [TIME]
    with pytest.raises(ValueError, match="r3: no 'human' turn"):
        to_item(row("s", None, as_block(TIME)), "r3")
    with pytest.raises(ValueError, match="r4: no 'gpt' turn"):
        to_item(row("s", "Hi", None), "r4")
    with pytest.raises(ValueError, match="r5: the gpt turn has 1 unreadable"):
        to_item(row("s", "Hi", "<tool_call>{</tool_call>"), "r5")
    with pytest.raises(ValueError, match="r6: expected a 'conversations' list"):
        to_item({"messages": []}, "r6")


def test_the_shipped_fixture_has_single_and_parallel_calls_and_disjoint_splits():
    train, test = load_rows("train"), load_rows("test")
    assert len(train) == 40 and len(test) == 15
    assert not {i["request"] for i in train} & {i["request"] for i in test}
    for items in (train, test):
        counts = [len(i["expected"]) for i in items]
        assert min(counts) == 1 and max(counts) == 3 and sum(c > 1 for c in counts) >= 5
        for item in items:
            assert "<tools>" in item["system"]
            offered = {json.loads(line)["function"]["name"] for line in _tool_lines(item["system"])}
            assert {c["name"] for c in item["expected"]} <= offered
    with pytest.raises(ValueError, match="split"):
        load_rows("eval")


def _tool_lines(system: str) -> list[str]:
    return system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()


def test_split_rows_is_deterministic_and_disjoint():
    rows = [{"i": i} for i in range(250)]
    train, test = split_rows(rows, 100)
    assert (train, test) == split_rows(list(rows), 100)
    assert len(test) == 100 and len(train) == 150
    assert sorted(r["i"] for r in train + test) == list(range(250))
    assert split_rows(rows, 100, seed=1)[1] != test
    with pytest.raises(ValueError, match="test_size"):
        split_rows(rows[:5], 5)


@pytest.fixture
def fake_datasets(monkeypatch):
    rows = [row("<tools>[]</tools>", f"Request {i}", block("f", i=i)) for i in range(130)]
    return fake_hub(monkeypatch, rows, only="NousResearch/XLAM-Atropos")


def test_the_hub_dataset_is_split_like_upstream(fake_datasets):
    name = "NousResearch/XLAM-Atropos"
    train, test = load_rows("train", name), load_rows("test", name)
    assert fake_datasets == [(name, "default", "train")] * 2
    assert len(test) == 100 and len(train) == 30
    assert not {i["request"] for i in train} & {i["request"] for i in test}
    assert test == load_rows("test", name)
    assert len(load_rows("test", name, test_size=10)) == 10
    with pytest.raises(ValueError, match="XLAM-Atropos has 130 rows: test_size"):
        load_rows("train", name, test_size=130)
    with pytest.raises(HubUnavailable, match="other/name"):
        load_rows("train", "other/name")

    env = make("http://127.0.0.1:9/v1", dataset_name=name)
    assert len(env.load()) == 30 and len(env.load_eval()) == 100


# ----- the environment -------------------------------------------------------------------------


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, ToolCalling)


def test_prompt_is_the_preamble_then_the_tools_then_the_request():
    env = make("http://127.0.0.1:9/v1")
    item = load_rows("train")[0]
    system, user = env.prompt(item)
    assert system["role"] == "system" and system["content"].startswith(SYSTEM_PREAMBLE + "\n\n")
    assert system["content"].endswith(item["system"])
    assert user == {"role": "user", "content": item["request"]}


def test_group_rules_drop_or_penalize_like_upstream():
    env = make("http://127.0.0.1:9/v1", max_token_length=100)
    ok = [rollout(20), rollout(40)]
    assert env.score_group({**ITEM, "expected": []}, ok, [1.0, -1.0]) is None  # nothing expected
    assert env.score_group(ITEM, [rollout(9), rollout(40)], [1.0, -1.0]) is None  # < 10 tokens
    assert env.score_group(ITEM, ok, [1.0, -1.0]) == [1.0, -1.0]  # mixed: unchanged
    assert env.score_group(ITEM, [rollout(20), rollout(80)], [1.0, 1.0]) == [1.0, 0.4]  # length
    assert env.score_group(ITEM, ok, [1.0, 1.0]) is None  # all right, both short: all equal
    assert env.score_group(ITEM, ok, [-1.0, -1.0]) is None
    keep = make("http://127.0.0.1:9/v1", ensure_scores_are_not_same=False)
    assert keep.score_group(ITEM, ok, [-1.0, -1.0]) == [-1.0, -1.0]


def test_partial_credit_and_lenient_types_come_from_the_config():
    env = make("http://127.0.0.1:9/v1", partial_credit=True, lenient_types=True)
    item = {**ITEM, "expected": [WEATHER, call("get_forecast", days=3)]}
    assert env.score(item, as_block(WEATHER) + block("get_forecast", days="3")) == 1.0
    assert env.score(item, as_block(WEATHER)) == 0.0
    assert make("http://127.0.0.1:9/v1").score(item, as_block(WEATHER)) == -1.0


def test_train_percent_correct_is_logged_and_reset():
    env = make("http://127.0.0.1:9/v1")
    env.score_group(ITEM, [rollout(20)] * 4, [1.0, -1.0, -1.0, 1.0])
    asyncio.run(env.wandb_log({"x": 1}))
    assert env.metrics == {"x": 1, "train/percent_correct": 0.5}
    asyncio.run(env.wandb_log())
    assert env.metrics["train/percent_correct"] == 0.5  # nothing new: not overwritten


_USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)


class Responder:
    """Answers the fixture's requests, right on every other call: mixed groups."""

    def __init__(self, always_right: bool = False) -> None:
        self.answers = {
            i["request"]: i["expected"] for s in ("train", "test") for i in load_rows(s)
        }
        self.turns = itertools.count()
        self.always_right = always_right

    def __call__(self, prompt: str) -> str:
        expected = self.answers[_USER_TURN.findall(prompt)[-1]]
        if self.always_right or next(self.turns) % 2 == 0:
            return "\n".join(block(c["name"], **c["arguments"]) for c in reversed(expected))
        return block(expected[0]["name"])  # no arguments: wrong


def test_check_env_passes_against_a_vllm_server():
    report = check_against(make, Responder())
    assert report.groups == 3 and report.token_sources == {"server"}


def test_process_writes_jsonl_and_html(tmp_path):
    out = tmp_path / "tool_calling.jsonl"
    with FakeInferenceServer(responder=Responder()) as fake:
        run = process_with_runner(
            make(fake.base_url, total_steps=4, data_path_to_save_groups=str(out))
        )
    assert len(run.groups) == 4
    for group in run.groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
        assert group["messages"][0][0]["content"].startswith(SYSTEM_PREAMBLE)
        assert "<tool_call>" in group["messages"][0][-1]["content"]
    assert "tool_call" in run.page


def test_a_malformed_call_is_invalid_and_scored_as_usual(tmp_path):
    class Malformed(Responder):
        def __call__(self, prompt: str) -> str:
            answer = super().__call__(prompt)  # right on every other call
            bad = answer + "\n<tool_call>{oops</tool_call>"  # an unreadable block too
            return answer if next(self.calls) % 2 == 0 else bad

        calls = itertools.count()

    out = tmp_path / "tool_calling.jsonl"
    with FakeInferenceServer(responder=Malformed()) as fake:
        run = process_with_runner(
            make(fake.base_url, total_steps=1, data_path_to_save_groups=str(out))
        )
    [group] = run.groups
    rows = sorted(zip(group["scores"], group["overrides"], strict=True), key=lambda r: r[0])
    assert rows == [(-1.0, {"outcome": "invalid/malformed_call"})] * 2 + [(1.0, {})] * 2


def test_evaluate_reports_percent_correct_on_the_held_out_split(tmp_path):
    run = evaluate_against(make, Responder(always_right=True), tmp_path, setup=True)
    assert run.metrics == {"eval/percent_correct": 1.0, "eval/mean_score": 1.0}
    assert run.doc["results"]["all"] == run.metrics
    samples = run.samples
    held_out = {i["request"] for i in load_rows("test")}
    assert len(samples) == 15 and {s["messages"][-1]["content"] for s in samples} == held_out


def test_demo_responder_gives_mixed_answers_for_fixture_prompts():
    item = load_rows("test")[3]
    prompt = f"<|im_start|>user\n{item['request']}<|im_end|>"
    answers = [tool_calling.demo_responder(prompt) for _ in range(2)]
    assert sorted(score_item(item, a or "") for a in answers) == [-1.0, 1.0]
    assert tool_calling.demo_responder("What is 2 + 2?") is None


def test_defaults_and_registration():
    config, [server] = env_defaults(ToolCalling)
    assert isinstance(config, ToolCallingConfig) and config.dataset_name is None
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert not config.partial_credit and not config.lenient_types
    assert "tool_calling" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("tool_calling") is ToolCalling
