"""MetricsSink (JSONL records, appends, JSON-safe values), the W&B wrapper and the stats."""

from __future__ import annotations

import json
import re
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from atropos.envs.config import BaseEnvConfig
from atropos.install import install_hint
from atropos.metrics import (
    MetricsError,
    MetricsSink,
    WandbRun,
    completion_stats,
    open_env_sink,
    summary,
    trained_tokens,
)

from .offline_wandb import read_offline_runs


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_carry_step_time_source_and_are_flushed_as_written(tmp_path):
    path = tmp_path / "a" / "b" / "metrics.jsonl"  # directories are created
    sink = MetricsSink(path, "env:gsm8k")
    sink.log({"train/percent_correct": 0.25, "train/workers": 8}, step=3)
    first = lines(path)  # readable before close: flushed per record
    assert len(first) == 1
    record = first[0]
    assert record["step"] == 3 and record["source"] == "env:gsm8k"
    assert isinstance(record["time"], float)
    assert record["train/percent_correct"] == 0.25 and record["train/workers"] == 8
    sink.log({"step": 99, "source": "x", "time": 0, "eval/acc": 1.0}, step=4)  # reserved keys
    sink.close()
    second = lines(path)[1]
    assert (second["step"], second["source"], second["eval/acc"]) == (4, "env:gsm8k", 1.0)
    assert second["time"] > 0
    sink.log({"late": 1.0}, step=5)  # after close: nothing, no error
    sink.close()  # twice: fine
    assert len(lines(path)) == 2 and sink.records == 2


def test_a_restarted_run_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsSink(path, "trainer") as sink:
        sink.log({"loss": 1.0}, step=1)
        sink.log({"loss": 0.9}, step=2)
    with MetricsSink(path, "trainer") as sink:  # the resumed process
        sink.log({"loss": 0.8}, step=3)
    assert [r["step"] for r in lines(path)] == [1, 2, 3]


def test_values_json_cannot_hold_are_written_as_null_or_plain(tmp_path):
    path = tmp_path / "m.jsonl"
    with MetricsSink(path, "trainer") as sink:
        sink.log(
            {
                "nan": float("nan"),
                "inf": float("inf"),
                "ninf": float("-inf"),
                "none": None,
                "nested": {"a": [1.0, float("nan")]},
                "obj": Path("x"),
            },
            step=1,
        )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON
    record = json.loads(text)
    assert record["nan"] is None and record["inf"] is None and record["ninf"] is None
    assert record["none"] is None and record["nested"] == {"a": [1.0, None]}
    assert record["obj"] == "x"


def test_numpy_and_torch_scalars_become_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "m.jsonl"
    values: dict[str, Any] = {"f32": np.float32(0.5), "i64": np.int64(7), "nan": np.float64("nan")}
    try:
        import torch

        values["tensor"] = torch.tensor(2.5)
    except ImportError:
        pass
    with MetricsSink(path, "trainer") as sink:
        sink.log(values, step=1)
    record = json.loads(path.read_text())
    assert record["f32"] == 0.5 and record["i64"] == 7 and record["nan"] is None
    assert record.get("tensor", 2.5) == 2.5


def test_a_sink_without_a_file_still_feeds_wandb():
    seen: list[tuple[dict[str, Any], int | None]] = []

    class Run:
        def log(self, data: dict[str, Any], step: int | None = None) -> None:
            seen.append((data, step))

        def finish(self) -> None:
            seen.append(({"finished": True}, None))

    with MetricsSink(None, "trainer", WandbRun(Run(), names={"loss": "train/loss"})) as sink:
        sink.log({"loss": 1.0, "skip": None, "nan": float("nan")}, step=2)
    data, step = seen[0]
    assert step == 2 and data["train/loss"] == 1.0 and "skip" not in data
    assert data["nan"] != data["nan"]  # W&B gets NaN as is (it records NaN itself)
    assert seen[-1][0] == {"finished": True}


def test_a_failing_wandb_never_stops_the_run(tmp_path, caplog):
    class Broken:
        def log(self, data: dict[str, Any], step: int | None = None) -> None:
            raise ConnectionError("offline")

        def finish(self) -> None:
            raise ConnectionError("offline")

    path = tmp_path / "m.jsonl"
    with MetricsSink(path, "trainer", WandbRun(Broken())) as sink:
        sink.log({"a": 1.0}, step=1)
        sink.log({"a": 2.0}, step=2)
    assert [r["a"] for r in lines(path)] == [1.0, 2.0]
    assert caplog.text.count("W&B log failed") == 1  # once, not per record


def hide_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError


def test_missing_wandb_is_a_clear_error_naming_the_extra(monkeypatch, tmp_path):
    hide_wandb(monkeypatch)
    with pytest.raises(MetricsError) as err:
        WandbRun.start(project="p", off_hint="--env.use_wandb false")
    message = str(err.value)
    assert install_hint("wandb") in message and "--env.use_wandb false" in message


