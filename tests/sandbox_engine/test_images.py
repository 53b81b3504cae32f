"""Local images without a registry (atropos.images, `atropos sandbox image build`): the
sandbox tests' Debian image runs python3; a Dockerfile build is saved to the cache and loaded
from it; an image that is not present is one clear error within seconds, never a pull."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from atropos import images
from atropos.cli import sandbox as sandbox_cli
from atropos.cli.main import main as atropos_main

MISSING = "python:3.11-slim"


def test_sandbox_image_runs_python(docker_engine: Any, sandbox_image: str) -> None:
    script = "import sys; print(1); print(sys.version_info[0])"
    done = docker_engine.docker(
        ["run", "--rm", "--network", "none", sandbox_image, "python3", "-c", script]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "3"]
    tools = docker_engine.docker(
        [
            "run",
            "--rm",
            "--network",
            "none",
            sandbox_image,
            "bash",
            "-c",
            "python3 -m pytest --version",
        ]
    )
    assert tools.returncode == 0 and "pytest" in tools.stdout + tools.stderr


def test_a_missing_image_is_one_clear_error_fast(docker_engine: Any) -> None:
    began = time.monotonic()
    with pytest.raises(images.ImageMissing) as caught:
        images.require_image(MISSING, env=docker_engine.environ)
    assert time.monotonic() - began < 5
    message = str(caught.value)
    assert MISSING in message and images.stand_in_command(MISSING) in message
    assert "\n" not in message


def test_a_dockerfile_from_a_missing_image_fails_fast(
    docker_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    (tmp_path / "Dockerfile").write_text(f"FROM {MISSING}\nRUN true\n")
    began = time.monotonic()
    code = atropos_main(
        ["sandbox", "image", "build", "task:1", str(tmp_path), "--cache", str(tmp_path)]
    )
    assert time.monotonic() - began < 5
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and MISSING in err and images.stand_in_command(MISSING) in err
    # the engine itself never pulls either: --pull never, and its proxy refuses at once
    began = time.monotonic()
    run = docker_engine.docker(["run", "--rm", "--pull", "never", MISSING, "true"], timeout=10)
    assert run.returncode != 0 and time.monotonic() - began < 5


def test_a_dockerfile_build_is_saved_and_loaded(
    docker_engine: Any, sandbox_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("DOCKER_HOST", docker_engine.host)
    context, cache = tmp_path / "ctx", tmp_path / "cache"
    context.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {sandbox_image} AS base\nFROM base\nRUN echo built > /marker\n"
    )
    name = "atropos-test-derived:1"
    build = ["sandbox", "image", "build", name, str(context), "--cache", str(cache)]
    hows = []
    for remove_first in (False, False, True):
        if remove_first:
            assert docker_engine.docker(["rmi", name]).returncode == 0
        assert sandbox_cli.main(build[1:]) == 0
        hows.append(capsys.readouterr().out.split()[1])
    assert hows == ["built", "present", "loaded"]
    assert [p.name for p in cache.iterdir()] == [images.archive_name(name, _key(context))]
    done = docker_engine.docker(["run", "--rm", "--network", "none", name, "cat", "/marker"])
    assert done.stdout.strip() == "built"
    docker_engine.docker(["rmi", name])


def _key(context: Path) -> str:
    return images.Dockerfile(context).key()


def test_cli_usage_errors(capsys: Any) -> None:
    with pytest.raises(SystemExit) as caught:
        sandbox_cli.main(["image", "build", "x:1"])
    assert caught.value.code == 2
    assert "--debian" in capsys.readouterr().err
