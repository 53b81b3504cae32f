"""The API key never has to be on a command line: `--api-key-file PATH` or `ATROPOS_API_KEY`;
`--api-key KEY` still works, with a one-line warning naming both safe ways."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atropos.cli.api import config_from_args
from atropos.cli.main import build_parser
from atropos.demo import wait_until_up
from atropos.testing import free_port

KEY = "s3cret-key-value"


def test_key_from_a_file_and_from_the_environment(tmp_path, monkeypatch, capsys):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    args = build_parser().parse_args(["api", "serve", "--api-key-file", str(key_file)])
    assert config_from_args(args).api_key == KEY
    monkeypatch.setenv("ATROPOS_API_KEY", "from-env")
    args = build_parser().parse_args(["api", "serve"])
    assert config_from_args(args).api_key == "from-env"
    assert capsys.readouterr().err == ""  # no warning for either safe way


def test_the_flag_still_works_with_a_warning(monkeypatch, capsys):
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    args = build_parser().parse_args(["api", "serve", "--api-key", KEY])
    assert config_from_args(args).api_key == KEY
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "/proc" in err[0]
    assert "--api-key-file" in err[0] and "$ATROPOS_API_KEY" in err[0] and KEY not in err[0]


@pytest.mark.parametrize("content", [None, ""])
def test_an_unreadable_or_empty_key_file_is_a_usage_error(tmp_path, capsys, content):
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["api", "serve", "--api-key-file", str(path)])
    assert stop.value.code == 2 and "--api-key-file" in capsys.readouterr().err


def test_a_served_key_from_a_file_is_enforced_and_not_on_the_command_line(tmp_path: Path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "ATROPOS_API_KEY"}
    cmd = [sys.executable, "-m", "atropos", "api", "serve", "--port", str(port)]
    cmd += ["--store", "memory", "--api-key-file", str(key_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/health", deadline=30)
        assert httpx.get(f"{url}/status").status_code == 401
        ok = httpx.get(f"{url}/status", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert KEY.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert b"warning" not in err
