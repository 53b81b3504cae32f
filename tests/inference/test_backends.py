"""Backends over real HTTP: request bodies and response parsing against stubs of each server.

Each stub is a small Starlette app answering in the documented shape of the server it mimics
(see the backend modules' docstrings for the fields and their sources), served by uvicorn on a
loopback port through `atropos.testing.serve_in_thread`.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from atropos.inference.base import HTTPBackend, create_backend, server_root, strip_double_bos
from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError, InferenceTimeout, UnsupportedOperation
from atropos.inference.openai import OpenAIBackend
from atropos.inference.sglang import SGLangBackend
from atropos.inference.trl import TRLBackend
from atropos.inference.vllm import VLLMBackend
from atropos.testing import free_port, serve_in_thread

Handler = Callable[[Request], Awaitable[Response]]


class StubTokenizer:
    """Characters are tokens (id = code point); BOS is 1."""

    bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 1))

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class Recorder:
    """A stub app that records every request (method, path, JSON body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.routes: list[Route] = [
            Route("/health", self._ok, methods=["GET"]),
            Route("/v1/models", self._ok, methods=["GET"]),
            Route("/health/", self._ok, methods=["GET"]),
        ]

    def route(self, path: str, fn: Callable[[Any], Any], methods: tuple[str, ...] = ("POST",)):
        async def endpoint(request: Request) -> Response:
            body = await request.json() if request.method == "POST" else None
            self.requests.append((request.method, request.url.path, body))
            result = fn(body)
            return result if isinstance(result, Response) else JSONResponse(result)

        self.routes.append(Route(path, endpoint, methods=list(methods)))
        return self

    async def _ok(self, request: Request) -> Response:
        self.requests.append((request.method, request.url.path, None))
        return JSONResponse({"status": "ok", "data": []})

    def app(self) -> Starlette:
        return Starlette(routes=self.routes)

    def bodies(self, path: str) -> list[Any]:
        return [b for _, p, b in self.requests if p == path]


def run_with(
    recorder: Recorder,
    backend_cls: type[HTTPBackend],
    body: Callable[[Any], Awaitable[None]],
    **config: Any,
) -> None:
    tokenizer = config.pop("tokenizer", None)
    with serve_in_thread(recorder.app()) as url:
        cfg = APIServerConfig(base_url=url + "/v1", model_name="m", **config)

        async def main() -> None:
            backend = backend_cls(cfg, tokenizer=tokenizer)
            try:
                await body(backend)
            finally:
                await backend.aclose()

        asyncio.run(main())


# -- OpenAI-compatible ----------------------------------------------------------------------


def chat_answer(body: dict[str, Any], choices: int | None = None) -> dict[str, Any]:
    count = choices if choices is not None else body.get("n", 1)
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": body["model"],
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": f"answer {i}"},
                "finish_reason": "stop",
            }
            for i in range(count)
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2 * count,
            "total_tokens": 3 + 2 * count,
        },
    }


def test_openai_chat_sends_the_openai_body_and_parses_the_answer():
    rec = Recorder().route("/v1/chat/completions", chat_answer)

    async def body(backend: OpenAIBackend) -> None:
        msgs = [{"role": "user", "content": "hi"}]
        out = await backend.chat_completion(
            messages=msgs, n=3, temperature=0.5, split="eval", extra_body={"top_k": 5}
        )
        assert [c.message.content for c in out.choices] == ["answer 0", "answer 1", "answer 2"]
        assert out.usage is not None and out.usage.completion_tokens == 6
        one = await backend.chat_completion(messages=msgs)
        assert len(one.choices) == 1

    run_with(rec, OpenAIBackend, body)
    sent = rec.bodies("/v1/chat/completions")
    assert sent[0] == {
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "temperature": 0.5,
        "top_k": 5,
        "model": "m",
    }
    assert "n" not in sent[1] and "split" not in sent[1]


