"""`atropos env list`: where each environment comes from (built in, an installed package and
its version, registered), and broken plugins listed with their error, never fatal.

Plugins are simulated by `.dist-info` folders on `sys.path`, as pip would install them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import atropos
from atropos.cli.main import main as atropos_main
from atropos.envs import registry

GOOD_MODULE = '''
"""A third-party environment module."""


class Quiz:
    """Quiz questions, for tests."""
'''


def install_plugin(site: Path, name: str, version: str, entry_points: str) -> None:
    """A distribution `name` `version` in `site` whose `entry_points.txt` is `entry_points`."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)


def table(out: str) -> dict[str, tuple[str, str]]:
    """`env list`'s rows: name -> (origin, description), read by the header's columns."""
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "SOURCE", "ORIGIN", "DESCRIPTION"]
    origin_at, text_at = header.index("ORIGIN"), header.index("DESCRIPTION")
    found = {}
    for row in rows:
        if row.startswith("(not listed: "):
            continue
        name, origin, text = row[: header.index("SOURCE")], row[origin_at:text_at], row[text_at:]
        found[name.strip()] = (origin.strip(), text)
    return found


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A working plugin `good-plugin 2.3` and a broken one, `broken-plugin 1.0`, installed."""
    monkeypatch.setattr(registry, "_registered", {})
    site = tmp_path / "site"
    (site / "quiz_plugin_mod.py").parent.mkdir(parents=True)
    (site / "quiz_plugin_mod.py").write_text(GOOD_MODULE)
    (site / "crash_plugin_mod.py").write_text('raise RuntimeError("boom\\nsecond line")\n')
    install_plugin(
        site, "good-plugin", "2.3", "[atropos.environments]\nquiz = quiz_plugin_mod:Quiz\n"
    )
    install_plugin(
        site,
        "broken-plugin",
        "1.0",
        "[atropos.environments]\n"
        "broken-missing = no_such_module_xyz_q:Env\n"
        "broken-malformed = not a target\n"
        "broken-crash = crash_plugin_mod:Env\n",
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def test_origins_of_builtin_installed_and_registered_environments(plugins, capsys):
    class Mine:
        """Registered in a test."""

    registry.register("mine-v1", Mine)
    registry.register("ours-v1", "atropos.environments.arithmetic:Arithmetic")
    assert atropos_main(["env", "list"]) == 0
    rows = table(capsys.readouterr().out)
    assert rows["arithmetic"][0] == "built in"  # an entry point of atropos-rl
    assert rows["ours-v1"][0] == "built in"  # registered, but atropos' own
    assert rows["mine-v1"] == ("registered", "Registered in a test.")
    assert rows["quiz"] == ("good-plugin 2.3", "Quiz questions, for tests.")
    assert registry.specs()["quiz"].origin == "good-plugin 2.3"


def test_broken_plugins_are_listed_with_their_error(plugins, capsys):
    assert atropos_main(["env", "list"]) == 0
    out = capsys.readouterr().out
    rows = table(out)
    assert rows["broken-missing"] == (
        "broken-plugin 1.0",
        "(unavailable: environment 'broken-missing': cannot import no_such_module_xyz_q:"
        " No module named 'no_such_module_xyz_q')",
    )
    assert rows["broken-malformed"] == (
        "broken-plugin 1.0",
        "(unavailable: environment 'broken-malformed': expected 'package.module:Class', got"
        " 'not a target' (an entry point in group 'atropos.environments' must name the"
        " environment class))",
    )
    assert rows["broken-crash"] == (
        "broken-plugin 1.0",
        "(unavailable: environment 'broken-crash': importing crash_plugin_mod raised"
        " RuntimeError('boom\\nsecond line'))",  # one line
    )
    assert rows["quiz"][0] == "good-plugin 2.3" and rows["arithmetic"][0] == "built in"
    with pytest.raises(ImportError, match="cannot import no_such_module_xyz_q"):
        registry.get("broken-missing")  # looking it up still says what is wrong


def test_an_unreadable_entry_points_file_is_named_not_fatal(plugins):
    """A malformed `entry_points.txt` makes `importlib.metadata.entry_points()` raise for every
    caller; `env list` reads the others one by one (in a fresh process: the file would break
    this one's other users of entry points too)."""
    install_plugin(plugins, "garbled-plugin", "0.2", "[atropos.environments]\nno equals sign\n")
    source = str(Path(atropos.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATROPOS_")}
    env["PYTHONPATH"] = os.pathsep.join([source, str(plugins)])
    done = subprocess.run(
        [sys.executable, "-m", "atropos", "env", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # the list imports every environment module to describe it
    )
    assert done.returncode == 0, done.stderr
    rows = table(done.stdout)
    assert rows["quiz"][0] == "good-plugin 2.3" and rows["arithmetic"][0] == "built in"
    assert "broken-missing" in rows
    [line] = [row for row in done.stdout.splitlines() if row.startswith("(not listed: ")]
    assert line.startswith("(not listed: garbled-plugin 0.2: its entry points cannot be read: "), (
        line
    )
