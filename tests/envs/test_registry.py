"""The environment registry: lazy targets, entry points, did-you-mean, and `atropos env`."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import atropos.envs.runner
from atropos.cli.main import main as atropos_main
from atropos.envs import registry
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.inference.config import ServerBaseline

ENV_MODULE = '''
"""A throwaway environment module (imported only on lookup)."""
from atropos.envs.config import BaseEnvConfig
from atropos.inference.config import ServerBaseline


class Env:
    """Counts words, for tests."""

    name = "words"

    @classmethod
    def config_init(cls):
        return BaseEnvConfig(group_size=2), ServerBaseline()


def not_a_class():
    pass
'''


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """An empty registry, no installed entry points, and an importable module `words_env_*`."""
    monkeypatch.setattr(registry, "_registered", {})
    fake_entry_points([], monkeypatch)
    for var in [v for v in os.environ if v.startswith("ATROPOS_")]:
        monkeypatch.delenv(var)
    (tmp_path / f"words_env_{tmp_path.name}.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def module_name(tmp_path: Path) -> str:
    return f"words_env_{tmp_path.name}"


def fake_entry_points(entries: list[tuple[str, str]], monkeypatch) -> None:
    eps = [importlib.metadata.EntryPoint(n, v, registry.ENTRY_POINT_GROUP) for n, v in entries]
    other = importlib.metadata.EntryPoint("x", "os:path", "console_scripts")

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        return [ep for ep in [*eps, other] if ep.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_register_imports_lazily_on_lookup(tmp_path):
    mod = module_name(tmp_path)
    registry.register("words-v1", f"{mod}:Env")
    assert mod not in sys.modules and registry.names() == ["words-v1"]
    env_cls = registry.get("words-v1")
    assert env_cls.__name__ == "Env" and mod in sys.modules
    assert registry.describe("words-v1") == "Counts words, for tests."


def test_register_a_class_and_a_description():
    class Local:
        """Local env."""

    registry.register("local-v1", Local, description="one line")
    assert registry.get("local-v1") is Local and registry.describe("local-v1") == "one line"


def test_registering_twice(tmp_path):
    target = f"{module_name(tmp_path)}:Env"
    registry.register("words-v1", target)
    registry.register("words-v1", target)  # the same target again: fine
    with pytest.raises(ValueError, match="already registered as"):
        registry.register("words-v1", "other.module:Env")


@pytest.mark.parametrize(
    "name, target, message",
    [
        ("bad name", "a.b:C", "environment names are"),
        ("ok", "a.b.C", "expected an entry point 'package.module:Class'"),
        ("ok", "a.b:", "expected an entry point"),
    ],
)
def test_malformed_registrations(name, target, message):
    with pytest.raises(ValueError, match=message):
        registry.register(name, target)


def test_unknown_names_suggest_the_closest_and_list_them_all(tmp_path):
    registry.register("gsm8k-v1", f"{module_name(tmp_path)}:Env")
    registry.register("math-v1", f"{module_name(tmp_path)}:Env")
    with pytest.raises(registry.EnvNotFound) as exc:
        registry.get("gsm8k-v2")
    assert str(exc.value) == (
        "unknown environment 'gsm8k-v2'; did you mean 'gsm8k-v1'? (installed: gsm8k-v1, math-v1)"
    )
    with pytest.raises(LookupError, match="none are installed"):
        registry._registered.clear() or registry.get("gsm8k-v1")


def test_entry_points_are_found_and_loaded_lazily(tmp_path, monkeypatch):
    mod = module_name(tmp_path)
    fake_entry_points(
        [("words-ep-v1", f"{mod}:Env"), ("broken-v1", "no_such_module_xyz:Env")], monkeypatch
    )
    assert registry.names() == ["broken-v1", "words-ep-v1"]
    assert mod not in sys.modules
    assert registry.specs()["words-ep-v1"].origin.startswith("entry point")
    assert registry.get("words-ep-v1").name == "words"
    assert registry.describe("words-ep-v1") == "Counts words, for tests."
    with pytest.raises(ImportError, match="broken-v1.*cannot import no_such_module_xyz"):
        registry.get("broken-v1")
    assert registry.describe("broken-v1").startswith(
        "(unavailable: environment 'broken-v1': cannot"
    )
    with pytest.raises(registry.EnvNotFound, match="did you mean 'words-ep-v1'"):
        registry.get("words-ep")


def test_an_explicit_registration_wins_over_an_entry_point(tmp_path, monkeypatch):
    fake_entry_points([("words-v1", "no_such_module_xyz:Env")], monkeypatch)
    registry.register("words-v1", f"{module_name(tmp_path)}:Env")
    assert registry.get("words-v1").name == "words"


def test_plugins_that_export_the_wrong_thing_say_what_to_export(tmp_path, monkeypatch):
    mod = module_name(tmp_path)
    fake_entry_points([("fn-v1", f"{mod}:not_a_class"), ("gone-v1", f"{mod}:Gone")], monkeypatch)
    with pytest.raises(TypeError, match="is a function, not a class; export the environment class"):
        registry.get("fn-v1")
    with pytest.raises(ImportError, match="has no attribute 'Gone'"):
        registry.get("gone-v1")


def test_module_colon_class_needs_no_registration(tmp_path):
    assert registry.get(f"{module_name(tmp_path)}:Env").name == "words"


def test_atropos_env_list(tmp_path, monkeypatch, capsys):
    fake_entry_points([("words-ep-v1", f"{module_name(tmp_path)}:Env")], monkeypatch)
    registry.register("a-v1", BaseEnvConfig, description="the first one")
    assert atropos_main(["env", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "NAME         SOURCE   ORIGIN       DESCRIPTION",
        "a-v1         builtin  built in     the first one",  # registered, but an atropos class
        "words-ep-v1  plugin   entry point  Counts words, for tests.",  # no distribution behind it
    ]


def test_atropos_env_list_when_nothing_is_installed(capsys):
    assert atropos_main(["env", "list"]) == 0
    assert "no environments installed" in capsys.readouterr().out


def test_atropos_env_serve_resolves_and_runs(tmp_path, monkeypatch, capsys):
    seen: list[tuple[type, ResolvedConfig]] = []
    monkeypatch.setattr(atropos.envs.runner, "run", lambda c, r: seen.append((c, r)) or 0)
    registry.register("words-v1", f"{module_name(tmp_path)}:Env")
    argv = ["env", "process", "words-v1", "--env.group_size", "3", "--openai.base_url", "http://h"]
    assert atropos_main(argv) == 0
    ((env_cls, resolved),) = seen
    assert env_cls.name == "words" and resolved.mode == "process"
    assert (
        resolved.env.group_size == 3 and resolved.env.data_path_to_save_groups == "data/words.jsonl"
    )
    assert resolved.servers[0].base_url == "http://h"
    assert not isinstance(resolved.servers, ServerBaseline)


def test_atropos_env_errors(tmp_path, capsys):
    registry.register("words-v1", f"{module_name(tmp_path)}:Env")
    assert atropos_main(["env", "serve", "word-v1"]) == 2
    assert "did you mean 'words-v1'?" in capsys.readouterr().err
    assert atropos_main(["env", "serve", "words-v1", "--env.groupsize", "3"]) == 2
    err = capsys.readouterr().err
    assert "atropos env serve words-v1: error: unknown flag --env.groupsize" in err
    assert "did you mean --env.group_size?" in err
    assert atropos_main(["env", "evaluate", "no_such_module_xyz:Env"]) == 1


def test_the_installed_command_end_to_end(tmp_path):
    """`python -m atropos env ...` in a fresh process: help, and a rejected flag (exit 2)."""
    target = f"{module_name(tmp_path)}:Env"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    env = {k: v for k, v in env.items() if not k.startswith("ATROPOS_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "atropos", "env", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)

    done = run("serve", target, "--help")
    assert done.returncode == 0 and "--env.group_size INT" in done.stdout
    assert "(default: 2)" in done.stdout
    done = run("process", target, "--env.max_num_workers", "-1", "--evn.group_size", "2")
    assert done.returncode == 2
    assert "unknown flag --evn.group_size; did you mean --env.group_size?" in done.stderr
    assert textwrap.dedent(done.stdout) == ""