def test_openai_detects_an_ignored_n_and_fans_out_without_duplicates():
    rec = Recorder().route("/v1/chat/completions", lambda b: chat_answer(b, choices=1))
    backends: list[OpenAIBackend] = []

    async def body(backend: OpenAIBackend) -> None:
        backends.append(backend)
        out = await backend.chat_completion(messages=[], n=3)
        assert [c.index for c in out.choices] == [0, 1, 2]
        assert backend.n_kwarg_is_ignored
        assert len(rec.requests) == 3  # 1 with n=3, then the 2 missing ones
        out = await backend.chat_completion(messages=[], n=2)
        assert len(out.choices) == 2 and len(rec.requests) == 5
        await backend.chat_completion(messages=[], n=1)
        assert len(rec.requests) == 6  # n == 1: exactly one request (upstream sent two)

    run_with(rec, OpenAIBackend, body)
    assert [b.get("n") for b in rec.bodies("/v1/chat/completions")] == [3] + [None] * 5


def test_openai_completion_with_configured_n_kwarg_is_ignored():
    def answer(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "t",
            "object": "text_completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "text": body["prompt"], "finish_reason": "length"}],
        }

    rec = Recorder().route("/v1/completions", answer)

    async def body(backend: OpenAIBackend) -> None:
        out = await backend.completion(prompt="p", n=4, max_tokens=3)
        assert [c.index for c in out.choices] == [0, 1, 2, 3]
        assert {c.finish_reason for c in out.choices} == {"length"}

    run_with(rec, OpenAIBackend, body, n_kwarg_is_ignored=True)
    assert len(rec.requests) == 4 and all("n" not in b for b in rec.bodies("/v1/completions"))


def test_openai_refuses_token_calls_with_a_clear_error():
    async def body(backend: OpenAIBackend) -> None:
        with pytest.raises(UnsupportedOperation, match="vllm") as info:
            await backend.tokens_and_logprobs_completion(prompt="x")
        assert isinstance(info.value, NotImplementedError) and not info.value.retryable
        with pytest.raises(NotImplementedError):
            await backend.get_logprobs(prompt="x")
        assert await backend.check_health()

    rec = Recorder()
    run_with(rec, OpenAIBackend, body)
    assert rec.requests == [("GET", "/v1/models", None)]


# -- vLLM -------------------------------------------------------------------------------------


def vllm_completions(body: dict[str, Any], with_ids: bool | None = None) -> dict[str, Any]:
    """vLLM's /v1/completions answer with return_tokens_as_token_ids, and the ids when asked
    (`return_token_ids`, or `with_ids`)."""
    if with_ids is None:
        with_ids = bool(body.get("return_token_ids"))
    prompt = body["prompt"]
    prompt_ids = prompt if isinstance(prompt, list) else [1] + [ord(c) for c in prompt]
    choices = []
    for i in range(body.get("n", 1)):
        out = [100 + 10 * i + j for j in range(body.get("max_tokens", 16))]
        if body.get("stop") and i == 0:
            out = out[:1]
        choice: dict[str, Any] = {
            "index": i,
            "text": "x" * len(out),
            "finish_reason": "stop" if len(out) == 1 else "length",
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in out],
                "token_logprobs": [-0.01 * t for t in out],
                "top_logprobs": [{f"token_id:{t}": -0.01 * t} for t in out],
                "text_offset": list(range(len(out))),
            },
        }
        if with_ids:
            choice.update(token_ids=out, prompt_token_ids=prompt_ids)
        if body.get("prompt_logprobs"):
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -0.5, "rank": 2}, str(t + 1): {"logprob": -0.1, "rank": 1}}
                for t in prompt_ids[1:]
            ]
        choices.append(choice)
    choices.reverse()  # the order of choices is not guaranteed: we sort by index
    return {"id": "v", "object": "text_completion", "created": 1, "model": "m", "choices": choices}


def test_vllm_tokens_use_completions_with_token_id_prompts():
    rec = Recorder().route("/v1/completions", vllm_completions)

    async def body(backend: VLLMBackend) -> None:
        prompt, outs, lps, finish = await backend.tokens_and_logprobs_completion(
            input_ids=[1, 1, 7, 8], n=2, max_new_tokens=3, stop=["\n"], temperature=1.0
        )
        assert prompt == [1, 7, 8]  # the doubled BOS was stripped before sending
        assert outs == [[100], [110, 111, 112]]
        assert lps == [[-1.0], pytest.approx([-1.1, -1.11, -1.12])]
        assert finish == ["stop", "length"]

    run_with(rec, VLLMBackend, body, tokenizer=StubTokenizer())
    (sent,) = rec.bodies("/v1/completions")
    assert sent == {
        "stop": ["\n"],
        "temperature": 1.0,
        "model": "m",
        "n": 2,
        "max_tokens": 3,
        "prompt": [1, 7, 8],
        "logprobs": 0,
        "return_tokens_as_token_ids": True,  # (no `return_token_ids`: no echo of the prompt)
    }


