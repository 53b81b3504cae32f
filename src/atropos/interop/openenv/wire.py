"""OpenEnv's wire protocol, as `openenv-core` 0.3.0 speaks it, and our client of it.

An OpenEnv server keeps one environment instance per WebSocket connection to `/ws` (its HTTP
`/reset` and `/step` build a fresh instance per request, so only the WebSocket holds an
episode). The client sends JSON text frames `{"type": "reset", "data": {seed, episode_id,
...}}`, `{"type": "step", "data": <action>}`, `{"type": "state"}`, `{"type": "close"}` (and
`"mcp"` for JSON-RPC); the server answers `{"type": "observation", "data": {"observation":
{...}, "reward": float | null, "done": bool}}`, `{"type": "state", "data": {...}}` or
`{"type": "error", "data": {"message", "code"}}`, where `code` is one of `INVALID_JSON`,
`UNKNOWN_TYPE`, `VALIDATION_ERROR` (the action does not fit the schema), `EXECUTION_ERROR`
(the environment raised), `CAPACITY_REACHED`, `FACTORY_ERROR`, `SESSION_ERROR`. `GET /schema`
gives the JSON schemas of the action, observation and state; `GET /health` is `{"status":
"healthy"}`.

`Session` is that client with a deadline on every wait. Whatever goes wrong on the remote side
(unreachable, a 5xx, a timeout, a frame that is not the protocol, an error code other than
`VALIDATION_ERROR`) is an `OpenEnvError` whose `failure_kind` the runners count
(`openenv_unreachable`, `openenv_timeout`, `openenv_malformed`, `openenv_server_error`,
`openenv_capacity`; an `envs.outcome.RolloutFailed`): an infrastructure failure, never a
reward. A `VALIDATION_ERROR` is the
policy's doing (its action does not fit) and is `ActionRejected`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from atropos.envs.outcome import RolloutFailed

__all__ = ["ActionRejected", "OpenEnvError", "Session", "Step", "fetch_schema", "ws_url"]

ERROR_KINDS = {"CAPACITY_REACHED": "openenv_capacity"}


class OpenEnvError(RolloutFailed):
    """The remote OpenEnv environment failed (see the module docstring): never a reward;
    counted as `failed/<failure_kind>`."""

    def __init__(self, message: str, failure_kind: str) -> None:
        super().__init__(failure_kind, message)


class ActionRejected(ValueError):
    """The server refused the policy's action as not fitting its schema (`VALIDATION_ERROR`)."""


@dataclass
class Step:
    """One answer of `reset` or `step`: the observation's own fields, the reward, the end."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


def ws_url(base: str) -> str:
    """The WebSocket address of a server's `/ws` given its base URL.

    >>> ws_url("http://127.0.0.1:8000/"), ws_url("https://env.example")
    ('ws://127.0.0.1:8000/ws', 'wss://env.example/ws')
    """
    base = base.rstrip("/")
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(plain):
            base = secure + base[len(plain) :]
    return f"{base}/ws"


def parse_step(frame: Any) -> Step:
    """A `Step` from an answer's `data`; `OpenEnvError` (malformed) when it is not one."""
    if not isinstance(frame, dict) or not isinstance(frame.get("observation", {}), dict):
        raise OpenEnvError(f"not an OpenEnv observation: {str(frame)[:200]}", "openenv_malformed")
    reward = frame.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise OpenEnvError(f"reward {reward!r} is not a number", "openenv_malformed")
    return Step(dict(frame.get("observation") or {}), _float(reward), bool(frame.get("done")))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


