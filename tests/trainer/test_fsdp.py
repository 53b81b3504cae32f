"""The trainer on 2 processes (torchrun, gloo on the CPU, FSDP2) against a real API: the same
weights as one process, a rank killed and the run resumed with 2 and then 1 process, a signal to
one rank stopping both. (The batch split itself: test_shard.py; the step's gradient scaling is
what the weights' equality checks.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from atropos.api.app import create_app  # noqa: E402
from atropos.testing import free_port, serve_in_thread  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from .helpers import config, metrics, push_groups  # noqa: E402

FLAGS = [
    "--batch-size", "8", "--micro-batch-size", "2", "--seq-len", "64", "--sync", "none",
    "--lr", "1e-3", "--checkpoint-every", "2", "--patience", "10", "--rank-timeout", "60",
]  # fmt: skip


def torchrun(model: Path, url: str, out: Path, steps: int, nproc: int = 2) -> subprocess.Popen:
    """`torchrun --nproc-per-node N -m atropos.trainer` on 127.0.0.1."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "atropos.trainer", "--model", str(model), "--api-url", url,
        "--out-dir", str(out), "--steps", str(steps), *FLAGS,
    ]  # fmt: skip
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finished(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")[-3000:]


def worker(proc: subprocess.Popen, rank: int) -> int:
    """The pid of torchrun's worker of `rank` (a child with RANK=rank in its environment)."""
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ:
                return int(pid)
    raise AssertionError(f"no worker of rank {rank} under torchrun {proc.pid}")


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until `out/metrics.jsonl` has `n` steps (and the trainer then waits for a batch)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, finished(proc)[1]
        if (out / "metrics.jsonl").exists() and len(metrics(out)) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the trainer did not reach step {n} within {timeout} s")


def status(url: str) -> dict:
    return httpx.get(f"{url}/status").json()


def weights(out: Path, step: int) -> dict:
    return load_file(out / "checkpoints" / f"step_{step}" / "model.safetensors")


def one_process_run(model: Path, out: Path, steps: int) -> Path:
    """The one-process trainer on the first batches the 2-process run got (same seed)."""
    with serve_in_thread(create_app()) as url:
        push_groups(url, 6)
        train(config(model, url, out, steps=steps, micro_batch_size=2))
    return out


def test_two_processes_match_one_survive_a_killed_rank_and_stop_on_one_signal(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One run's life (one test, because each torchrun start costs seconds): 2 processes
    train the weights 1 process trains; rank 1 is killed after step 3 (the newest checkpoint
    is step 2's), the run resumes on 2 processes, SIGTERM to rank 1 alone stops both after a
    checkpoint, then it resumes on 1 process: every batch trained once into the final weights,
    nothing lost."""
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 6)  # batches 1-3, then the trainer waits for more
        proc = torchrun(tiny_model_dir, url, out, steps=100)
        wait_for_steps(out, 3, proc)
        os.kill(worker(proc, 1), signal.SIGKILL)  # step 3 is trained but not checkpointed
        code, err = finished(proc)
        assert code != 0 and "rank 0 of 2: no answer from the other ranks" in err
        assert status(url)["queue_size"] == 2  # batch 3 still leased, not consumed
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]

        one = one_process_run(tiny_model_dir, tmp_path / "one", steps=2)
        assert sorted(weights(one, 2)) == sorted(weights(out, 2))
        for name, tensor in weights(one, 2).items():
            torch.testing.assert_close(weights(out, 2)[name], tensor, rtol=1e-4, atol=1e-5)
        for a, b in zip(metrics(one), metrics(out)[:2], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
            assert a["trained_tokens"] == b["trained_tokens"] and b["sequences"] == 8

        push_groups(url, 2, seed=1)  # batch 4
        proc = torchrun(tiny_model_dir, url, out, steps=100)
        wait_for_steps(out, 5, proc)  # batch 3 again (from step 2's weights), then 4
        os.kill(worker(proc, 1), signal.SIGTERM)  # one rank's signal stops both
        code, err = finished(proc, timeout=30)
        assert code == 0, err
        assert (out / "checkpoints" / "step_4" / "state.json").exists()
        assert status(url)["queue_size"] == 0  # batches 3 and 4 acknowledged

        push_groups(url, 4, seed=2)  # batches 5 and 6, for one process
        last = train(config(tiny_model_dir, url, out, steps=6, micro_batch_size=2))
        assert last["step"] == 6 and status(url)["queue_size"] == 0
    assert [r["api_step"] for r in metrics(out)] == [1, 2, 3, 3, 4, 5, 6]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 3, 4, 5, 6]
