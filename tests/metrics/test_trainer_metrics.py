"""The trainer's metrics: metrics.jsonl as before (plus time and source), and W&B offline."""

from __future__ import annotations

import sys

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.install import install_hint
from atropos.metrics import MetricsError  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.trainer.train import WANDB_NAMES, TrainConfig, open_metrics, train  # noqa: E402

from ..trainer.helpers import config, metrics, push_groups  # noqa: E402
from .offline_wandb import read_offline_runs  # noqa: E402


def test_trainer_logs_jsonl_and_an_offline_wandb_run(tiny_model_dir, tmp_path, offline_wandb):
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 4)  # 2 batches of 8 sequences
        cfg = config(
            tiny_model_dir, url, out, steps=2, micro_batch_size=8, wandb=True,
            wandb_project="atropos-test", wandb_group="exp1", wandb_name="trainer-test",
        )  # fmt: skip
        last = train(cfg)
        info = httpx.get(f"{url}/wandb_info").json()
    assert info == {"group": "exp1", "project": "atropos-test"}  # what envs will join
    lines = metrics(out)
    assert [r["step"] for r in lines] == [1, 2] and last["step"] == 2
    for r in lines:  # the short names, as before, plus the record's time and source
        assert r["source"] == "trainer" and r["time"] > 0
        assert {"loss", "grad_norm", "lr", "mean_ratio", "clip_fraction", "api_step"} <= set(r)
    [run] = read_offline_runs(offline_wandb)
    assert (run.project, run.group, run.name) == ("atropos-test", "exp1", "trainer-test")
    for upstream in ("train/loss", "train/grad_norm", "train/lr", "grpo/mean_ratio"):
        assert upstream in run.keys() and run.steps(upstream) == [1, 2]
    assert "grpo/clipped_fraction" in run.keys() and "loss" not in run.keys()
    assert run.history[0]["train/loss"] == pytest.approx(lines[0]["loss"])


def test_without_wandb_the_trainer_registers_no_project(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # never imported without --wandb
    sink, group, project = open_metrics(TrainConfig(model="m", out_dir=tmp_path))
    assert (group, project) == ("", "") and sink.wandb is None
    sink.close()


def test_trainer_wandb_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MetricsError) as err:
        open_metrics(TrainConfig(model="m", out_dir=tmp_path, wandb=True))
    assert install_hint("wandb") in str(err.value) and "--wandb" in str(err.value)


def test_every_trainer_metric_has_a_wandb_name(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2)
        last = train(config(tiny_model_dir, url, out, steps=1, micro_batch_size=8))
    assert set(last) - {"step"} == set(WANDB_NAMES)
