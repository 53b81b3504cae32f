"""`make bench-smoke`'s limit (benchmarks/smoke.py): 2x the baseline, grown on a machine where
the reference work costs more than on the baseline's, never shrunk on a faster one."""

from __future__ import annotations

from pathlib import Path

import pytest

from atropos.testing import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "smoke.py"


@pytest.mark.parametrize(
    ("then", "now", "limit"),
    [(None, 1000.0, 2.0), (1000.0, 1000.0, 2.0), (1000.0, 1900.0, 3.8), (1000.0, 500.0, 2.0)],
)
def test_the_limit_grows_with_a_slower_machine_only(
    monkeypatch: pytest.MonkeyPatch, then: float | None, now: float, limit: float
) -> None:
    smoke = load_script(SCRIPT)
    monkeypatch.setattr(smoke, "calibrate", lambda: now)
    assert smoke.machine_limit(then) == pytest.approx(limit)
    found = {"packer_us_per_batch": 3.0 * 100}
    failed = smoke.verdicts(found, {"packer_us_per_batch": 100.0}, smoke.machine_limit(then))
    assert failed[0].lstrip().startswith("FAIL" if limit < 3.0 else "ok")


def test_the_reference_work_is_measured_and_the_baseline_keeps_it() -> None:
    smoke = load_script(SCRIPT)
    assert smoke.calibrate() > 0
    assert smoke.load_baseline(smoke.BASELINE)["calibration_us"] > 0
