"""A base URL without /v1: the server's 404 on a completion call says to add /v1."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError, missing_v1
from atropos.inference.openai import OpenAIBackend
from atropos.inference.vllm import VLLMBackend
from atropos.testing import serve_in_thread


def v1_only() -> Starlette:
    """An OpenAI-compatible server: completions under /v1 only, and one model."""

    async def missing_model(request: Request) -> Response:
        return JSONResponse({"error": "model not found"}, status_code=404)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", missing_model, methods=["POST"]),
            Route("/v1/completions", missing_model, methods=["POST"]),
        ]
    )


async def chat_error(base_url: str) -> InferenceError:
    backend = OpenAIBackend(APIServerConfig(base_url=base_url, timeout=5))
    try:
        with pytest.raises(InferenceError) as info:
            await backend.chat_completion(messages=[{"role": "user", "content": "hi"}])
        return info.value
    finally:
        await backend.aclose()


async def completion_error(base_url: str) -> InferenceError:
    backend = VLLMBackend(APIServerConfig(base_url=base_url, timeout=5, server_type="vllm"))
    try:
        with pytest.raises(InferenceError) as info:
            await backend.completion(prompt="hi", max_tokens=2)
        return info.value
    finally:
        await backend.aclose()


@pytest.mark.parametrize("call", [chat_error, completion_error])
def test_a_404_without_v1_says_to_add_it(call):
    with serve_in_thread(v1_only()) as root:
        err = asyncio.run(call(root))
        assert err.status_code == 404 and err.fatal
        assert f"add /v1 to --openai.base_url ({root.rstrip('/')}/v1)" in str(err)
        with_v1 = asyncio.run(call(root.rstrip("/") + "/v1"))  # a 404 of its own: the model
        assert with_v1.status_code == 404 and "add /v1" not in str(with_v1)
        assert "--openai.model_name" in str(with_v1)


def test_only_completion_paths_under_a_base_without_v1_get_the_hint():
    base = "http://h:8000"
    assert missing_v1(base, f"{base}/chat/completions") is not None
    assert missing_v1(base + "/", f"{base}/completions") is not None
    assert missing_v1(base, f"{base}/tokenize") is None  # served at the root by vLLM
    assert missing_v1(base + "/v1", f"{base}/v1/chat/completions") is None
    assert missing_v1(base, None) is None and missing_v1(None, f"{base}/completions") is None
    assert InferenceError.from_status(404, "x").message == (
        "HTTP 404: x (check --openai.model_name (the model the server serves, see its /v1/models)"
        " and --openai.base_url)"
    )