def test_vllm_text_prompt_is_tokenized_by_the_server_and_ids_fall_back_to_tokens():
    rec = Recorder().route("/v1/completions", lambda b: vllm_completions(b, with_ids=False))

    async def body(backend: VLLMBackend) -> None:
        with pytest.raises(InferenceError, match="prompt_token_ids"):
            await backend.tokens_and_logprobs_completion(prompt="ab", max_tokens=2)
        prompt, outs, _, _ = await backend.tokens_and_logprobs_completion(
            input_ids=[5, 6], max_tokens=2
        )
        assert prompt == [5, 6] and outs == [[100, 101]]  # ids parsed from "token_id:<id>"

    run_with(rec, VLLMBackend, body)
    text, ids = rec.bodies("/v1/completions")
    assert text["prompt"] == "ab" and text["return_token_ids"] is True  # its ids come back
    assert ids["prompt"] == [5, 6] and "return_token_ids" not in ids  # no echo asked for


def test_vllm_get_logprobs_reads_prompt_logprobs():
    rec = Recorder().route("/v1/completions", vllm_completions)

    async def body(backend: VLLMBackend) -> None:
        out = await backend.get_logprobs(input_ids=[1, 20, 30], top_k=2)
        assert out == {
            "prompt_tokens": [1, 20, 30],
            "prompt_topk_token_ids": [[], [21, 20], [31, 30]],
            "prompt_topk_logprobs": [[], [-0.1, -0.5], [-0.1, -0.5]],
        }
        assert await backend.check_health()

    run_with(rec, VLLMBackend, body)
    (sent,) = rec.bodies("/v1/completions")
    assert (sent["prompt_logprobs"], sent["max_tokens"], sent["temperature"]) == (2, 1, 0.0)
    assert ("GET", "/health", None) in rec.requests  # at the root, not under /v1


def upstream_generate(body: dict[str, Any]) -> dict[str, Any]:
    """atroposlib's example vLLM server: per-position [{id: logprob}] lists."""
    ids = body["prompt"]["prompt_token_ids"]
    if body.get("prompt_logprobs"):
        return {"prompt_logprobs": [[None] + [{str(t): -0.2} for t in ids[1:]]]}
    n, k = body["n"], body["max_tokens"]
    return {
        "text": ["y" * k] * n,
        "logprobs": [[[{str(200 + 10 * i + j): -0.5 * j}] for j in range(k)] for i in range(n)],
        "finish_reasons": ["length"] * n,
    }


def test_vllm_upstream_generate_endpoint_switch():
    rec = Recorder().route("/generate", upstream_generate)

    async def body(backend: VLLMBackend) -> None:
        prompt, outs, lps, finish = await backend.tokens_and_logprobs_completion(
            prompt="hi", n=2, max_tokens=2
        )
        assert prompt == [1, ord("h"), ord("i")]  # encoded locally: this server needs ids
        assert outs == [[200, 201], [210, 211]] and lps == [[0.0, -0.5], [0.0, -0.5]]
        assert finish == ["length", "length"]
        got = await backend.get_logprobs(input_ids=[1, 9])
        assert got["prompt_topk_token_ids"] == [[], [9]]

    run_with(rec, VLLMBackend, body, vllm_token_api="generate", tokenizer=StubTokenizer())
    first = rec.bodies("/generate")[0]
    assert first["prompt"] == {"prompt_token_ids": [1, 104, 105]} and first["logprobs"] == 0


# -- SGLang -----------------------------------------------------------------------------------