class FakeEnv:
    name = "fake"

    def __init__(self, **config: Any) -> None:
        self.config = BaseEnvConfig(tokenizer_name="tiny", **config)


def test_env_sink_uses_wandb_only_with_a_project(monkeypatch, tmp_path, caplog):
    hide_wandb(monkeypatch)  # any attempt to start W&B would raise
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    sink = open_env_sink(FakeEnv(), tmp_path / "m.jsonl", wandb_info={"project": "", "group": ""})
    assert sink.wandb is None and sink.source == "env:fake"  # use_wandb (default true), no project
    sink.close()
    assert "no project" in caplog.text
    off = open_env_sink(FakeEnv(use_wandb=False), tmp_path / "m.jsonl", wandb_info={"project": "p"})
    assert off.wandb is None
    off.close()
    with pytest.raises(MetricsError, match=re.escape(install_hint("wandb"))):
        open_env_sink(FakeEnv(wandb_name="x"), tmp_path / "m.jsonl", wandb_info={"project": "p"})
    monkeypatch.setenv("WANDB_PROJECT", "from-env")  # process mode's way to name a project
    with pytest.raises(MetricsError):
        open_env_sink(FakeEnv(), tmp_path / "m.jsonl")


def test_env_sink_starts_a_run_in_the_trainers_project_and_group(monkeypatch, tmp_path):
    calls: list[dict[str, Any]] = []

    class Run:
        def log(self, data: dict[str, Any], step: int | None = None) -> None:
            calls.append({"log": data, "step": step})

        def finish(self) -> None:
            calls.append({"finish": True})

    fake = types.ModuleType("wandb")
    fake.__version__ = "0.31.0"  # type: ignore[attr-defined]
    fake.init = lambda **kw: calls.append(kw) or Run()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    env = FakeEnv(wandb_name="gsm8k")
    sink = open_env_sink(
        env,
        tmp_path / "metrics.jsonl",
        wandb_info={"project": "p", "group": "g"},
        config={"env": {"group_size": 4}},
        wandb_dir=tmp_path / "run",
    )
    sink.log({"train/items_sent_to_api": 3.0}, step=7)
    sink.close()
    init = calls[0]
    assert init["project"] == "p" and init["group"] == "g" and init["reinit"] == "create_new"
    assert init["name"].startswith("gsm8k-") and len(init["name"]) == len("gsm8k-2025-01-01-abcdef")
    assert init["dir"] == str(tmp_path / "run") and init["config"] == {"env": {"group_size": 4}}
    assert calls[1] == {"log": {"train/items_sent_to_api": 3.0}, "step": 7}
    assert calls[2] == {"finish": True}


def test_real_wandb_offline_run_records_the_keys(offline_wandb):
    run = WandbRun.start(project="atropos-test", group="g1", name="sink-test", dir=offline_wandb)
    with MetricsSink(offline_wandb / "m.jsonl", "trainer", run) as sink:
        sink.log({"train/loss": 1.5, "grpo/mean_ratio": 1.0}, step=1)
        sink.log({"train/loss": 1.25, "grpo/mean_ratio": 0.9}, step=2)
    deadline = time.monotonic() + 10  # wandb's offline writer may land the run record late
    while True:
        [offline] = read_offline_runs(offline_wandb)
        if offline.project or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (offline.project, offline.group, offline.name) == ("atropos-test", "g1", "sink-test")
    assert {"train/loss", "grpo/mean_ratio"} <= offline.keys()
    assert offline.steps("train/loss") == [1, 2]
    assert [row["train/loss"] for row in offline.history] == [1.5, 1.25]


def test_completion_stats_fix_upstreams_p95():
    lengths = [10] * 90 + [60] * 10
    stats = completion_stats(lengths, max_token_len=100)
    assert stats["train/completion_lengths_p95"] == 60.0  # a length, the 95th percentile
    assert stats["train/completion_lengths_near_max_fraction"] == 0.0  # none longer than 95
    stats = completion_stats(lengths, max_token_len=50)
    assert stats["train/completion_lengths_near_max_fraction"] == 0.1  # upstream's "p95"
    assert "train/completion_lengths_near_max_fraction" not in completion_stats([3], -1)
    assert completion_stats([], 100) == {}
    assert stats["train/completion_lengths"] == 15.0 and stats["train/completion_lengths_min"] == 10


def test_summary_and_trained_tokens():
    assert summary([2.0, 4.0], "train_perf/task_duration") == {
        "train_perf/task_duration_mean": 3.0,
        "train_perf/task_duration_std": 1.0,
        "train_perf/task_duration_max": 4.0,
        "train_perf/task_duration_min": 2.0,
    }
    assert trained_tokens([[-100, 1, 2], [-100, -100, 3], (4, -100)]) == [2, 1, 1]
