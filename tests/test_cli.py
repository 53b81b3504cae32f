"""The command line: `atropos api serve`, `run-api`, and the bind-address safety rule."""

from __future__ import annotations

import subprocess
import sys

import httpx

from atropos.cli.main import build_parser
from atropos.demo import wait_until_up
from atropos.testing import free_port


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "atropos", *args], capture_output=True, text=True, timeout=timeout
    )


def test_refuses_a_public_bind_without_a_key():
    done = run("api", "serve", "--host", "0.0.0.0", "--store", "memory")
    assert done.returncode != 0
    assert "refusing to bind 0.0.0.0 without an API key" in done.stderr


def test_unknown_store_is_a_clear_error(tmp_path):
    done = run("api", "serve", "--store", "postgres:x", "--port", str(free_port()))
    assert done.returncode != 0 and "unknown store 'postgres:x'" in done.stderr


def test_run_api_compat_command_serves_on_loopback(tmp_path):
    port = free_port()
    code = "from atropos.cli.compat import run_api; run_api()"
    cmd = [sys.executable, "-c", code, "--port", str(port), "--store", "memory", "--reload"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/", deadline=30)
        assert httpx.get(f"http://127.0.0.1:{port}/").json() == {"message": "AtroposLib API"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) in (0, -15)  # graceful; uvicorn re-raises SIGTERM


def test_serve_defaults_to_loopback_and_a_sqlite_store_under_the_run_dir():
    args = build_parser().parse_args(["api", "serve"])
    assert args.host == "127.0.0.1" and args.port == 8000
    from atropos.cli.api import config_from_args

    assert config_from_args(args).store == "sqlite:runs/api.db"


def test_help_lists_the_nouns():
    done = run("--help")
    assert done.returncode == 0 and "api" in done.stdout and "demo" in done.stdout