def sglang_generate(body: dict[str, Any]) -> Any:
    """SGLang /generate: one object, or a list of n; logprobs as [logprob, id, text] triples."""
    params = body["sampling_params"]
    ids = body.get("input_ids") or [1] + [ord(c) for c in body["text"]]
    results = []
    for i in range(params.get("n", 1)):
        out = [300 + 10 * i + j for j in range(params.get("max_new_tokens", 128))]
        meta: dict[str, Any] = {
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "output_token_logprobs": [[-0.25 * j, t, None] for j, t in enumerate(out)],
            "finish_reason": {"type": "length", "length": len(out)},
        }
        if body.get("logprob_start_len") == 0:
            meta["input_token_logprobs"] = [
                [None if j == 0 else -1.0, t, None] for j, t in enumerate(ids)
            ]
        if body.get("top_logprobs_num"):
            meta["input_top_logprobs"] = [None] + [
                [[-0.3, t, None], [-2.0, 0, None]] for t in ids[1:]
            ]
        results.append({"text": "z" * len(out), "output_ids": out, "meta_info": meta})
    return results if len(results) > 1 else results[0]


def test_sglang_generate_with_input_ids():
    rec = Recorder().route("/generate", sglang_generate)

    async def body(backend: SGLangBackend) -> None:
        prompt, outs, lps, finish = await backend.tokens_and_logprobs_completion(
            input_ids=[1, 4, 5], n=2, max_tokens=2, temperature=0.7, stop=["</s>"]
        )
        assert prompt == [1, 4, 5]
        assert outs == [[300, 301], [310, 311]] and lps == [[0.0, -0.25], [0.0, -0.25]]
        assert finish == ["length", "length"]
        single = await backend.tokens_and_logprobs_completion(input_ids=[1, 4], max_tokens=1)
        assert single[1] == [[300]]
        assert await backend.check_health()

    run_with(rec, SGLangBackend, body)
    sent = rec.bodies("/generate")[0]
    assert sent == {
        "sampling_params": {"temperature": 0.7, "stop": ["</s>"], "max_new_tokens": 2, "n": 2},
        "return_logprob": True,
        "return_text_in_logprobs": False,
        "input_ids": [1, 4, 5],
    }
    assert ("GET", "/v1/models", None) in rec.requests  # not /health (a generation on SGLang)


def test_sglang_text_prompt_and_get_logprobs():
    rec = Recorder().route("/generate", sglang_generate)

    async def body(backend: SGLangBackend) -> None:
        prompt, outs, _, _ = await backend.tokens_and_logprobs_completion(prompt="ok", max_tokens=1)
        assert prompt == [1, ord("o"), ord("k")] and outs == [[300]]
        got = await backend.get_logprobs(input_ids=[1, 7, 8], top_k=1)
        assert got == {
            "prompt_tokens": [1, 7, 8],
            "prompt_topk_token_ids": [[], [7], [8]],
            "prompt_topk_logprobs": [[], [-0.3], [-0.3]],
        }

    run_with(rec, SGLangBackend, body)
    text_req, logprob_req = rec.bodies("/generate")
    assert text_req["text"] == "ok" and text_req["logprob_start_len"] == 0
    assert logprob_req["top_logprobs_num"] == 1 and logprob_req["logprob_start_len"] == 0


# -- TRL --------------------------------------------------------------------------------------


def trl_generate(body: dict[str, Any], logprobs: bool = True) -> dict[str, Any]:
    """Current `trl vllm-serve` /generate/: prompt_ids, completion_ids, logprobs."""
    text = body["prompts"][0]
    k = body.get("max_tokens", 16)
    outs = [[ord("a") + i] * (k if i else 1) for i in range(body["n"])]
    answer: dict[str, Any] = {"completion_ids": outs}
    if logprobs:
        answer["prompt_ids"] = [[ord(c) for c in text]]
        answer["logprobs"] = [[-0.5] * len(o) for o in outs]
    return answer


def test_trl_generate_body_ids_logprobs_and_finish_reasons():
    rec = Recorder().route("/generate/", trl_generate)

    async def body(backend: TRLBackend) -> None:
        prompt, outs, lps, finish = await backend.tokens_and_logprobs_completion(
            input_ids=[ord("h"), ord("i")], n=2, max_tokens=3, temperature=0.9, stop=["."]
        )
        assert prompt == [104, 105] and outs == [[97], [98, 98, 98]]
        assert lps == [[-0.5], [-0.5] * 3] and finish == ["stop", "length"]
        chat = await backend.chat_completion(
            messages=[{"role": "user", "content": "yo"}], n=2, max_tokens=2
        )
        assert [c.message.content for c in chat.choices] == ["a", "bb"]
        assert [c.finish_reason for c in chat.choices] == ["stop", "length"]
        text = await backend.completion(prompt="q", max_tokens=4)
        assert text.choices[0].text == "a"

    run_with(rec, TRLBackend, body, tokenizer=StubTokenizer())
    first, chat, _ = rec.bodies("/generate/")
    assert first == {
        "prompts": ["hi"],
        "n": 2,
        "max_tokens": 3,
        "temperature": 0.9,
        "generation_kwargs": {"stop": ["."]},
    }
    assert chat["prompts"] == ["<user>yo<assistant>"]