class Session:
    """One episode's connection to an OpenEnv server (`async with Session(url, ...)`)."""

    def __init__(
        self, base_url: str, timeout: float, connect_timeout: float = 10.0, headers: Any = None
    ) -> None:
        self.url = ws_url(base_url)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.headers = headers
        self._ws: Any = None

    async def __aenter__(self) -> Session:
        from websockets.asyncio.client import connect

        try:
            self._ws = await connect(
                self.url,
                open_timeout=self.connect_timeout,
                additional_headers=self.headers,
                max_size=64 * 2**20,
                proxy=None,
            )
        except (OSError, TimeoutError) as err:
            raise OpenEnvError(f"{self.url} unreachable: {err}", "openenv_unreachable") from err
        except Exception as err:  # a refused handshake (4xx/5xx) or a bad address
            kind = "openenv_server_error" if "HTTP 5" in str(err) else "openenv_unreachable"
            raise OpenEnvError(f"{self.url}: {err}", kind) from err
        return self

    async def __aexit__(self, *exc: Any) -> None:
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            await asyncio.wait_for(ws.send('{"type": "close"}'), self.connect_timeout)
        except Exception:  # the server may be gone already: closing is best effort
            pass
        try:
            await asyncio.wait_for(ws.close(), self.connect_timeout)
        except Exception:
            pass

    async def call(self, message: dict[str, Any]) -> Any:
        """Send one message and return the `data` of its answer (errors raised)."""
        if self._ws is None:
            raise RuntimeError("openenv: use the session inside `async with`")
        try:
            await self._ws.send(json.dumps(message))
            raw = await asyncio.wait_for(self._ws.recv(), self.timeout)
        except TimeoutError as err:
            raise OpenEnvError(
                f"{self.url}: no answer to {message['type']} within {self.timeout:g} s",
                "openenv_timeout",
            ) from err
        except Exception as err:  # the connection closed under us
            raise OpenEnvError(f"{self.url}: {err}", "openenv_unreachable") from err
        try:
            answer = json.loads(raw)
        except (TypeError, ValueError) as err:
            raise OpenEnvError(f"{self.url}: not JSON: {raw!r:.200}", "openenv_malformed") from err
        if not isinstance(answer, dict) or "type" not in answer:
            raise OpenEnvError(f"{self.url}: not a message: {raw!r:.200}", "openenv_malformed")
        if answer["type"] == "error":
            data = answer.get("data") or {}
            code, text = str(data.get("code", "")), str(data.get("message", ""))
            if code == "VALIDATION_ERROR":
                raise ActionRejected(f"{text}: {json.dumps(data.get('errors', ''))[:500]}")
            kind = ERROR_KINDS.get(code, "openenv_server_error")
            raise OpenEnvError(f"{self.url}: {code}: {text}", kind)
        return answer.get("data")

    async def reset(self, **options: Any) -> Step:
        """Start an episode (`seed`, `episode_id` and the environment's own options)."""
        return parse_step(await self.call({"type": "reset", "data": options}))

    async def step(self, action: dict[str, Any]) -> Step:
        """Play one action."""
        return parse_step(await self.call({"type": "step", "data": action}))

    async def state(self) -> dict[str, Any]:
        """The environment's state (`episode_id`, `step_count`, its own fields)."""
        data = await self.call({"type": "state"})
        if not isinstance(data, dict):
            raise OpenEnvError(f"{self.url}: state {data!r:.200}", "openenv_malformed")
        return data


async def fetch_schema(base_url: str, timeout: float, headers: Any = None) -> dict[str, Any]:
    """The server's `GET /schema` (`action`, `observation`, `state` JSON schemas)."""
    import httpx

    url = base_url.rstrip("/") + "/schema"
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            response = await client.get(url, headers=headers)
    except httpx.TimeoutException as err:
        raise OpenEnvError(f"{url}: no answer within {timeout:g} s", "openenv_timeout") from err
    except httpx.HTTPError as err:
        raise OpenEnvError(f"{url} unreachable: {err}", "openenv_unreachable") from err
    if response.status_code >= 500:
        raise OpenEnvError(f"{url}: HTTP {response.status_code}", "openenv_server_error")
    try:
        schema = response.json()
    except ValueError:
        schema = None
    if response.status_code != 200 or not isinstance(schema, dict):
        raise OpenEnvError(
            f"{url}: HTTP {response.status_code}, not an OpenEnv schema: is this an OpenEnv"
            " server?",
            "openenv_malformed",
        )
    return schema
