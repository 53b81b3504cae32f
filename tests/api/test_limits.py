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

from .live_api import LiveApi, live_api


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
    """The mechanism, not the machine's speed: a head paced to reach the 64 KiB limit in
    ~0.8 s (16 pieces of 4 KiB, 0.05 s apart) while `/health` is asked on another connection.
    A server that waited for the head would hold each answer until its refusal (~0.8 s); ours
    answers in milliseconds. The slow head is sent again until four answers came while one was
    arriving (a loaded machine polls slowly), at most 60 s."""
    huge = request(b"X-Big: " + b"a" * (256 << 10) + b"\r\n")

    async def scenario() -> tuple[list[bytes], list[float]]:
        answers: list[bytes] = []
        during: list[float] = []  # latencies of answers that came while a slow head arrived
        async with httpx.AsyncClient(base_url=api.url, timeout=10) as client:
            await client.get("/health")  # connect first: measure answers, not the handshake
            deadline = time.monotonic() + 60
            while len(during) < 4 and time.monotonic() < deadline:
                upload = asyncio.ensure_future(
                    asyncio.to_thread(send_head, api.url, huge, 0.05, 4096)
                )
                while not upload.done():
                    start = time.perf_counter()
                    assert (await client.get("/health")).status_code == 200
                    if not upload.done():
                        during.append(time.perf_counter() - start)
                    await asyncio.sleep(0.01)
                answers.append(await upload)
        return answers, during

    answers, during = asyncio.run(scenario())
    for answer in answers:
        assert_refused(answer)
    assert len(during) >= 4, during
    assert sorted(during)[len(during) // 2] < 0.2, sorted(during)  # the median: 4x margin


def test_refusals_leave_no_parser_warning_or_traceback_in_the_log(api):
    assert_refused(send_head(api.url, request(b"X-a: v\r\n" * (MAX_HEADERS + 5))))
    assert_refused(send_head(api.url, request(b"X-Big: " + b"a" * (MAX_HEAD_BYTES * 2) + b"\r\n")))
    assert httpx.get(f"{api.url}/health").status_code == 200  # the server is still there
    log = api.service.log_path.read_text()
    assert "Invalid HTTP request" not in log
    assert "Traceback" not in log
