"""docs/proxy.md's quick start, as a new user runs it: the doc's commands as real processes
(`atropos local serve tiny`, `atropos proxy serve`), then the doc's `my_agent.py`, an OpenAI
Agents SDK agent (the real `openai-agents`), saved and run as the doc says.

The code is read from the doc, so the doc is what is tested. The servers listen on free ports
instead of the defaults (8000, 9100) the doc uses, the proxy named its server with
`--openai.base_url` and the agent the proxy's URL in place of the doc's; nothing else changes.
The agent's run must end without a traceback, without the SDK's `ModelBehaviorError` (a call
cut at a small default `max_output_tokens`) and without its tracing noise (offline, its trace
upload fails: `[non-fatal] Tracing request failed`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from atropos.testing import free_port

from .walk import background

pytest.importorskip("agents")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "proxy.md"
PROXY_URL = "http://127.0.0.1:9100"  # the proxy's address in the doc (its default)
pytestmark = pytest.mark.slow


def quick_start() -> list[tuple[str, str]]:
    """The quick start's code blocks, in order, as (language, code)."""
    text = DOC.read_text()
    found = re.search(r"^## Quick start\n(.*?)^## ", text, re.DOTALL | re.MULTILINE)
    assert found, f"{DOC} has no '## Quick start' section"
    return re.findall(r"```(\w+)\n(.*?)```", found.group(1), re.DOTALL)


def commands(block: str) -> list[list[str]]:
    """A bash block's commands, without comments, each split as the shell splits it."""
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def environ() -> dict[str, str]:
    """A new user's environment: no key of OpenAI's, no tracing switch of the SDK's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_AGENTS_DISABLE_TRACING"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    """The quick start's first block, run: the local server and the proxy, each in the
    background as its `&` says. Yields the proxy's URL and the servers' logs."""
    (lang, block), *_ = quick_start()
    assert lang == "bash"
    serve, proxy = commands(block)
    assert serve == ["atropos", "local", "serve", "tiny", "&"], serve
    assert proxy == ["atropos", "proxy", "serve", "&"], proxy
    logs = tmp_path_factory.mktemp("servers")
    local_port, proxy_port = free_port(), free_port()
    local_url, proxy_url = f"http://127.0.0.1:{local_port}", f"http://127.0.0.1:{proxy_port}"
    runs = [
        ([*serve[1:-1], "--port", str(local_port)], local_url, 90),
        (
            [*proxy[1:-1], "--port", str(proxy_port), "--openai.base_url", local_url + "/v1"],
            proxy_url,
            60,
        ),
    ]
    paths = []
    with contextlib.ExitStack() as started:
        for i, (args, url, within) in enumerate(runs):
            path = logs / f"server{i}.log"
            argv = [sys.executable, "-m", "atropos", *args]
            started.enter_context(background(argv, path, env=environ(), health=url, within=within))
            paths.append(path)
        yield proxy_url, paths


def test_the_quick_starts_agent_runs_offline_and_quietly(servers, tmp_path):
    proxy_url, logs = servers
    _, (lang, agent), (shell, run) = quick_start()
    assert (lang, shell) == ("python", "bash")
    assert commands(run) == [["python", "my_agent.py"]]
    assert PROXY_URL in agent, f"the doc's agent no longer names {PROXY_URL}"
    (tmp_path / "my_agent.py").write_text(agent.replace(PROXY_URL, proxy_url))
    done = subprocess.run(
        [sys.executable, "my_agent.py"],
        cwd=tmp_path,
        env=environ(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    for noise in ("Traceback", "ModelBehaviorError", "Tracing request failed", "[non-fatal]"):
        assert noise not in output, output[-3000:]
    found = re.search(r"^(\d+) call\(s\), (\d+) tokens generated$", done.stdout, re.MULTILINE)
    assert found, done.stdout
    assert int(found.group(1)) >= 1 and int(found.group(2)) >= 1
    for log in logs:
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
