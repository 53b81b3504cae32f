"""Request heads are bounded on the API's real server: 431 past 64 KiB or 100 header fields,
answered without reading the rest, while other clients go on being served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atropos.http.heads import MAX_HEAD_BYTES, MAX_HEADERS
from atropos.testing import send_head

from .live_api import LiveApi, live_api, poll_health


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveApi]:
    with live_api(Path(tmp_path_factory.mktemp("limits"))) as server:
        yield server


def request(extra: bytes) -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


def assert_refused(answer: bytes) -> None:
    # the 431 normally arrives; a reset (nothing read) also means the rest was never read
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_a_16_mib_header_is_refused_within_a_second(api):
    start = time.perf_counter()
    answer = send_head(api.url, request(b"X-Big: " + b"a" * (16 << 20) + b"\r\n"))
    took = time.perf_counter() - start
    assert_refused(answer)
    assert took < 1.5, took


def test_a_head_just_over_the_limit_in_one_piece_is_refused(api):
    answer = send_head(api.url, request(b"X-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n"))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"exceed 65536 bytes" in answer


def test_ten_thousand_headers_are_refused(api):
    answer = send_head(api.url, request(b"".join(b"X-%d: v\r\n" % i for i in range(10_000))))
    assert_refused(answer)
    if answer:
        assert b"more than 100 header fields" in answer


def test_the_count_limit_alone_gives_431_naming_it(api):
    answer = send_head(api.url, request(b"X-a: v\r\n" * (MAX_HEADERS + 1)))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"more than 100 header fields" in answer


def test_ordinary_requests_with_many_and_long_headers_pass(api):
    headers = {f"x-h{i}": "v" * 200 for i in range(MAX_HEADERS - 10)}
    assert httpx.get(f"{api.url}/health", headers=headers).status_code == 200
    big = {"x-one": "v" * (MAX_HEAD_BYTES - 1024)}
    assert httpx.get(f"{api.url}/health", headers=big).status_code == 200
    # a body far larger than the head limit is not a head
    assert httpx.post(f"{api.url}/register", content=b"x" * (4 << 20)).status_code == 400


def test_health_answers_while_a_huge_header_arrives_slowly(api):
    async def scenario() -> tuple[bytes, list[float]]:
        done = asyncio.Event()
        health = asyncio.create_task(poll_health(api.url, done))
        huge = request(b"X-Big: " + b"a" * (256 << 10) + b"\r\n")
        answer = await asyncio.to_thread(send_head, api.url, huge, 0.005, 4096)
        await asyncio.sleep(0.05)
        done.set()
        return answer, await health

    answer, latencies = asyncio.run(scenario())
    assert_refused(answer)
    assert len(latencies) > 3
    assert max(latencies) < 0.2, sorted(latencies)[-5:]


def test_refusals_leave_no_parser_warning_or_traceback_in_the_log(api):
    assert_refused(send_head(api.url, request(b"X-a: v\r\n" * (MAX_HEADERS + 5))))
    assert_refused(send_head(api.url, request(b"X-Big: " + b"a" * (MAX_HEAD_BYTES * 2) + b"\r\n")))
    assert httpx.get(f"{api.url}/health").status_code == 200  # the server is still there
    log = api.service.log_path.read_text()
    assert "Invalid HTTP request" not in log
    assert "Traceback" not in log
