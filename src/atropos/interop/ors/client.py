"""Our client of an ORS server (`wire` lists the routes): the environment's splits, tasks and
tools, and sessions that call tools.

Every failure of the server is an `ORSError` whose `failure_kind` the runners count:
`ors_unreachable` (no connection), `ors_timeout` (no answer within `timeout` seconds),
`ors_http_5xx` / `ors_http_4xx` (an error status: a 4xx means the server refused what we
asked, e.g. a task index it does not have), `ors_tool_error` (a tool raised on the server) and
`ors_protocol` (an answer that is not the protocol's). A tool call the environment refuses
(`{"ok": false}`: unknown tool, bad input, episode finished) is not a failure: the policy's
fault, it comes back as the call's result.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from atropos.inference.http import HTTPClient, HTTPResponse
from atropos.interop.ors.wire import ORSError, blocks_text, read_sse

__all__ = ["ORSClient", "ORSSession", "ToolResult"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave: its text, reward (None: none given), whether it ended the
    episode, and whether the environment refused the call (`error`)."""

    text: str
    reward: float | None = None
    finished: bool = False
    error: bool = False


class ORSClient:
    """One ORS server at `url`, its environment `env` (None: resolved by `resolve_env`).

    Requests go through `atropos.inference.http.HTTPClient` (keep-alive connections, whole
    bodies): an SSE answer is read whole and then split into its events, which is what a
    `/call` needs (its result is the `end` event; every event before it is read anyway)."""

    def __init__(
        self, url: str, env: str | None, *, api_key: str | None = None, timeout: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self.env = env
        self.timeout = timeout
        headers = {"X-API-Key": api_key, "Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = HTTPClient(headers)

    async def aclose(self) -> None:
        await self.http.close()

    async def _send(
        self, method: str, path: str, sid: str | None, payload: Any = None
    ) -> HTTPResponse:
        """One request's whole answer; ORSError when there is none or it is an error status."""
        headers = {"X-Session-ID": sid} if sid else {}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        where = f"{method} {self.url}{path}"
        try:
            response = await self.http.request(
                method, self.url + path, body, headers, timeout=self.timeout
            )
        except TimeoutError as e:
            raise ORSError("ors_timeout", f"{where}: no answer within {self.timeout:g} s") from e
        except OSError as e:  # ConnectionError included
            raise ORSError("ors_unreachable", f"{where}: {e!r}") from e
        _check(response, where)
        return response

    async def request(self, method: str, path: str, sid: str | None = None, **kw: Any) -> Any:
        """The JSON answer of one request (`json=` its body); ORSError on any failure."""
        response = await self._send(method, path, sid, kw.get("json"))
        try:
            return json.loads(response.body)
        except ValueError as e:
            raise ORSError("ors_protocol", f"{method} {self.url}{path}: not JSON") from e

    async def stream(
        self, path: str, sid: str | None, payload: dict[str, Any] | None
    ) -> tuple[str, str]:
        """POST `path` and read its SSE answer: its `task_id` and result text (the chunks
        through `end`)."""
        response = await self._send("POST", path, sid, payload)
        chunks: list[str] = []
        task_id = ""
        lines = response.body.decode("utf-8", "replace").splitlines()
        for event, data in read_sse([*lines, ""]):
            if event == "task_id":
                task_id = data.strip()
            elif event == "chunk":
                chunks.append(data)
            elif event == "end":
                return task_id, "".join([*chunks, data])
            elif event == "error":
                raise ORSError("ors_tool_error", f"{self.url}{path}: {data}")
        raise ORSError("ors_protocol", f"POST {self.url}{path}: the stream ended without 'end'")

    def path(self, suffix: str) -> str:
        return f"/{self.env}{suffix}" if self.env else suffix

    async def resolve_env(self) -> str:
        """The environment to run: `env` when given (checked), else the server's only one."""
        found = [str(e) for e in await self.request("GET", "/list_environments")]
        if self.env is None and len(found) == 1:
            self.env = found[0]
        if self.env is None or self.env.lower() not in {e.lower() for e in found}:
            given = f"no environment {self.env!r}" if self.env else "several environments"
            listed = ", ".join(f"ors:{self.url}#{e}" for e in found) or "none"
            raise ValueError(f"ors:{self.url} has {given}; name one of: {listed}")
        return self.env

    async def splits(self) -> dict[str, str]:
        """The environment's splits, name -> type (train, validation or test)."""
        found = await self.request("GET", self.path("/splits"))
        return {str(s["name"]): str(s.get("type", "validation")) for s in found}

    async def num_tasks(self, split: str) -> int:
        return int(
            (await self.request("POST", self.path("/num_tasks"), json={"split": split}))[
                "num_tasks"
            ]
        )

    async def open(self, split: str, index: int) -> ORSSession:
        """A new session on task `index` of `split`."""
        sid, _ = await self.stream("/create_session", None, None)  # the id is its `task_id`
        if not sid:
            raise ORSError("ors_protocol", f"{self.url}/create_session gave no session id")
        return await self._create(sid, split, index)

    async def _create(self, sid: str, split: str, index: int) -> ORSSession:
        session = ORSSession(self, sid)
        body = {"env_name": self.env, "split": split, "index": index}
        try:
            await self.request("POST", "/create", sid=sid, json=body)
        except BaseException:
            await asyncio.shield(session.close())
            raise
        return session


class ORSSession:
    """One session: its prompt, its tools, and tool calls."""

    def __init__(self, client: ORSClient, sid: str) -> None:
        self.client = client
        self.sid = sid
        self.closed = False

    async def prompt(self) -> list[dict[str, Any]]:
        """The task's prompt as ORS blocks."""
        found: list[dict[str, Any]] = await self.client.request(
            "GET", self.client.path("/prompt"), sid=self.sid
        )
        return found

    async def tools(self) -> dict[str, Any]:
        """`{"tools": [...], "terminal_tool": ...}` for this session's task."""
        found: dict[str, Any] = await self.client.request(
            "GET", self.client.path("/task_tools"), sid=self.sid
        )
        return found

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call tool `name`; the environment's refusal is a result with `error` set."""
        payload = {"name": name, "input": arguments}
        _, text = await self.client.stream(self.client.path("/call"), self.sid, payload)
        try:
            result = json.loads(text)
            if not result.get("ok"):
                return ToolResult(f"error: {result.get('error')}", error=True)
            output = result["output"]
            reward = output.get("reward")
            return ToolResult(
                blocks_text(output.get("blocks") or []),
                None if reward is None else float(reward),
                bool(output.get("finished")),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ORSError("ors_protocol", f"/call answered {text[:200]!r}") from e

    async def close(self) -> None:
        """Delete the session on the server (once; failures ignored: the server reaps it)."""
        if self.closed:
            return
        self.closed = True
        for path in ("/delete", "/delete_session"):
            try:
                await self.client.request("POST", path, sid=self.sid)
            except ORSError:
                return


def _check(response: HTTPResponse, where: str) -> None:
    """ORSError for an error status, with the server's detail."""
    status = response.status
    if status < 400:
        return
    text = response.body.decode("utf-8", "replace")
    try:
        found = json.loads(text)
        detail = str(found.get("detail", text) if isinstance(found, dict) else text)[:300]
    except ValueError:
        detail = text[:300]
    kind = "ors_http_5xx" if status >= 500 else "ors_http_4xx"
    raise ORSError(kind, f"{where}: HTTP {status}: {detail}")
