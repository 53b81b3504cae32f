"""The `gsm8k` environment: fixture, upstream's scoring rules, and runs against a fake server."""

from __future__ import annotations

import inspect
import itertools
import re
import sys
from functools import partial
from pathlib import Path

import pytest

import atropos.environments.gsm8k as gsm8k_module
from atropos.environments.common.data_loading import HubUnavailable, data_path, read_jsonl
from atropos.environments.gsm8k import GSM8K, GSM8KConfig
from atropos.envs import registry
from atropos.envs.layering import resolve_config
from atropos.envs.simple import Rollout
from atropos.install import install_hint
from atropos.rewards.math import gsm8k_gold, parse_gold
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    collect,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
)

TRAIN = read_jsonl(data_path("gsm8k", "train.jsonl"))
TEST = read_jsonl(data_path("gsm8k", "test.jsonl"))
GOLD = {row["question"]: gsm8k_gold(row["answer"]) for row in TRAIN + TEST}


def question_of(prompt: str) -> str:
    return next(q for q in GOLD if q in prompt)


THINKING = "<think>Let me work through it step by step.</think> So it is "


def right(prompt: str) -> str:
    return THINKING + f"\\boxed{{{GOLD[question_of(prompt)]}}}."


def wrong(prompt: str) -> str:
    return THINKING + f"\\boxed{{{GOLD[question_of(prompt)]}1}}."


def alternating() -> object:
    """A responder right on every other choice, so every group has mixed scores."""
    turn = itertools.count()
    return lambda prompt: right(prompt) if next(turn) % 2 == 0 else wrong(prompt)


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, GSM8K)


def rollout(n_tokens: int, trained: int = 20) -> Rollout:
    masks = [-100] * (n_tokens - trained) + [7] * trained
    return Rollout("text", [7] * n_tokens, masks, None, "stop", "server")


# ----- data and scoring ---------------------------------------------------------------------------


def test_the_fixture_is_gsm8k_shaped_and_every_gold_answer_verifies():
    assert (len(TRAIN), len(TEST)) == (40, 20)
    assert not {r["question"] for r in TRAIN} & {r["question"] for r in TEST}
    env = make("http://127.0.0.1:9")
    for row in TRAIN + TEST:
        assert row["answer"].rsplit("\n", 1)[-1].startswith("#### ")
        gold = gsm8k_gold(row["answer"])
        assert parse_gold(gold), row
        assert env.score(row, f"\\boxed{{{gold}}}") == 1.0, row
    assert gsm8k_gold(TRAIN[-1]["answer"]) == "2880"  # "#### 2,880": commas removed


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>48 / 2 = 24</think> The answer is \\boxed{72}.", 1.0),
        ("\\boxed{72}", 1.0),
        ("\\boxed{72.0}", 1.0),
        ("\\boxed{\\$72}", 1.0),
        ("<think>maybe \\boxed{72}</think> \\boxed{71}", -1.0),  # only after the last </think>
        ("<think>it is \\boxed{71}</think> no, \\boxed{72}", 1.0),
        ("The final answer is $72$.", 1.0),  # LaTeX after an anchor is enough
        ("The answer is 72", -1.0),  # plain text: upstream's extraction finds nothing
        ("72", -1.0),
        ("", -1.0),
    ],
)
def test_score_verifies_the_text_after_thinking(completion, expected):
    item = {"question": "q", "answer": "48 + 24 = <<48+24=72>>72\n#### 72"}
    assert make("http://127.0.0.1:9").score(item, completion) == expected


def test_score_group_follows_upstreams_rules():
    env = make("http://127.0.0.1:9", max_token_length=100, ensure_scores_are_not_same=True)
    item = {"question": "q", "answer": "#### 72"}
    mixed = [1.0, -1.0, 1.0, -1.0]
    assert env.score_group(item, [rollout(40)] * 4, mixed) == mixed
    # an unparsable gold drops the group
    assert env.score_group({"question": "q", "answer": "#### "}, [rollout(40)] * 4, mixed) is None
    # one completion under 10 trained tokens drops the group
    assert env.score_group(item, [rollout(40), rollout(40, trained=9)] * 2, mixed) is None
    # all correct: linear penalty above half of max_token_length, down to 0 at it
    lengths = [40, 50, 75, 100]
    penalized = env.score_group(item, [rollout(n) for n in lengths], [1.0] * 4)
    assert penalized == [1.0, 1.0, 0.5, 0.0]
    # still all equal after the penalty: dropped, but only when the config says so
    assert env.score_group(item, [rollout(40)] * 4, [1.0] * 4) is None
    assert env.score_group(item, [rollout(40)] * 4, [-1.0] * 4) is None
    keep = make("http://127.0.0.1:9", ensure_scores_are_not_same=False)
    assert keep.score_group(item, [rollout(40)] * 4, [-1.0] * 4) == [-1.0] * 4


