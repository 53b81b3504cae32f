"""`atropos train` against a real API: steps, checkpoints, acknowledgements, resume, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402


def status(url: str) -> dict:
    return httpx.get(f"{url}/status").json()


def test_trains_checkpoints_acks_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serve_in_thread(create_app()) as url:
        push_groups(url, 12)  # 48 sequences = 6 batches of 8
        out = tmp_path / "run"
        last = train(config(tiny_model_dir, url, out, steps=3, checkpoint_every=2))
        assert last["step"] == 3
        rows = metrics(out)
        assert [r["step"] for r in rows] == [1, 2, 3]
        for r in rows:
            assert all(v is None or v == v for v in r.values())  # no NaN
            assert r["sequences"] == 8 and r["trained_tokens"] > 0
            assert r["logprob_mismatch"] is None  # no group carries a policy version
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2", "step_3"]
        assert status(url)["queue_size"] == 6  # groups: three batches acknowledged, three left
        # a second run resumes from step 3 and goes on to 5
        last = train(config(tiny_model_dir, url, out, steps=5, checkpoint_every=2))
        assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4, 5]
        assert last["api_step"] == 5
        assert status(url)["queue_size"] == 2


def test_a_packed_run_trains_what_a_padded_run_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`--layout packed --attention eager` end to end: the same batches give the same losses and
    gradient norms as the padded run (the step's own equality: tests/trainer/test_step.py)."""
    runs = {}
    for layout in ("padded", "packed"):
        with serve_in_thread(create_app()) as url:
            push_groups(url, 4)
            out = tmp_path / layout
            train(config(tiny_model_dir, url, out, steps=2, layout=layout, attention="eager"))
            runs[layout] = metrics(out)
    for padded, packed in zip(runs["padded"], runs["packed"], strict=True):
        assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-4, abs=1e-6)
        assert packed["grad_norm"] == pytest.approx(padded["grad_norm"], rel=1e-3)
        assert packed["trained_tokens"] == padded["trained_tokens"] > 0


def test_crash_between_checkpoints_loses_and_repeats_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 10)  # 5 batches
        argv = [
            sys.executable, "-m", "atropos", "train", "--model", str(tiny_model_dir),
            "--api-url", url, "--out-dir", str(out), "--batch-size", "8",
            "--micro-batch-size", "8", "--seq-len", "64", "--sync", "none", "--steps", "100",
            "--checkpoint-every", "2", "--lr", "1e-3",
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (out / "metrics.jsonl").exists() and len(metrics(out)) >= 3:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        done = len(metrics(out))
        assert done >= 3
        kept = max(int(p.name[5:]) for p in (out / "checkpoints").iterdir() if "." not in p.name)
        # everything after the newest checkpoint is still leased, not consumed (and the batches
        # it covers may be too, when the kill came between the checkpoint and their ack)
        assert status(url)["queue_size"] >= (5 - kept) * 2  # groups
        # resume: the batches after the checkpoint come back, then the rest, each once
        last = train(config(tiny_model_dir, url, out, steps=5, micro_batch_size=8))
        steps = [r["api_step"] for r in metrics(out)[done:]]
        assert steps == list(range(kept + 1, 6))
        assert last["step"] == 5 and status(url)["queue_size"] == 0


def test_sigterm_finishes_the_step_checkpoints_and_acks(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 4)  # 2 batches, then the trainer waits for more
        argv = [
            sys.executable, "-m", "atropos", "train", "--model", str(tiny_model_dir),
            "--api-url", url, "--out-dir", str(out), "--batch-size", "8", "--seq-len", "64",
            "--sync", "none", "--steps", "100", "--checkpoint-every", "50",
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            (out / "metrics.jsonl").exists() and len(metrics(out)) == 2
        ):
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert (out / "checkpoints" / "step_2" / "state.json").exists()
        assert status(url)["queue_size"] == 0


def test_bad_flags_are_named(tiny_model_dir: Path) -> None:
    run = [sys.executable, "-m", "atropos", "train"]
    r = subprocess.run([*run, "--modle", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "did you mean --model?" in r.stderr
    r = subprocess.run([*run, "--model", "x", "--batch-size", "0"], capture_output=True, text=True)
    assert (
        r.returncode == 2 and "--batch-size: Input should be greater than or equal to 1" in r.stderr
    )


def test_batches_in_a_checkpoint_are_not_trained_again_if_the_ack_was_lost(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from atropos.client import TrainerClient

    real_ack = TrainerClient.ack

    def crash_before_ack(self: TrainerClient, batch_id: str, missing_ok: bool = False) -> None:
        raise KeyboardInterrupt("killed between the checkpoint and the ack")

    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 6)  # 3 batches
        monkeypatch.setattr(TrainerClient, "ack", crash_before_ack)
        with pytest.raises(KeyboardInterrupt):
            train(config(tiny_model_dir, url, out, steps=2, checkpoint_every=2))
        assert (out / "checkpoints" / "step_2").exists()
        assert status(url)["queue_size"] == 6  # nothing acknowledged
        before = len(metrics(out))  # step 2's line was not written: the crash came first
        monkeypatch.setattr(TrainerClient, "ack", real_ack)
        train(config(tiny_model_dir, url, out, steps=3, checkpoint_every=2))
        assert [r["api_step"] for r in metrics(out)[before:]] == [3]  # batch 3 only, once
        assert status(url)["queue_size"] == 0


def test_a_partial_checkpoint_left_by_a_crash_is_never_resumed_from(tmp_path) -> None:
    from atropos.trainer.checkpoint import latest_checkpoint

    for name in ("step_2", "step_4.partial"):  # a crash after state.json, before the rename
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "state.json").write_text("{}")
    (tmp_path / "checkpoints" / "step_6").mkdir()  # no state.json: incomplete
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_2"
