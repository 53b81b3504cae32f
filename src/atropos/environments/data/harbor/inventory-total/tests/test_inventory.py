"""Checks of the inventory package, run from /srv/shop by /tests/test.sh."""

import subprocess
import sys

sys.path.insert(0, "/srv/shop")

from inventory.store import Store, sample_store  # noqa: E402


def test_total_value():
    store = Store()
    store.add("a", 2, 1.5)
    store.add("b", 1, 4.0)
    assert store.total_value() == 7.0
    assert sample_store().total_value() == 12.0


def test_report_ends_with_total():
    out = subprocess.run(
        [sys.executable, "-m", "inventory"],
        cwd="/srv/shop",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.strip().splitlines()
    assert lines[0] == "pencil 10 x 0.25 EUR"
    assert lines[-1] == "TOTAL 12.00 EUR"
    assert len(lines) == 4
