"""Outages: when every server of a role has been unreachable for `server_wait` seconds in a row,
calls fail with one fatal error naming the role, the URLs, how long and why; one healthy server,
or a server back in time, changes nothing. Over real HTTP (a Starlette stub on loopback whose
health can be switched off, as a dead engine's is)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.errors import InferenceError, fatal_reason
from atropos.inference.manager import ServerManager
from atropos.inference.pool import ServerPool
from atropos.testing import serve_in_thread

FAST = {"retry_backoff": 0.01, "retry_backoff_max": 0.05, "health_check_interval": 0.05}


class Server:
    """A chat server whose health (and so its probe) can be switched off while it runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.up = True

    async def _health(self, request: Request) -> Response:
        return PlainTextResponse("ok" if self.up else "engine dead", 200 if self.up else 503)

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        if not self.up:
            return PlainTextResponse("engine dead", status_code=503)
        message = {"role": "assistant", "content": self.name}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        reply = {"id": "x", "object": "o", "created": 1, "model": body["model"]}
        return JSONResponse({**reply, "choices": [choice]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )


@contextlib.contextmanager
def serving(*servers: Server) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_in_thread(s.app())) + "/v1" for s in servers]


def manager(urls: list[str], server_wait: float, role: str = "policy") -> ServerManager:
    configs = [APIServerConfig(base_url=u, model_name="m", server_type="vllm") for u in urls]
    config = ServerManagerConfig(**FAST, server_wait=server_wait)
    return ServerManager(configs, config, role=role)


async def chat(m: ServerManager) -> str:
    reply = await m.chat_completion(messages=[{"role": "user", "content": "q"}])
    return str(reply.choices[0].message.content)


async def fatal(m: ServerManager) -> InferenceError:
    """Call until a call fails fatally (before the probe's verdict, calls fail with the 503s)."""
    while True:
        try:
            await chat(m)
        except InferenceError as err:
            if err.fatal:
                return err
            await asyncio.sleep(0.01)


async def until(condition: Any, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "the condition did not come true in time"
        await asyncio.sleep(0.01)


def test_the_outage_starts_when_the_last_server_goes_down():
    class Backend:
        def __init__(self, url: str) -> None:
            self.config = APIServerConfig(base_url=url)

    async def main() -> None:
        pool = ServerPool(
            [Backend("http://a/v1"), Backend("http://b/v1")],  # type: ignore[list-item]
            health_interval=1,
            health_timeout=1,
        )
        a, b = pool.slots
        assert pool.outage_since() is None
        pool.set_health(a, False, ": down")
        assert pool.outage_since() is None  # b is healthy
        assert pool.outage_since({0}) == a.down_since  # the calls only a can take
        await asyncio.sleep(0.01)
        pool.set_health(b, False, ": down")
        assert b.down_since is not None and a.down_since is not None
        assert pool.outage_since() == b.down_since > a.down_since
        pool.set_health(a, True)
        assert pool.outage_since() is None and a.down_since is None
        pool.set_health(a, False, ": down again")
        assert pool.outage_since() == a.down_since  # counted again from a's new fall

    asyncio.run(main())


def test_an_outage_past_server_wait_is_fatal_and_says_whose_servers_for_how_long():
    server = Server("A")
    with serving(server) as urls:

        async def main() -> tuple[InferenceError, float]:
            async with manager(urls, server_wait=0.5, role="teacher") as m:
                assert await chat(m) == "A"  # it answered: a server gone, not a wrong address
                server.up = False
                down = time.monotonic()
                err = await fatal(m)
                return err, time.monotonic() - down

        err, waited = asyncio.run(main())
    assert err.fatal and err.kind == "unavailable" and fatal_reason(err) == str(err)
    text = str(err)
    assert text.startswith(f"the teacher's inference server ({urls[0]}) has been unreachable for")
    assert "HTTP 503" in text and "--server_wait (now 0.5 s)" in text
    assert 0.5 <= waited < 10  # not before the deadline; the margin is for a loaded machine


def test_one_healthy_server_keeps_the_calls_going_however_long_the_other_is_down():
    a, b = Server("A"), Server("B")
    with serving(a, b) as urls:

        async def main() -> list[str]:
            async with manager(urls, server_wait=0.2) as m:
                a.up = False
                end = time.monotonic() + 1.0  # five times server_wait
                answers = []
                while time.monotonic() < end:
                    answers.append(await chat(m))
                    await asyncio.sleep(0.02)
                return answers

        answers = asyncio.run(main())
    assert answers and set(answers[-10:]) == {"B"}


def test_a_server_back_before_server_wait_changes_nothing_and_restarts_the_count():
    server = Server("A")
    with serving(server) as urls:

        async def main() -> float:
            async with manager(urls, server_wait=1.5) as m:
                assert await chat(m) == "A"
                slot = m._pool.slots[0]
                server.up = False
                await until(lambda: not slot.healthy)
                waiting = asyncio.create_task(chat(m))  # waits through the outage
                await asyncio.sleep(0.5)
                server.up = True
                assert await waiting == "A"
                await asyncio.sleep(1.2)  # the first outage would be over 1.5 s by now
                server.up = False
                await until(lambda: not slot.healthy)
                down = time.monotonic()
                await fatal(m)
                return time.monotonic() - down

        # counted from the second fall (the first outage does not count)
        assert asyncio.run(main()) >= 1.4


def test_waiters_of_an_outage_cancelled_as_it_ends_give_their_lock_back():
    """Every waiter of an outage times out at once, and a runner cancels the others when the
    first one stops the run: none may fail with "Lock is not acquired" or keep the lock."""
    server = Server("A")
    with serving(server) as urls:

        async def main() -> list[BaseException | str]:
            async with manager(urls, server_wait=0.3) as m:
                assert await chat(m) == "A"
                server.up = False
                await until(lambda: not m._pool.slots[0].healthy)
                calls = [asyncio.create_task(chat(m)) for _ in range(64)]
                done, pending = await asyncio.wait(calls, return_when=asyncio.FIRST_EXCEPTION)
                for task in pending:
                    task.cancel()
                results = await asyncio.gather(*calls, return_exceptions=True)
                for room in m._pool._room.values():
                    assert not room.locked()
                server.up = True
                await until(lambda: m._pool.slots[0].healthy)
                assert await chat(m) == "A"
                return results

        results = asyncio.run(asyncio.wait_for(main(), 30))
    assert not [r for r in results if not isinstance(r, (InferenceError, asyncio.CancelledError))]
    assert any(isinstance(r, InferenceError) and r.fatal for r in results)
