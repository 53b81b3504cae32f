"""benchmarks/trainer_gpu.py on the CPU, tiny: the sharded step (FSDP2 on a process group of
one, in this process) runs and its report adds up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from atropos.testing import free_port, load_script  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "trainer_gpu.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The script, loaded, in a process group of one as torchrun would describe it."""
    torchrun = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    for name, value in (torchrun | {"MASTER_PORT": str(free_port())}).items():
        monkeypatch.setenv(name, value)
    return load_script(SCRIPT)


def test_the_gpu_benchmark_times_the_sharded_step_on_a_cpu(tmp_path: Path, bench: Any) -> None:
    out = tmp_path / "r.json"
    flags = "--device cpu --size tiny --seq-len 32 --batch-size 4 --micro-batch-size 2"
    assert bench.main([*flags.split(), "--warmup", "1", "--steps", "2", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert (r["ranks"], r["tokens_per_step"], r["timed_steps"], r["precision"]) == (
        1, 128, 2, "fp32"
    )  # fmt: skip
    assert r["tokens_per_s"] == pytest.approx(128 / r["step_s_mean"])
    assert r["mfu"] is None and len(r["peak_memory_gib_per_rank"]) == 1
    assert 0 < r["matmul_parameters"] < r["parameters"]


def test_the_gpu_benchmark_takes_lengths_packing_and_the_old_logprobs(
    tmp_path: Path, bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--lengths` draws lengths and counts only real positions; `--layout packed` and
    `--logprobs full` (the step before chunking, to compare against) run."""
    out = tmp_path / "r.json"
    flags = "--device cpu --size tiny --seq-len 32 --batch-size 6 --micro-batch-size 3"
    more = "--lengths 8:32 --layout packed --logprobs full --attention eager"
    argv = [*flags.split(), *more.split(), "--warmup", "1", "--steps", "1", "--json", str(out)]
    import atropos.trainer.step as step

    monkeypatch.setattr(step, "token_logprobs", step.token_logprobs)  # put back after the run
    assert bench.main(argv) == 0
    r = json.loads(out.read_text())
    assert (r["layout"], r["logprobs"], r["attention"], r["lengths"]) == (
        "packed", "full", "eager", "8:32"
    )  # fmt: skip
    assert 6 * 8 <= r["tokens_per_step"] <= 6 * 32 and r["tokens_per_step"] != 6 * 32
