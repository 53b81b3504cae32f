"""`FakeJudge`: a loopback OpenAI chat server that behaves like a judge provider, for tests
and benchmarks of the judge's budget (`atropos.envs.judge`, `atropos.envs.budget`).

`POST /v1/chat/completions` answers `answer` (default `\\boxed{A}`) `n` times, with `usage`
(the prompt's characters / 4 and 10 tokens per answer). Its provider-like limit: with `rpm`
set, a token bucket of `rpm` requests a minute holding `burst` (default one second's worth)
answers 429 with `Retry-After` (whole seconds, at least 1) once it is empty. `mode`, which may
be changed while serving, injects a fault into every chat request: "500", "429" (with
`Retry-After: retry_after`), "400", "hang" (no answer until the server stops or the mode
changes) or "malformed" (a 200 whose body is not JSON); "ok" answers. `arrivals` holds the
`time.monotonic()` of every chat request, `statuses` counts the answers by status.
`GET /health` and `/v1/models` answer as a server would.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from atropos.envs.budget import Rate
from atropos.http import Rules, server_app
from atropos.testing.serve import serve_in_thread

MODES = ("ok", "500", "429", "400", "hang", "malformed")


class FakeJudge:
    """A fake judge provider on 127.0.0.1; a context manager (see the module docstring)."""

    def __init__(
        self,
        rpm: float = 0,
        burst: float | None = None,
        answer: str = "\\boxed{A}",
        mode: str = "ok",
        retry_after: float = 1.0,
    ) -> None:
        self.rpm = rpm
        self.answer = answer
        self.mode = mode
        self.retry_after = retry_after
        self.arrivals: list[float] = []
        self.statuses: Counter[int] = Counter()
        self._rate = Rate(rpm, burst) if rpm else None
        self._lock = threading.Lock()
        self._stopping = False
        self._stack = ExitStack()
        self.base_url = ""
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/health", self._health),
            Route("/v1/models", self._models),
        ]
        self.app = server_app(routes, Rules.loopback(open_paths=("/health",)))

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {value!r}")
        self._mode = value

    def __enter__(self) -> FakeJudge:
        url = self._stack.enter_context(serve_in_thread(self.app))
        self.base_url = f"{url}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._stack.close()

    def served(self) -> int:
        """Requests answered 200."""
        return self.statuses[200]

    def windows(self, seconds: float) -> Iterator[int]:
        """The number of requests in each window of `seconds` starting at an arrival."""
        times = sorted(self.arrivals)
        j = 0
        for i, start in enumerate(times):
            j = max(j, i)
            while j < len(times) and times[j] < start + seconds:
                j += 1
            yield j - i

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "judge", "object": "model"}]})

    def _status(self, status: int) -> None:
        with self._lock:
            self.statuses[status] += 1

    async def _chat(self, request: Request) -> Response:
        now = time.monotonic()
        body: dict[str, Any] = await request.json()
        with self._lock:
            self.arrivals.append(now)
            limited = None
            if self._rate is not None and self._rate.reserve(1, now, not_after=now) is None:
                limited = self._rate.ready_at(1, now) - now
        mode = self.mode
        if limited is not None or mode == "429":
            wait = self.retry_after if limited is None else limited
            self._status(429)
            return JSONResponse(
                {"error": {"message": "rate limit reached", "type": "rate_limit", "code": 429}},
                status_code=429,
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        if mode in ("500", "400"):
            self._status(int(mode))
            return JSONResponse({"error": {"message": f"injected {mode}"}}, status_code=int(mode))
        if mode == "hang":
            while self.mode == "hang" and not self._stopping:
                await asyncio.sleep(0.05)
        if mode == "malformed":
            self._status(200)
            return Response("{not json", media_type="application/json")
        self._status(200)
        n = int(body.get("n") or 1)
        prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": self.answer},
                "finish_reason": "stop",
            }
            for i in range(n)
        ]
        usage = {"prompt_tokens": prompt, "completion_tokens": 10 * n}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return JSONResponse(
            {
                "id": "judge",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "judge"),
                "choices": choices,
                "usage": usage,
            }
        )