def test_trl_server_without_logprobs_is_unsupported_for_tokens():
    rec = Recorder().route("/generate/", lambda b: trl_generate(b, logprobs=False))

    async def body(backend: TRLBackend) -> None:
        with pytest.raises(UnsupportedOperation, match="upgrade TRL"):
            await backend.tokens_and_logprobs_completion(prompt="x", max_tokens=1)
        with pytest.raises(UnsupportedOperation):
            await backend.get_logprobs(prompt="x")
        assert await backend.check_health()

    run_with(rec, TRLBackend, body, tokenizer=StubTokenizer())
    assert ("GET", "/health/", None) in rec.requests


# -- errors, URLs, lifecycle ------------------------------------------------------------------


def status_app() -> Starlette:
    async def fail(request: Request) -> Response:
        code = int(request.path_params["code"])
        headers = {"Retry-After": "3"} if code == 429 else {}
        return PlainTextResponse(f"nope {code}", status_code=code, headers=headers)

    async def slow(request: Request) -> Response:
        await asyncio.sleep(1.0)
        return JSONResponse({})

    async def garbage(request: Request) -> Response:
        return PlainTextResponse("<html>")

    return Starlette(
        routes=[
            Route("/v1/status/{code}/chat/completions", fail, methods=["POST"]),
            Route("/v1/slow/chat/completions", slow, methods=["POST"]),
            Route("/v1/garbage/chat/completions", garbage, methods=["POST"]),
        ]
    )


def aborted(answer: dict[str, Any], where: str = "choices") -> dict[str, Any]:
    """`answer` with its first choice ended by the server (a pause in mode abort)."""
    if where == "meta_info":
        answer["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort"}
    else:
        answer["choices"][-1]["finish_reason"] = "abort"
    return answer


def test_an_aborted_generation_is_a_retryable_error_not_a_completion():
    """vLLM answers a request ended by /pause?mode=abort with 200, its partial output and
    finish_reason "abort" (SGLang likewise): that is no rollout, but an error worth a retry."""
    rec = (
        Recorder()
        .route("/v1/completions", lambda b: aborted(vllm_completions(b)))
        .route("/v1/chat/completions", lambda b: aborted(chat_answer(b)))
        .route("/generate", lambda b: aborted(sglang_generate(b), "meta_info"))
    )
    calls = {
        VLLMBackend: lambda b: b.tokens_and_logprobs_completion(input_ids=[1, 7], max_tokens=3),
        OpenAIBackend: lambda b: b.chat_completion(messages=[{"role": "user", "content": "x"}]),
        SGLangBackend: lambda b: b.tokens_and_logprobs_completion(input_ids=[1, 4], max_tokens=2),
    }
    for cls, call in calls.items():

        async def body(backend: HTTPBackend, call: Any = call) -> None:
            with pytest.raises(InferenceError, match="aborted the generation") as err:
                await call(backend)
            assert err.value.retryable and err.value.kind == "http_5xx" and not err.value.fatal

        run_with(rec, cls, body)


def test_http_failures_become_inference_errors():
    async def call(url: str, timeout: float = 5.0) -> InferenceError:
        backend = OpenAIBackend(APIServerConfig(base_url=url, timeout=timeout))
        try:
            with pytest.raises(InferenceError) as info:
                await backend.chat_completion(messages=[])
            return info.value
        finally:
            await backend.aclose()

    async def main(root: str) -> None:
        bad = await call(f"{root}/v1/status/400")
        assert (bad.status_code, bad.retryable, bad.kind) == (400, False, "http_4xx")
        assert "nope 400" in str(bad)
        down = await call(f"{root}/v1/status/503")
        assert (down.status_code, down.retryable, down.kind) == (503, True, "http_5xx")
        busy = await call(f"{root}/v1/status/429")
        assert (busy.retryable, busy.retry_after) == (True, 3.0)
        late = await call(f"{root}/v1/slow", timeout=0.2)
        assert isinstance(late, InferenceTimeout) and late.retryable
        junk = await call(f"{root}/v1/garbage")
        assert (junk.kind, junk.retryable) == ("protocol", False)
        refused = await call(f"http://127.0.0.1:{free_port()}/v1")
        assert (refused.kind, refused.retryable, refused.status_code) == ("connection", True, None)

    with serve_in_thread(status_app()) as root:
        asyncio.run(main(root))


