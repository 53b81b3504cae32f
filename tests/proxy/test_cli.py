"""`atropos proxy serve`: servers configured as an environment's, the bind rule, signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import openai

from atropos.demo import wait_until_up
from atropos.testing import FakeInferenceServer, free_port


def run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "atropos", "proxy", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_refuses_a_public_bind_without_a_key():
    done = run("serve", "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0 without an API key" in done.stderr


def test_a_misspelt_server_flag_is_one_clear_error():
    done = run("serve", "--openai.base_ulr", "http://127.0.0.1:1/v1")
    assert done.returncode == 2 and "--openai.base_url" in done.stderr
    assert "Traceback" not in done.stderr


def test_serves_the_servers_given_as_flags_and_stops_on_sigterm(tmp_path):
    port = free_port()
    with FakeInferenceServer(responder=lambda prompt: "hello") as fake:
        fake_url = fake.base_url
        command = [
            sys.executable, "-m", "atropos", "proxy", "serve", "--port", str(port),
            "--openai.base_url", fake.base_url, "--openai.model_name", "atropos-tiny",
            "--openai.server_type", "vllm", "--max-turns", "3",
        ]  # fmt: skip
        log = (tmp_path / "proxy.log").open("w+")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(f"{url}/health", deadline=60)
            assert httpx.get(f"{url}/health").json()["model"] == "atropos-tiny"
            session = httpx.post(f"{url}/sessions").json()
            client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
            reply = client.chat.completions.create(
                model="atropos-tiny", messages=[{"role": "user", "content": "hi"}]
            )
            assert reply.choices[0].message.content == "hello"
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) in (0, -15)
            assert time.monotonic() - started < 10
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        text = log.read()
    assert f"atropos proxy: http://127.0.0.1:{port} -> {fake_url} (vllm)" in text
    assert "Traceback" not in text
