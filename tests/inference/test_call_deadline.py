"""One deadline per `ServerManager` call (`base.Call`), checked at every stage: connecting, a
server that never answers, the wait for a slot; and a backend that does not read it is still
bounded by it."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from atropos.inference.base import CURRENT_CALL
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.errors import InferenceError, InferenceTimeout
from atropos.inference.manager import ServerManager

DEADLINE = 0.3
SLACK = 5.0  # the deadline fires within this (a loaded machine), far below every other timeout


def manager(url: str, **fields: Any) -> ServerManager:
    config = APIServerConfig(
        base_url=url + "/v1",
        server_type="vllm",
        model_name="m",
        health_check=False,
        timeout=600,
        **fields,
    )
    return ServerManager([config], ServerManagerConfig(deadline=DEADLINE, max_attempts=3))


@asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A server that reads requests and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def tokens(m: ServerManager) -> Any:
    return await m.tokens_and_logprobs_completion(input_ids=[1, 2, 3], max_tokens=4)


def test_a_server_that_never_answers_meets_the_call_deadline_not_the_request_timeout():
    async def main() -> None:
        async with silent_server() as url, manager(url) as m:
            start = time.monotonic()
            with pytest.raises(InferenceTimeout, match="deadline"):
                await tokens(m)
            assert DEADLINE <= time.monotonic() - start + 0.01 < SLACK
            slot = m._pool.slots[0]
            assert slot.stats.errors["timeout"] == 1 and slot.in_flight["train"] == 0
            assert CURRENT_CALL.get() is None  # the call's scope ended with it

    asyncio.run(main())


def test_connecting_is_bounded_by_the_call_deadline():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # a full accept queue: later connection attempts get no answer
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)

    async def main() -> None:
        async with manager(f"http://127.0.0.1:{port}") as m:
            start = time.monotonic()
            with pytest.raises(InferenceTimeout, match="deadline"):
                await tokens(m)
            assert time.monotonic() - start < SLACK  # not the client's 30 s connect timeout

    try:
        asyncio.run(main())
    finally:
        for sock in (*fillers, listener):
            sock.close()


def test_the_wait_for_a_slot_ends_at_the_call_deadline():
    async def main() -> None:
        async with silent_server() as url, manager(url, num_max_requests_at_once=1) as m:
            async with m.dedicated_server():  # holds the only unit of budget
                start = time.monotonic()
                with pytest.raises(InferenceError, match="no server had room") as info:
                    await tokens(m)
                assert info.value.kind == "unavailable"
                assert DEADLINE <= time.monotonic() - start + 0.01 < SLACK

    asyncio.run(main())


def test_a_backend_that_does_not_read_the_deadline_is_awaited_under_it():
    async def main() -> None:
        async with silent_server() as url, manager(url) as m:
            m._pool.slots[0].keeps_deadline = False  # as a backend without `keeps_deadline`
            m.servers[0].config.timeout = 600.0
            start = time.monotonic()
            with pytest.raises(InferenceTimeout, match="deadline"):
                await tokens(m)
            assert time.monotonic() - start < SLACK

    asyncio.run(main())


def test_a_request_timeout_shorter_than_the_deadline_is_retried_within_it():
    async def main() -> None:
        async with silent_server() as url:
            config = APIServerConfig(
                base_url=url + "/v1", server_type="vllm", model_name="m",
                health_check=False, timeout=0.1,
            )  # fmt: skip
            fields = ServerManagerConfig(deadline=2.0, max_attempts=2, retry_backoff=0.01)
            async with ServerManager([config], fields) as m:
                with pytest.raises(InferenceTimeout, match="no answer within 0.1 s"):
                    await tokens(m)
                assert m._pool.slots[0].stats.errors["timeout"] == 2  # both attempts timed out

    asyncio.run(main())