def test_server_root_and_bos_helpers():
    assert server_root("http://v1.example.com:8000/v1") == "http://v1.example.com:8000"
    assert server_root("http://host/proxy/v1/") == "http://host/proxy"
    assert server_root("http://host:1/prefix") == "http://host:1/prefix"
    assert strip_double_bos([2, 2, 3], 2) == [2, 3] and strip_double_bos([2, 2], None) == [2, 2]


def test_create_backend_picks_the_class_and_repr_is_readable():
    kinds = {"openai": OpenAIBackend, "vllm": VLLMBackend, "sglang": SGLangBackend}
    kinds["trl"] = TRLBackend
    for kind, cls in kinds.items():
        backend = create_backend(APIServerConfig(base_url="http://h:1/v1", server_type=kind))
        assert type(backend) is cls
    assert repr(backend) == "<TRLBackend http://h:1/v1 model='default'>"
    with pytest.raises(ValueError, match="base_url"):
        VLLMBackend(APIServerConfig())


def test_aclose_releases_the_session_and_leaves_no_tasks():
    rec = Recorder().route("/v1/chat/completions", chat_answer)
    with serve_in_thread(rec.app()) as url:

        async def main() -> None:
            backend = OpenAIBackend(APIServerConfig(base_url=url + "/v1"))
            await asyncio.gather(*(backend.chat_completion(messages=[]) for _ in range(20)))
            session = backend._session
            assert session is not None
            await backend.aclose()
            assert session.closed and backend._session is None
            with pytest.raises(RuntimeError, match="closed"):
                await backend.chat_completion(messages=[])
            assert asyncio.all_tasks() == {asyncio.current_task()}

        gc.collect()  # what earlier tests left is collected (and warned about) before
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(main())
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


# -- against the shared fake server -------------------------------------------------------------


def test_every_token_backend_agrees_on_the_shared_fake_server():
    """The four token paths, parsed from four wire shapes, give the same ids and logprobs."""
    fake_server = pytest.importorskip("atropos.testing.fake_server")  # the shared fake
    load_tokenizer = pytest.importorskip("atropos.testing.fake_engine").load_tokenizer
    FakeInferenceServer = fake_server.FakeInferenceServer

    tokenizer = load_tokenizer()
    variants = [("vllm", {}), ("vllm", {"vllm_token_api": "generate"}), ("sglang", {}), ("trl", {})]

    async def main(url: str) -> list[Any]:
        results = []
        for kind, extra in variants:
            cfg = APIServerConfig(base_url=url, server_type=kind, **extra)
            backend = create_backend(cfg, tokenizer=tokenizer)
            try:
                ids = tokenizer.encode("hello there")
                got = await backend.tokens_and_logprobs_completion(
                    input_ids=ids, n=3, max_tokens=5, temperature=1.0
                )
                assert got[0] == ids
                assert [len(o) for o in got[1]] == [len(lp) for lp in got[2]]
                assert set(got[3]) <= {"stop", "length"}
                results.append(got)
                if backend.supports_prompt_logprobs:
                    top = await backend.get_logprobs(input_ids=ids, top_k=2)
                    assert top["prompt_tokens"] == ids
                    assert [len(t) for t in top["prompt_topk_token_ids"]] == [0] + [2] * (
                        len(ids) - 1
                    )
            finally:
                await backend.aclose()
        return results

    with FakeInferenceServer() as server:
        results = asyncio.run(main(server.base_url))
    first = results[0]
    for other in results[1:]:
        assert other[1] == first[1] and other[3] == first[3]
        for row, expected in zip(other[2], first[2], strict=True):
            assert row == pytest.approx(expected)
