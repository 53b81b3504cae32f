"""`HeldOutEnv`: its items are the fixture named after it, or a hub dataset with a share
held out."""

from __future__ import annotations

from typing import Any

import pytest

from atropos.environments.common.data_loading import data_path, read_jsonl
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv

from ..helpers import fake_hub, make_env


class Named(HeldOutEnv):
    name = "mcqa"  # reads data/mcqa/ unless it names another fixture

    def score(self, item: Any, completion: str) -> float:
        return 0.0


class Checked(Named):
    fixture = "fundamentals"

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        if "context" not in row:
            raise ValueError(f"{where}: no context")
        return {"context": row["context"]}


def test_the_fixture_is_the_envs_name_unless_it_names_one() -> None:
    env = make_env(Named)
    assert isinstance(env.config, HeldOutConfig) and env.config.test_fraction == 0.05
    assert env.load() == read_jsonl(data_path("mcqa", "train.jsonl"))
    assert env.load_eval() == read_jsonl(data_path("mcqa", "test.jsonl"))
    rows = read_jsonl(data_path("fundamentals", "test.jsonl"))
    assert make_env(Checked).load_eval() == [{"context": r["context"]} for r in rows]


def test_a_hub_dataset_holds_out_test_fraction_of_its_train_split(monkeypatch) -> None:
    rows = [{"context": f"c{i}"} for i in range(40)]
    fake_hub(monkeypatch, rows)
    env = make_env(Checked, dataset_name="org/data", test_fraction=0.1)
    train, test = env.load(), env.load_eval()
    assert (len(train), len(test)) == (36, 4)
    assert sorted(r["context"] for r in train + test) == sorted(r["context"] for r in rows)
    fake_hub(monkeypatch, [*rows, {"text": "no context"}])
    with pytest.raises(ValueError, match=r"org/data (train|test) row \d+: no context"):
        env.load() + env.load_eval()
