"""Readiness gates: is a started process ready for the ones that depend on it?

Each check is one short HTTP request (2 s timeout) that answers True, False (not yet) or
raises nothing: a refused connection is "not yet". The supervisor polls a gate until it passes,
the process exits, or the process's deadline passes.

- API: `GET /health` answers 200.
- Inference server: `GET /health` (vLLM, SGLang, ours) or `GET /v1/models` (any OpenAI server).
- Trainer: `GET /stats` of the API says `registered`.
- Environment: `GET /stats` lists an env whose `env_key` is the process's and whose
  `registrations` count grew since the process started (a restarted env is ready when it has
  registered again, not when its old record is found).
"""

from __future__ import annotations

from typing import Any

import httpx

from atropos.launch.plan import Gate

TIMEOUT = 2.0


def _get(url: str, key: str | None) -> httpx.Response | None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(url, headers=headers, timeout=TIMEOUT)
    except httpx.HTTPError:
        return None


def _stats(api_url: str, key: str | None) -> dict[str, Any] | None:
    answer = _get(f"{api_url.rstrip('/')}/stats", key)
    if answer is None or answer.status_code != 200:
        return None
    try:
        doc = answer.json()
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def registrations(api_url: str, env_key: str, key: str | None) -> int:
    """How often the env with `env_key` registered since the API started (0: never, or the
    API is not answering)."""
    doc = _stats(api_url, key)
    for entry in (doc or {}).get("envs", {}).values():
        if isinstance(entry, dict) and entry.get("env_key") == env_key:
            return int(entry.get("registrations", 0) or 0)
    return 0


def check(gate: Gate, url: str, key: str | None, baseline: int = 0) -> bool:
    """Whether the gate passes now; `url` is the gate's URL filled in, `baseline` the env's
    registrations count read before the process started."""
    if gate.kind == "none":
        return True
    if gate.kind == "http":
        answer = _get(url, key)
        return answer is not None and answer.status_code == 200
    if gate.kind == "inference":
        root = url.rstrip("/").removesuffix("/v1")
        for path in ("/health", "/v1/models"):
            answer = _get(root + path, key)
            if answer is not None and answer.status_code == 200:
                return True
        return False
    if gate.kind == "trainer":
        doc = _stats(url, key)
        return bool(doc and doc.get("registered"))
    assert gate.env_key is not None
    return registrations(url, gate.env_key, key) > baseline


def describe(gate: Gate, url: str) -> str:
    """What the gate waits for, in words (for messages)."""
    return {
        "none": "nothing",
        "http": f"GET {url} to answer 200",
        "inference": f"{url.rstrip('/').removesuffix('/v1')}/health or /v1/models to answer 200",
        "trainer": f"the trainer to register with the API at {url}",
        "env": f"the environment to register with the API at {url} (env_key {gate.env_key})",
    }[gate.kind]