def test_defaults_work_offline_against_the_local_server():
    resolved = resolve_config(GSM8K, "serve")
    config, [server] = resolved.env, resolved.servers
    assert isinstance(config, GSM8KConfig)
    assert (config.group_size, config.max_token_length, config.tokenizer_name) == (8, 2048, "tiny")
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "vllm")
    assert config.dataset_name is None and config.dataset_config == "main"
    assert "\\boxed{" in (GSM8K.system_prompt or "") and GSM8K.seed == 42


def test_the_environment_file_stays_at_most_60_lines():
    assert len(Path(inspect.getfile(gsm8k_module)).read_text().splitlines()) <= 60


def test_is_registered_under_its_name():
    assert "gsm8k" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("gsm8k") is GSM8K


# ----- hub loading ------------------------------------------------------------------------------


def test_the_hub_dataset_is_loaded_when_named(monkeypatch):
    calls = fake_hub(
        monkeypatch,
        lambda name, split: [{"question": f"hub {split} question", "answer": "1 + 1 = 2\n#### 2"}],
    )
    env = make("http://127.0.0.1:9", dataset_name="gsm8k")
    assert env.load()[0]["question"] == "hub train question"
    assert env.load_eval()[0]["question"] == "hub test question"
    assert calls == [("gsm8k", "main", "train"), ("gsm8k", "main", "test")]
    assert make("http://127.0.0.1:9").load() == TRAIN  # unnamed: the fixture, no hub


def test_a_missing_datasets_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(HubUnavailable, match=re.escape(install_hint("hub"))):
        make("http://127.0.0.1:9", dataset_name="gsm8k").load()


# ----- against a fake inference server ------------------------------------------------------------


def test_check_env_and_groups_with_mixed_scores():
    report = check_against(make, alternating())
    assert report.groups == 3 and report.token_sources == {"server"}
    with FakeInferenceServer(responder=alternating()) as fake:
        [(group, _)] = collect(make(fake.base_url), TRAIN[0])
    assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
    assert group["messages"][0][0] == {"role": "system", "content": GSM8K.system_prompt}
    assert len(group["inference_logprobs"]) == 4


def test_a_completion_without_a_boxed_answer_is_invalid_no_answer_and_scored_wrong():
    turn = itertools.count()

    def responder(prompt: str) -> str:
        return right(prompt) if next(turn) % 2 == 0 else THINKING + "I cannot tell."

    with FakeInferenceServer(responder=responder) as fake:
        [(group, _)] = collect(make(fake.base_url), TRAIN[0])
    rows = sorted(zip(group["scores"], group["overrides"], strict=True), key=lambda r: r[0])
    assert rows == [(-1.0, {"outcome": "invalid/no_answer"})] * 2 + [(1.0, {})] * 2


def test_groups_that_are_all_right_or_all_wrong_are_dropped_when_configured():
    with FakeInferenceServer(responder=right) as fake:
        [(group, _)] = collect(make(fake.base_url, ensure_scores_are_not_same=True), TRAIN[1])
    assert group is None


def test_evaluate_samples_the_test_split_at_temperature_0_6(tmp_path):
    seen: list[str] = []

    def responder(prompt: str) -> str:
        seen.append(question_of(prompt))
        return right(prompt) if len(seen) % 4 else wrong(prompt)

    run = evaluate_against(make, responder, tmp_path)
    assert sorted(seen) == sorted(r["question"] for r in TEST)  # the test split, n=1
    assert run.metrics == {"eval/percent_correct": 0.75}
    assert run.temperature == 0.6
    samples = run.samples
    assert len(samples) == 20 and {"gold", "completion", "finish_reason", "score"} <= set(
        samples[0]
    )


def test_process_end_to_end_writes_jsonl_and_html(tmp_path):
    run = process_through_cli(GSM8K, alternating(), tmp_path / "gsm8k.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [-1.0, 1.0] for g in run.groups)
    assert "boxed" in run.page
    assert run.metrics["groups"] == 3
