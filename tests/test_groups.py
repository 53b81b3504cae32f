"""The test suite's own grouping (tests/conftest.py): a test that uses a heavy session fixture
(a vLLM venv, the Docker engine, ...) outside the files of its group stops the run at
collection, naming the file and the group, so two xdist workers never each build one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USING_DOCKER = """
def test_runs_a_container(docker_engine):
    pass
"""


def _collect(where: Path, test_file: str) -> subprocess.CompletedProcess[str]:
    """Collect a suite of our conftest and one test file at `test_file` under `where`."""
    (where / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", where / "tests" / "conftest.py")
    (where / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib\n")
    path = where / test_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USING_DOCKER)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, "-n", "0", "tests"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_heavy_fixture_outside_its_group_stops_collection_naming_the_file(tmp_path):
    done = _collect(tmp_path, "tests/elsewhere/test_misplaced.py")
    said = done.stdout + done.stderr
    assert done.returncode == 4, said  # pytest's usage error
    assert (
        "tests/elsewhere/test_misplaced.py uses docker_engine: add it to _GROUPS as 'docker'"
        in said
    )
    assert "Traceback" not in said


def test_the_same_test_inside_its_group_is_collected(tmp_path):
    done = _collect(tmp_path, "tests/sandbox_engine/test_placed.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 test collected" in done.stdout
