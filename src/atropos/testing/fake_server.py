"""FakeInferenceServer: a real loopback HTTP inference server for tests, in OpenAI, vLLM, SGLang
and TRL shapes, tokenizing with the shipped tiny tokenizer and returning ids and logprobs.

It binds 127.0.0.1 only and has no authentication: a test fixture, not a service. Completions
are deterministic: seeded pseudo-random tokens (printable, never special) ending in eos
(`<|im_end|>`), or `responder(prompt_text)`'s text tokenized, then cut by stop strings, stop
token ids or `max_tokens` (finish_reason "length"). Every representation of a choice carries the
same ids: `token_ids`, `token_id:N` logprob tokens, `/generate` keys, `output_ids`; its text is
always `decode(ids, skip_special_tokens=True)`. Unlike vLLM, a stop string cuts the ids too (to
the tokens before it), so text and ids never disagree. `latency` applies to generation requests
only (`asyncio.sleep`, so thousands of concurrent requests are cheap); `/health` never generates.

Endpoints and the request fields they honour (others are accepted and ignored, except on vLLM
and SGLang `/generate`, which refuse unknown sampling fields as those engines do):

* `GET /health`, `GET /health/` (TRL) -> `{"status": "ok"}`; `GET /v1/models` -> OpenAI list.
* `GET /metrics` -> vLLM's time-to-first-token and queue-time histograms, Prometheus text
  (`atropos.testing.fake_metrics`); never counted in `requests` nor failed by `fail_next`.
* `POST /v1/completions`: `prompt` (string, strings, token ids, or lists of token ids), `n`,
  `max_tokens` (16), `temperature` (0 = every choice identical), `top_p`, `seed`, `stop`,
  `logprobs` (int k: tokens/token_logprobs/top_logprobs with k+1 entries/text_offset), and vLLM's
  extras `return_token_ids` (per-choice `token_ids` and `prompt_token_ids`),
  `return_tokens_as_token_ids` (logprob tokens spelled `token_id:N`), `prompt_logprobs` (k:
  per-choice `prompt_logprobs`, None at position 0, then `{"<id>": {"logprob", "rank",
  "decoded_token"}}` with k+1 entries, the prompt's own token first), `stop_token_ids`,
  `ignore_eos`, `skip_special_tokens`. `stream` and `echo` are refused (400).
* `POST /v1/chat/completions`: `messages`, `tools`, `n`, `max_completion_tokens`/`max_tokens`
  (default: what fits), `temperature`, `top_p`, `seed`, `stop`, `logprobs` (bool) with
  `top_logprobs` (k entries), and vLLM's `return_token_ids` (top-level `prompt_token_ids`,
  per-choice `token_ids`), `return_tokens_as_token_ids`, `prompt_logprobs` (top-level),
  `add_generation_prompt`, `chat_template_kwargs`, `stop_token_ids`, `ignore_eos`,
  `skip_special_tokens`. Source: vLLM's OpenAI-compatible server docs ("Extra Parameters") and
  its request/response models (`ChatCompletionRequest`, `CompletionResponseChoice`, ...),
  https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html.
* `POST /generate`, vLLM shape (a body with `prompt`), as atropos' example `vllm_api_server.py`:
  `{"prompt": {"prompt_token_ids": [...]} | str, "logprobs": k, "prompt_logprobs": k, n,
  max_tokens (16), temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos,
  skip_special_tokens, ...}` -> `{"text": [...], "prompt": str, "finish_reasons": [...]}` plus,
  when `logprobs` is set, `"logprobs"` (per choice, per position `[{"<id>": lp, ...}]`, sampled
  id first, k+1 entries), `"prompt_token_ids"` and `"token_ids"` (per choice), and when
  `prompt_logprobs` is set, `"prompt_logprobs"` (`None` for position 0, then `{"<id>": lp}`).
* `POST /generate`, SGLang shape (a body with `input_ids` or `text`): `input_ids` (ids or a batch),
  `text`, `sampling_params` {`max_new_tokens` (128), `n`, `temperature`, `top_p`, `top_k`,
  `min_p`, `stop`, `stop_token_ids`, `ignore_eos`, `skip_special_tokens`, ...}, `return_logprob`,
  `top_logprobs_num`, `logprob_start_len`, `return_text_in_logprobs`, `rid` -> per choice
  `{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "stop", "matched": id or
  str} | {"type": "length", "length": N}, "prompt_tokens", "completion_tokens", "cached_tokens",
  "output_token_logprobs": [[lp, id, text|None]], "output_top_logprobs"? (top_logprobs_num),
  "input_token_logprobs"?, "input_top_logprobs"? (logprob_start_len >= 0)}}`; a single object,
  or a list when n > 1 or the input is a batch. `sampling_seed` seeds like `seed` elsewhere.
  Source: SGLang docs, "Sampling Parameters" (`/generate` endpoint) and "Native APIs",
  https://docs.sglang.io/basic_usage/sampling_params.html.
* `POST /generate/`, TRL `vllm-serve` shape: `{prompts, n, max_tokens (16), temperature, top_p,
  top_k, min_p, repetition_penalty}` -> `{"completion_ids": [...]}` (one per prompt x n), plus
  `prompt_ids` and `logprobs` as newer TRL versions return. Source: trl/scripts/vllm_serve.py.

Bad requests get `{"error": {"message", "type", "param", "code"}}` with a 4xx status; prompts that
overflow `max_model_len` (4096) get vLLM's "maximum context length" 400.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from atropos.http import Rules, server_app
from atropos.http.serve import uvicorn_config
from atropos.local.protocol import RequestError as BadRequest
from atropos.local.protocol import json_object
from atropos.net import free_port
from atropos.testing.fake_engine import (
    Engine,
    Output,
    Responder,
    Sampling,
    load_tokenizer,
)
from atropos.testing.fake_lora import FakeLora
from atropos.testing.fake_metrics import FakeMetrics
from atropos.testing.fake_shapes import Prompts, Shapes
from atropos.testing.serve import serve_in_thread

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass
class _Failure:
    status: int
    paths: frozenset[str] | None


def _error(status: int, message: str, param: str | None = None, kind: str = "") -> JSONResponse:
    kind = kind or ("BadRequestError" if status < 500 else "ServiceUnavailableError")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    kind = "NotFoundError" if status == 404 else ""
    return _error(status, f"{detail}: {request.method} {request.url.path}", kind=kind)


class FakeInferenceServer:
    """A loopback inference server with OpenAI, vLLM, SGLang and TRL endpoints, for tests.

    Use it as a context manager (it serves from a daemon thread), or run it as a process:
    `python -m atropos.testing.fake_server --port P --latency 0.2`.

    Args:
        latency: seconds each generation request waits before answering (`asyncio.sleep`).
        responder: `fn(prompt_text) -> str | None` (may be async), called once per choice; its
            text is tokenized and ended with eos. None (or returning None) gives random tokens.
        model: the model name `/v1/models` lists (requests may name any model).
        seed: changes every random completion.
        completion_tokens: (min, max) length of random completions, before eos.
        max_model_len: prompt plus completion tokens allowed per request.
        port: the port to bind on 127.0.0.1 (0: any free port).
        tokenizer_path: a local tokenizer directory (default: the shipped tiny tokenizer).
        policy_version: when set (an int, or a function called once per answer), answers of
            `/v1/completions`, `/v1/chat/completions` and vLLM's `/generate` carry it as a
            top-level `"policy_version"`, as our local inference server does.

    Test controls: `latency`, `down` and `policy_version` may be changed while serving;
    `fail_next(n, status, paths)` queues failures; `requests` (by path), `tokens_generated`,
    `prompt_tokens` and `failures` count what happened (`reset_counters()` zeroes them).

    Example:
        >>> import httpx
        >>> with FakeInferenceServer(responder=lambda prompt: "4") as srv:
        ...     r = httpx.post(srv.base_url + "/chat/completions",
        ...                    json={"messages": [{"role": "user", "content": "2+2?"}]})
        ...     r.json()["choices"][0]["message"]["content"], srv.requests["/v1/chat/completions"]
        ('4', 1)
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        responder: Responder | None = None,
        model: str = "atropos-tiny",
        seed: int = 0,
        completion_tokens: tuple[int, int] = (3, 20),
        max_model_len: int = 4096,
        port: int = 0,
        tokenizer_path: str | None = None,
        policy_version: int | Callable[[], int] | None = None,
    ) -> None:
        """Load the tokenizer and build the app; nothing listens until `start()`."""
        if latency < 0:
            raise ValueError(f"expected latency >= 0, got {latency}")
        self.latency = latency
        self.engine = Engine(
            load_tokenizer(tokenizer_path),
            seed=seed,
            completion_tokens=completion_tokens,
            responder=responder,
            max_model_len=max_model_len,
        )
        #: Requests received, by route path (injected failures included).
        self.requests: collections.Counter[str] = collections.Counter()
        #: Output tokens generated, and prompt tokens read, over all requests.
        self.tokens_generated = 0
        self.prompt_tokens = 0
        #: Requests answered with an injected failure.
        self.failures = 0
        #: While True, every request (health checks included) gets a 503: a server that is down.
        self.down = False
        self._pending: collections.deque[_Failure] = collections.deque()
        self._port = port
        self._stack: contextlib.ExitStack | None = None
        self._created = int(time.time())
        self.url: str | None = None
        self.shapes = Shapes(self.engine, self._run, model, policy_version=policy_version)
        self.lora = FakeLora()  # vLLM's LoRA endpoints (atropos.testing.fake_lora)
        self.metrics = FakeMetrics(model)  # GET /metrics: vLLM's TTFT and queue histograms
        self.app = self._build_app()

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def model(self) -> str:
        """The model name `/v1/models` lists and answers carry when a request names none."""
        return self.shapes.model

    @property
    def policy_version(self) -> int | Callable[[], int] | None:
        """What answers report as `policy_version` (None: nothing)."""
        return self.shapes.policy_version

    @policy_version.setter
    def policy_version(self, value: int | Callable[[], int] | None) -> None:
        self.shapes.policy_version = value

    @property
    def tokenizer(self) -> Any:
        """The server's own tokenizer instance (load your own for use in another thread)."""
        return self.engine.tokenizer

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://127.0.0.1:PORT/v1`."""
        if self.url is None:
            raise RuntimeError("the server is not running: use `with FakeInferenceServer() as s`")
        return f"{self.url}/v1"

    def start(self) -> FakeInferenceServer:
        """Serve on 127.0.0.1 from a daemon thread until `stop()`."""
        if self._stack is not None:
            raise RuntimeError("the server is already running")
        stack = contextlib.ExitStack()
        self.url = stack.enter_context(serve_in_thread(self.app, port=self._port))
        self._stack = stack
        return self

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        stack, self._stack, self.url = self._stack, None, None
        if stack is not None:
            stack.close()

    def __enter__(self) -> FakeInferenceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- test controls --------------------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 503, paths: Iterable[str] | None = None) -> None:
        """Answer the next `n` requests (to `paths`, e.g. `["/generate"]`; default: any) with
        `status` and an error body, before any validation or generation."""
        if n < 0 or not 400 <= status <= 599:
            raise ValueError(f"expected n >= 0 and a 4xx/5xx status, got n={n}, status={status}")
        only = frozenset(paths) if paths is not None else None
        self._pending.extend(_Failure(status, only) for _ in range(n))

    def clear_failures(self) -> None:
        """Drop failures queued by `fail_next` that have not fired yet."""
        self._pending.clear()

    def reset_counters(self) -> None:
        """Zero `requests`, `tokens_generated`, `prompt_tokens` and `failures`."""
        self.requests.clear()
        self.tokens_generated = self.prompt_tokens = self.failures = 0

    def _take_failure(self, path: str) -> _Failure | None:
        if self.down:
            self.failures += 1
            return _Failure(503, None)
        for failure in self._pending:
            if failure.paths is None or path in failure.paths:
                self._pending.remove(failure)
                self.failures += 1
                return failure
        return None

    # --- app ------------------------------------------------------------------------------

    def _build_app(self) -> Starlette:
        routes = [
            self._route("/health", "GET", self._health),
            self._route("/health/", "GET", self._health),
            self._route("/v1/models", "GET", self._models),
            self._route("/v1/completions", "POST", self.shapes.completions),
            self._route("/v1/chat/completions", "POST", self.shapes.chat),
            self._route("/generate", "POST", self.shapes.generate),
            self._route("/generate/", "POST", self.shapes.trl_generate),
        ]
        routes += self.lora.routes()
        routes.append(Route("/metrics", self._metrics, methods=["GET"]))
        rules = Rules.loopback(open_paths=("/health", "/health/"))
        return server_app(routes, rules, exception_handlers={HTTPException: _http_error})

    def _route(self, path: str, method: str, handler: Handler) -> Route:
        async def endpoint(request: Request) -> Response:
            self.requests[path] += 1
            failure = self._take_failure(path)
            if failure is not None:
                return _error(failure.status, f"injected failure ({failure.status})")
            try:
                body: dict[str, Any] = {}
                if method == "POST":
                    body = json_object(await request.body())
                answer = await handler(body)  # a Response: already encoded (cached answers)
                return answer if isinstance(answer, Response) else JSONResponse(answer)
            except BadRequest as exc:
                return _error(exc.status, exc.message, exc.param)

        return Route(path, endpoint, methods=[method])

    async def _health(self, body: dict[str, Any]) -> Any:
        return {"status": "ok"}

    async def _models(self, body: dict[str, Any]) -> Any:
        card = {"id": self.model, "object": "model", "created": self._created}
        card |= {"owned_by": "atropos-fake", "max_model_len": self.engine.max_model_len}
        return {"object": "list", "data": [card, *self.lora.cards(self.model, self._created)]}

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def _run(self, prompts: Prompts, s: Sampling) -> list[list[Output]]:
        """Check lengths, wait out the latency, then generate for every prompt."""
        arrived = time.perf_counter()
        sized = [self.engine.check_length(ids, s) for ids, _ in prompts]
        if self.latency > 0:
            await asyncio.sleep(self.latency)
        results = []
        for (ids, text), sampling in zip(prompts, sized, strict=True):
            outs = await self.engine.generate(ids, text, sampling)
            self.prompt_tokens += len(ids)
            self.tokens_generated += sum(len(o.ids) for o in outs)
            results.append(outs)
        for _ in results:
            self.metrics.answered(time.perf_counter() - arrived)
        return results


def _import_responder(target: str) -> Responder:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise SystemExit(f"--responder expects 'module:function', got {target!r}")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise SystemExit(f"--responder {target!r} is not callable")
    return fn  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    """Run the fake server in the foreground on 127.0.0.1 (Ctrl-C stops it)."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m atropos.testing.fake_server")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per generation")
    parser.add_argument("--model", default="atropos-tiny", help="model name to list")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random completions")
    parser.add_argument("--max-model-len", type=int, default=4096, help="context length")
    parser.add_argument("--responder", help="'module:function' answering fn(prompt_text) -> str")
    parser.add_argument("--policy-version", type=int, help="report this policy_version")
    args = parser.parse_args(argv)
    server = FakeInferenceServer(
        latency=args.latency,
        model=args.model,
        seed=args.seed,
        max_model_len=args.max_model_len,
        responder=_import_responder(args.responder) if args.responder else None,
        policy_version=args.policy_version,
    )
    port = args.port or free_port()
    print(f"fake inference server on http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.Server(uvicorn_config(server.app, host="127.0.0.1", port=port)).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
