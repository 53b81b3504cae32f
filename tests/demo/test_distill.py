"""`atropos demo --distill`, short: a teacher trained by the RL loop for a few steps, then the
warm start distilled toward it through five real processes (the teacher on its own server).

Slow (about two minutes): the same code path as `atropos demo --distill`, with a small budget.
Whether the student closes the gap is measured over the full budget and three seeds in
benchmarks/RESULTS.md, not here: a few steps move it too little to assert.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rich.console import Console  # noqa: E402

from atropos.demo.distill import run_distill  # noqa: E402
from atropos.demo.run import DemoConfig  # noqa: E402

STEPS = 4


@pytest.mark.slow
def test_the_distillation_demo_runs_end_to_end(tmp_path: Path) -> None:
    cfg = DemoConfig(
        out=tmp_path / "distill", steps=STEPS, batch_size=16, max_workers=4, eval_items=40,
        teacher_steps=3,
    )  # fmt: skip
    summary = run_distill(cfg, Console(stderr=True, quiet=True))
    teacher = cfg.out / "teacher-run" / "trainer" / "checkpoints" / "step_3"
    assert summary["teacher"] == str(teacher.resolve())
    for key in ("student before", "teacher", "student after"):
        assert 0.0 <= summary[f"held-out accuracy, {key}"] <= 1.0
    rows = [json.loads(x) for x in (cfg.out / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["reverse_kl"]) for r in rows)
    commands = json.loads((cfg.out / "commands.json").read_text())
    assert set(commands) == {"api", "server", "teacher", "env", "trainer"}
    assert "--teacher.base_url" in commands["env"] and "opd" in commands["trainer"]
    stopped = json.loads((cfg.out / "exit_codes.json").read_text())
    assert stopped["codes"]["trainer"] == 0 and stopped["killed"] == []
    page = (cfg.out / "report.html").read_text()
    assert "Reverse KL to the teacher" in page and "held-out accuracy, teacher" in page
