"""The `arithmetic` demo environment: items, splits, reward, and the env against a fake server."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

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
from atropos.envs.check import check_env
from atropos.envs.config import ResolvedConfig
from atropos.inference.config import ServerManagerConfig
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing import FakeInferenceServer


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


def make(url: str, mode: str = "process", **env: object) -> Arithmetic:
    defaults, [server] = Arithmetic.config_init()
    config = defaults.model_copy(update={"group_size": 4, **env})
    servers = [server.model_copy(update={"base_url": url})]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), mode)  # type: ignore[arg-type]
    return Arithmetic(config, servers, manager=resolved.manager)


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
        len(tok.apply_chat_template([{"role": "user", "content": i["question"]}])["input_ids"])
        for i in sample_items("eval", 100)
    }
    assert max(lengths) <= 24


def test_groups_from_a_vllm_server_carry_its_ids_and_mixed_rewards():
    with FakeInferenceServer(responder=half_right) as fake:
        report = check_env(make(fake.base_url), items=3)
        assert report.groups == 3 and report.token_sources == {"server"}

        env = make(fake.base_url)

        async def one() -> dict:
            await env.setup()
            groups = [await env.collect_trajectories(make_item(a, 3)) for a in (4, 5)]
            await env.server.aclose()
            return {"scores": [g["scores"] for g, _ in groups], "group": groups[0][0]}

        out = asyncio.run(one())
    assert out["scores"] == [[0.0] * 4, [1.0] * 4]
    assert len(out["group"]["inference_logprobs"]) == 4


@pytest.mark.parametrize(("responder", "accuracy"), [(right, 1.0), (half_right, None)])
def test_evaluate_is_greedy_on_held_out_items_and_writes_metrics(tmp_path, responder, accuracy):
    with FakeInferenceServer(responder=responder) as fake:
        env = make(fake.base_url, "evaluate", data_dir_to_save_evals=str(tmp_path), eval_items=20)

        async def main() -> dict:
            await env.setup()
            metrics = await env.evaluate()
            await env.server.aclose()
            return metrics

        metrics = asyncio.run(main())
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["results"]["atropos|arithmetic_eval|0"] == metrics == doc["results"]["all"]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    held_out = {i["question"] for i in sample_items("eval")}
    assert len(samples) == 20 and all(s["messages"][-1]["content"] in held_out for s in samples)
    if accuracy is not None:
        assert metrics["eval/accuracy"] == accuracy
    else:
        assert 0 < metrics["eval/accuracy"] < 1


def test_defaults_suit_the_demo():
    config, [server] = Arithmetic.config_init()
    assert isinstance(config, ArithmeticConfig)
    assert (config.group_size, config.tokenizer_name, server.server_type) == (8, "tiny", "vllm")
    assert Arithmetic.temperature == 1.0 and config.max_token_length <= 64


def test_is_registered_under_its_name():
    assert "arithmetic" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("arithmetic") is Arithmetic


def test_importing_the_environment_pulls_in_no_torch():
    code = (
        "import sys, atropos.environments, atropos.environments.arithmetic; "
        "print(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
