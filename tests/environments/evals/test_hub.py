"""Loading the real datasets by name (through a fake `datasets` module), a local file, and the
error when `datasets` is missing."""

from __future__ import annotations

import asyncio
import json
import re
import sys

import pytest

from atropos.environments.common.data_loading import HubUnavailable, data_path, read_jsonl
from atropos.environments.evals import (
    AIMEEval,
    EvalEnv,
    GPQAEval,
    GSM8KEval,
    IFEvalEval,
    Math500Eval,
    MMLUEval,
)
from atropos.install import install_hint

from .helpers import fake_hub, make

HUB = [
    # env, the name a user gives, the config and split loaded by default
    (GSM8KEval, "openai/gsm8k", "main", "test"),
    (Math500Eval, "HuggingFaceH4/MATH-500", None, "test"),
    (AIMEEval, "HuggingFaceH4/aime_2024", None, "train"),
    (MMLUEval, "cais/mmlu", "all", "test"),
    (MMLUEval, "lighteval/mmlu", "all", "test"),
    (GPQAEval, "Idavidrein/gpqa", "gpqa_diamond", "train"),
    (IFEvalEval, "google/IFEval", None, "train"),
]


@pytest.mark.parametrize(("cls", "name", "config", "split"), HUB)
def test_the_hub_dataset_is_read_by_the_same_loader_as_the_fixture(
    monkeypatch, cls: type[EvalEnv], name, config, split
):
    fixture = read_jsonl(data_path("evals", cls.fixture))
    calls = fake_hub(monkeypatch, lambda *_: [dict(row) for row in fixture])
    assert cls.hub_dataset == name or cls is MMLUEval
    from_hub = make(cls, dataset_name=name).load_problems()
    assert calls == [(name, config, split)]
    assert from_hub == make(cls).load_problems()  # same rows, same problems


def test_config_and_split_can_be_chosen(monkeypatch):
    calls = fake_hub(monkeypatch, lambda *_: read_jsonl(data_path("evals", "gpqa.jsonl")))
    env = make(GPQAEval, dataset_name="Idavidrein/gpqa", dataset_config="gpqa_main")
    assert len(env.load_problems()) == 8
    make(GSM8KEval, dataset_name="openai/gsm8k", dataset_split="train").load_rows()
    assert calls == [("Idavidrein/gpqa", "gpqa_main", "train"), ("openai/gsm8k", "main", "train")]


def test_mmlu_few_shot_examples_come_from_the_hubs_dev_split(monkeypatch):
    def rows_of(name, config, split):
        return read_jsonl(data_path("evals", "mmlu_dev.jsonl" if split == "dev" else "mmlu.jsonl"))

    calls = fake_hub(monkeypatch, rows_of)
    found = make(MMLUEval, dataset_name="cais/mmlu", few_shot=2).load_problems()
    assert calls == [("cais/mmlu", "all", "test"), ("cais/mmlu", "all", "dev")]
    assert found == make(MMLUEval, few_shot=2).load_problems()
    assert all(p.data["few_shot"] == 2 for p in found)


def test_a_local_file_in_the_benchmarks_layout(tmp_path, monkeypatch):
    fake_hub(monkeypatch, lambda *_: pytest.fail("the hub must not be asked"))
    path = tmp_path / "mine.jsonl"
    rows = [{"id": 9, "problem": "What is 6 * 7?", "answer": "42"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [problem] = make(AIMEEval, data_file=str(path), dataset_name="ignored/name").load_problems()
    assert (problem.id, problem.prompt, problem.gold) == ("aime-9", "What is 6 * 7?", 42)


def test_a_missing_datasets_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(HubUnavailable, match=re.escape(install_hint("hub"))):
        make(GSM8KEval, dataset_name="openai/gsm8k").load_problems()


def test_an_empty_selection_is_an_error():
    env = make(MMLUEval, subjects=["no_such_subject"])
    with pytest.raises(ValueError, match="no problems to evaluate"):
        asyncio.run(env.setup())
