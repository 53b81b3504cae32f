"""The `arithmetic` demo environment: items, splits, reward, and the env against a fake server."""

from __future__ import annotations

import re
from functools import partial

import pytest

from atropos.environments.arithmetic import (
    MAX_OPERAND,
    Arithmetic,
    ArithmeticConfig,
    is_eval_pair,
    make_item,
    parse_answer,
    sample_items,
    score_answer,
)
from atropos.envs import registry
from atropos.inference.tokenize import template_ids
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    collect,
    env_defaults,
    evaluate_against,
    make_env,
    modules_loaded_by,
)


def _operands(prompt: str) -> tuple[int, int]:
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
    return int(a), int(b)


def right(prompt: str) -> str:
    """A responder that always answers right."""
    a, b = _operands(prompt)
    return str(a + b)


def half_right(prompt: str) -> str:
    """A responder right on about half the items (by operand parity), so groups are mixed."""
    a, b = _operands(prompt)
    return str(a + b + (a + b) % 2)


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, Arithmetic)


def test_splits_are_disjoint_fixed_and_cover_every_pair():
    train, held_out = sample_items("train"), sample_items("eval")
    questions = {i["question"] for i in train}
    assert not questions & {i["question"] for i in held_out}
    assert len(train) + len(held_out) == (MAX_OPERAND + 1) ** 2
    assert 0.15 < len(held_out) / (len(train) + len(held_out)) < 0.25
    assert sample_items("eval", 5, seed=3) == sample_items("eval", 5, seed=3)
    assert sample_items("eval", 5, seed=3) != sample_items("eval", 5, seed=4)
    assert all(not is_eval_pair(*_operands(i["question"])) for i in train[:50])
    with pytest.raises(ValueError, match="split"):
        sample_items("test")


@pytest.mark.parametrize(
    ("completion", "parsed"),
    [("19", 19), (" 19\n", 19), ("019", 19), ("19.", None), ("19 + 0", None), ("", None)],
)
def test_only_a_bare_number_parses(completion, parsed):
    assert parse_answer(completion) == parsed
    assert score_answer(make_item(12, 7), completion) == (1.0 if parsed == 19 else 0.0)


def test_answers_and_prompts_tokenize_short():
    tok = load_tokenizer("tiny")
    assert max(len(tok.encode(str(n))) for n in range(2 * MAX_OPERAND + 1)) <= 3
    lengths = {
        len(template_ids(tok, [{"role": "user", "content": i["question"]}]))
        for i in sample_items("eval", 100)
    }
    assert max(lengths) <= 24


def test_groups_from_a_vllm_server_carry_its_ids_and_mixed_rewards():
    report = check_against(make, half_right)
    assert report.groups == 3 and report.token_sources == {"server"}
    with FakeInferenceServer(responder=half_right) as fake:
        groups = [g for g, _ in collect(make(fake.base_url), make_item(4, 3), make_item(5, 3))]
    assert [g["scores"] for g in groups] == [[0.0] * 4, [1.0] * 4]
    assert len(groups[0]["inference_logprobs"]) == 4


@pytest.mark.parametrize(("responder", "accuracy"), [(right, 1.0), (half_right, None)])
def test_evaluate_is_greedy_on_held_out_items_and_writes_metrics(tmp_path, responder, accuracy):
    run = evaluate_against(make, responder, tmp_path, setup=True, eval_items=20)
    metrics, doc, samples = run.metrics, run.doc, run.samples
    assert doc["results"]["atropos|arithmetic_eval|0"] == metrics == doc["results"]["all"]
    held_out = {i["question"] for i in sample_items("eval")}
    assert len(samples) == 20 and all(s["messages"][-1]["content"] in held_out for s in samples)
    if accuracy is not None:
        assert metrics["eval/accuracy"] == accuracy
    else:
        assert 0 < metrics["eval/accuracy"] < 1


def test_defaults_suit_the_demo():
    config, [server] = env_defaults(Arithmetic)
    assert isinstance(config, ArithmeticConfig)
    assert (config.group_size, config.tokenizer_name, server.server_type) == (8, "tiny", "vllm")
    assert Arithmetic.temperature == 1.0 and config.max_token_length <= 64


def test_is_registered_under_its_name():
    assert "arithmetic" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("arithmetic") is Arithmetic


def test_importing_the_environment_pulls_in_no_torch():
    imports = "atropos.environments, atropos.environments.arithmetic"
    assert modules_loaded_by(imports, {"torch", "transformers", "numpy"}) == []
