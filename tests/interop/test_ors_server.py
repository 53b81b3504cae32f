"""Our ORS server in process, driven by our ORS client: a tool that fails on the server (not
the policy's refused call) answers ORS's `error` event, which a consumer counts as
`failed/ors_tool_error`, never as a score; the server carries on."""

from __future__ import annotations

import asyncio

import pytest

from atropos.envs.outcome import failure_reason
from atropos.interop import episodes
from atropos.interop.ors import ORSError
from atropos.interop.ors.client import ORSClient, ToolResult
from atropos.interop.ors.server import ORSApp, build_app
from atropos.interop.publishing import configured_env
from atropos.testing import serve_in_thread


def test_a_tool_failing_on_the_server_is_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    found = episodes.adapter(configured_env("gsm8k", []))
    asyncio.run(found.setup())

    async def broken(self: episodes.Episode, text: str) -> episodes.Step:
        raise RuntimeError("the tool server went away")

    async def play(url: str) -> tuple[BaseException | None, ToolResult]:
        client = ORSClient(url, "gsm8k", timeout=10.0)
        try:
            session = await client.open("train", 0)
            with monkeypatch.context() as patch:
                patch.setattr(episodes._Answer, "_reply", broken)
                try:
                    await session.call("answer", {"answer": "\\boxed{1}"})
                    failed: BaseException | None = None
                except ORSError as e:
                    failed = e
            refused = await session.call("no_such_tool", {})  # the server carries on
            await session.close()
            return failed, refused
        finally:
            await client.aclose()

    with serve_in_thread(build_app(ORSApp("gsm8k", found, None))) as url:
        failed, refused = asyncio.run(play(url))
    assert isinstance(failed, ORSError) and failure_reason(failed) == "ors_tool_error"
    assert "RuntimeError: the tool server went away" in str(failed)
    assert refused is not None and refused.error  # the policy's fault: a result, not a failure
