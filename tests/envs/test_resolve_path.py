"""Environment targets a user points at: `path/env.py`, `path/env.py:Class`, and `module:Class`
found from the current directory; unknown names keep their suggestions."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import atropos.envs.runner
from atropos.cli.main import main as atropos_main
from atropos.envs import registry
from atropos.envs.config import ResolvedConfig

ENV_FILE = '''
"""A small environment, written as docs/environments.md shows."""
from atropos.envs import Env


class CountVowels(Env):
    """Counts vowels."""

    name = "vowels"

    def load(self):
        return [{"question": "How many vowels in 'banana'?", "answer": "3"}]

    def score(self, item, completion):
        return 1.0 if item["answer"] in completion else -1.0
'''
SECOND_ENV = """

class CountConsonants(CountVowels):
    name = "consonants"
"""


@pytest.fixture
def in_env_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """cwd is a temp directory holding a uniquely named env file, which is not on sys.path
    (as under the installed `atropos` command); the module is forgotten afterwards."""
    stem = f"vowels_{tmp_path.name}"
    (tmp_path / f"{stem}.py").write_text(ENV_FILE)
    monkeypatch.chdir(tmp_path)
    here = os.path.realpath(tmp_path)
    kept = [p for p in sys.path if p and os.path.realpath(p) != here]
    monkeypatch.setattr(sys, "path", kept)
    monkeypatch.setattr(registry, "_registered", {})
    yield stem
    for name in [m for m in sys.modules if m.endswith(stem)]:
        del sys.modules[name]


def test_a_file_alone_gives_its_one_environment_class(in_env_dir):
    cls = registry.get(f"{in_env_dir}.py")
    assert cls.__name__ == "CountVowels" and cls.name == "vowels"
    assert registry.get(f"./{in_env_dir}.py") is cls  # the same module, imported once


def test_a_file_with_a_class(in_env_dir, tmp_path):
    cls = registry.get(f"{tmp_path}/{in_env_dir}.py:CountVowels")
    assert cls.__name__ == "CountVowels"
    with pytest.raises(registry.EnvNotFound, match="did you mean 'CountVowels'"):
        registry.get(f"{in_env_dir}.py:CountVowel")


def test_module_class_resolves_from_the_current_directory(in_env_dir):
    cls = registry.get(f"{in_env_dir}:CountVowels")
    assert cls.__name__ == "CountVowels" and cls.__module__ == in_env_dir


def test_a_file_with_several_classes_lists_them(in_env_dir):
    Path(f"{in_env_dir}.py").write_text(ENV_FILE + SECOND_ENV)
    with pytest.raises(registry.EnvNotFound) as exc:
        registry.get(f"{in_env_dir}.py")
    message = str(exc.value)
    assert "defines 2 environment classes" in message
    assert f"{in_env_dir}.py:CountVowels" in message
    assert f"{in_env_dir}.py:CountConsonants" in message
    assert registry.get(f"{in_env_dir}.py:CountConsonants").name == "consonants"


def test_bad_files_get_one_clear_error(in_env_dir):
    with pytest.raises(registry.EnvNotFound, match="'missing.py' not found"):
        registry.get("missing.py")
    Path("plain.py").write_text("X = 1\n")
    with pytest.raises(registry.EnvNotFound, match="defines no environment class"):
        registry.get("plain.py")
    Path("broken_env.py").write_text("from atropos.envs import Env\n\nclass E(Env:\n")
    with pytest.raises(ImportError, match=r"broken_env.py: line 3: SyntaxError"):
        registry.get("broken_env.py")
    Path("raises_env.py").write_text(textwrap.dedent("import os\n\nundefined_name\n"))
    with pytest.raises(ImportError, match=r"line 3: NameError"):
        registry.get("raises_env.py")


def test_unknown_names_keep_their_suggestions(in_env_dir):
    registry.register("vowels-v1", f"{in_env_dir}:CountVowels")
    with pytest.raises(registry.EnvNotFound, match="did you mean 'vowels-v1'"):
        registry.get("vowel-v1")


@pytest.mark.parametrize(
    "form", ["{stem}.py", "./{stem}.py", "{stem}.py:CountVowels", "{stem}:CountVowels"]
)
def test_atropos_env_process_takes_each_form(in_env_dir, monkeypatch, form):
    seen: list[tuple[type, ResolvedConfig]] = []
    monkeypatch.setattr(atropos.envs.runner, "run", lambda c, r: seen.append((c, r)) or 0)
    target = form.format(stem=in_env_dir)
    assert atropos_main(["env", "process", target, "--env.total_steps", "2"]) == 0
    ((env_cls, resolved),) = seen
    assert env_cls.__name__ == "CountVowels" and resolved.env.total_steps == 2


def test_a_file_runs_end_to_end_against_the_fake_server(in_env_dir, tmp_path, capsys):
    out = tmp_path / "out" / "vowels.jsonl"
    argv = ["env", "process", f"{in_env_dir}.py", "--testing", "--env.total_steps", "2"]
    argv += ["--env.data_path_to_save_groups", str(out), "--env.use_wandb", "false"]
    assert atropos_main(argv) == 0
    assert len(out.read_text().splitlines()) == 2
