"""The HTTP face of `atropos local serve`: a Starlette app over an `Engine`, and its runner.

Endpoints (docs/local.md has every field):

- `GET /health` -> `{"status": "ok", "policy_version": k}`; never generates.
- `GET /v1/models`: the base model and each loaded LoRA adapter (vLLM's model cards).
- `GET /metrics`: vLLM's time-to-first-token and queue-time histograms (Prometheus text;
  `atropos.inference.histograms`), which an env reads for its `ttft` and `server_queue`.
- `POST /v1/completions`, `POST /v1/chat/completions`: vLLM's shapes plus `policy_version`.
- `POST /update_weights_from_disk {"model_path", "policy_version"?}` (SGLang's name): reload a
  full checkpoint in place between batches -> `{"success": true, "message", "policy_version"}`;
  a bad checkpoint gets 400 `{"success": false, "message", "error": {...}}`.
- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and
  `POST /v1/unload_lora_adapter {"lora_name"}` (vLLM's): 200 with vLLM's plain-text
  "Success: ..." line, or vLLM's 400 / 404 JSON error.
- in-flight weight updates over a process group, by vLLM's and SGLang's routes (`/pause`,
  `/init_weight_transfer_engine`, `/update_weights`, ...: `atropos.local.transfer`); a request
  failed by a pause in mode abort gets 503 with `Retry-After`.

The app is built with the HTTP rules of every server we ship (`atropos.http`): no foreign
`Host` (DNS rebinding), no page of another site, no content type a page sends without a
preflight, a bounded body (`max_body_bytes`), and no input that gets a 5xx (too deep, not
UTF-8: 400). Errors are `{"error": {"message", "type", "param", "code"}}`. With an API key every
endpoint but `/health` needs `Authorization: Bearer KEY`, on loopback too; without one (a
loopback server only, as vLLM's) every route is open. Files are read only from under
`allowed_paths`, and a weight transfer joins only a rendezvous `transfer_allow` names
(`atropos.local.guard`). Nothing here imports torch: the engine is built by `serve` (or
handed to `create_app`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from atropos.http import Rules, Site, openai_error, server_app
from atropos.http.errors import classify
from atropos.inference.histograms import CONTENT_TYPE, ServedHistograms
from atropos.local.guard import AddressPolicy, PathPolicy
from atropos.local.protocol import (
    Aborted,
    RequestError,
    Result,
    Sampling,
    json_object,
    parse_chat,
    parse_completion,
)
from atropos.local.responses import Shaper, models_body
from atropos.local.transfer import RENDEZVOUS_TIMEOUT, TransferRoutes

if TYPE_CHECKING:
    import socket

    from atropos.local.engine import Engine

log = logging.getLogger("atropos.local")
MAX_BODY_BYTES = 64 * 2**20  # a chat of a 128k-token context is a few MiB
Handler = Callable[[Request], Awaitable[Response]]


def _error(exc: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else str(exc)
    return _error(RequestError(f"{detail}: {request.method} {request.url.path}", status=status))


async def _body(request: Request) -> dict[str, Any]:
    return json_object(await request.body())


def _name(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{key} must be a non-empty string", key, kind="InvalidUserInput")
    return value


class LocalServer:
    """The routes over one engine. `app` is the ASGI app.

    Args:
        engine: a started `Engine`.
        served_model_name: the base model's name in requests and answers (default: the model
            directory as given).
        api_key: when set, every endpoint but `/health` needs `Authorization: Bearer KEY`.
        transfer_backend: the weight-transfer group's backend when the init route names none
            ("auto": nccl for a model on cuda, else gloo; "ipc": CUDA IPC handles, no group).
        allowed_paths: the directories LoRA adapters and reloaded checkpoints must lie under
            (None: the working directory and the system temp directory).
        transfer_allow: the rendezvous addresses a transfer may join (None: loopback only).
        rendezvous_timeout: seconds an init route waits for its group to form.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        served_model_name: str | None = None,
        api_key: str | None = None,
        transfer_backend: str = "auto",
        allowed_paths: list[str] | None = None,
        transfer_allow: AddressPolicy | None = None,
        rendezvous_timeout: float = RENDEZVOUS_TIMEOUT,
        host: str = "127.0.0.1",
        allowed_hosts: list[str] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        """Build the app; serving is uvicorn's job (`serve`, or `serve_in_thread` in tests).
        `host` is the bound address and `allowed_hosts` the extra `Host` names answered."""
        self.engine = engine
        self.paths = PathPolicy(allowed_paths)
        self.name = served_model_name or engine.model_dir
        self.api_key = api_key
        self.shaper = Shaper(engine.codec)
        self.created = int(time.time())
        self.histograms = ServedHistograms(self.name)
        engine.on_first_token = self.histograms.observe
        transfer = TransferRoutes(
            engine,
            transfer_backend,
            allow=transfer_allow or AddressPolicy.parse(None),
            rendezvous_timeout=rendezvous_timeout,
        )
        routes = [
            Route("/health", self._wrap(self.health, public=True), methods=["GET"]),
            Route("/v1/models", self._wrap(self.models), methods=["GET"]),
            Route("/metrics", self._wrap(self.metrics), methods=["GET"]),
            Route("/v1/completions", self._wrap(self.completions), methods=["POST"]),
            Route("/v1/chat/completions", self._wrap(self.chat), methods=["POST"]),
            Route("/update_weights_from_disk", self._wrap(self.update_weights), methods=["POST"]),
            Route("/v1/load_lora_adapter", self._wrap(self.load_lora), methods=["POST"]),
            Route("/v1/unload_lora_adapter", self._wrap(self.unload_lora), methods=["POST"]),
            *(Route(path, self._wrap(fn), methods=how) for path, fn, how in transfer.routes()),
        ]
        site = Site.of(host, allowed_hosts or (), api_key is not None)
        rules = Rules(site, ("/health",), max_body_bytes, lambda path: openai_error)
        self.app = server_app(routes, rules, exception_handlers={HTTPException: _http_error})

    def _wrap(self, handler: Handler, public: bool = False) -> Handler:
        async def endpoint(request: Request) -> Response:
            if self.api_key and not public and not self._authorized(request):
                return _error(RequestError("Unauthorized", status=401, kind="AuthenticationError"))
            try:
                return await handler(request)
            except RequestError as exc:
                return _error(exc)
            except Aborted as exc:  # a pause in mode abort: the client retries
                gone = RequestError(str(exc), status=503, kind="ServiceUnavailableError")
                return _error(gone, {"Retry-After": "1"})
            except Exception as exc:  # input only a check missed (400), or a bug (500, logged)
                status, message, _ = classify(exc)
                if status >= 500:
                    log.exception("%s %s failed", request.method, request.url.path)
                kind = "InternalServerError" if status >= 500 else "BadRequestError"
                return _error(RequestError(message, status=status, kind=kind))

        return endpoint

    def _authorized(self, request: Request) -> bool:
        given = request.headers.get("authorization", "")
        expected = f"Bearer {self.api_key}"
        return hmac.compare_digest(given.encode(), expected.encode())

    # --- endpoints ------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """`GET /health`."""
        return JSONResponse({"status": "ok", "policy_version": self.engine.policy_version})

    async def metrics(self, request: Request) -> Response:
        """`GET /metrics`: vLLM's TTFT and queue-time histograms (`inference.histograms`)."""
        return Response(self.histograms.render(), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        """`GET /v1/models`."""
        adapters = self.engine.adapter_paths()
        body = models_body(
            self.name,
            self.engine.model_dir,
            self.engine.codec.max_model_len,
            adapters,
            self.created,
        )
        return JSONResponse(body)

    def _adapter(self, model: str | None) -> str | None:
        """The adapter a request's `model` names (None: the base model); 404 if unknown."""
        if model is None or model == self.name:
            return None
        if model in self.engine.adapters:
            return model
        raise RequestError(
            f"The model `{model}` does not exist.", "model", status=404, kind="NotFoundError"
        )

    async def _generate(
        self, prompts: list[list[int]], sampling: Sampling, model: str | None
    ) -> Result:
        adapter = self._adapter(model)
        try:
            future = self.engine.submit(prompts, sampling, adapter)
        except KeyError:  # unloaded since the check above
            self._adapter(model)
            raise
        return await asyncio.wrap_future(future)

    async def completions(self, request: Request) -> Response:
        """`POST /v1/completions`."""
        parsed = parse_completion(await _body(request), self.engine.codec)
        result = await self._generate(parsed.prompts, parsed.sampling, parsed.model)
        return JSONResponse(self.shaper.completion(parsed, result, parsed.model or self.name))

    async def chat(self, request: Request) -> Response:
        """`POST /v1/chat/completions`."""
        parsed = parse_chat(await _body(request), self.engine.codec)
        result = await self._generate(parsed.prompts, parsed.sampling, parsed.model)
        return JSONResponse(self.shaper.chat(parsed, result, parsed.model or self.name))

    async def update_weights(self, request: Request) -> Response:
        """`POST /update_weights_from_disk`: SGLang's answer plus `policy_version`."""
        from atropos.local.weights import WeightsError

        try:
            body = await _body(request)
            path = self.paths.check(_name(body, "model_path"), "model_path")
            version = body.get("policy_version")
            if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
                raise RequestError(
                    f"policy_version must be an integer, got {version!r}", "policy_version"
                )
            try:
                new = await asyncio.to_thread(self.engine.reload_weights, path, version)
            except WeightsError as exc:
                raise RequestError(str(exc), "model_path") from exc
            except OSError:
                raise RequestError("model_path cannot be read", "model_path") from None
        except RequestError as exc:
            return JSONResponse(
                {"success": False, "message": exc.message} | exc.body(), status_code=exc.status
            )
        return JSONResponse(
            {
                "success": True,
                "message": f"Succeeded to update model weights from {path}.",
                "num_paused_requests": 0,
                "policy_version": new,
            }
        )

    async def load_lora(self, request: Request) -> Response:
        """`POST /v1/load_lora_adapter`, answered as vLLM answers it."""
        from atropos.local import lora

        body = await _body(request)
        for key in ("lora_name", "lora_path"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise RequestError(
                    "Both 'lora_name' and 'lora_path' must be provided.",
                    key,
                    kind="InvalidUserInput",
                )
        name, path = body["lora_name"], self.paths.check(body["lora_path"], "lora_path")
        inplace = body.get("load_inplace") is True  # vLLM: replace an adapter of that name
        if name == self.name or (name in self.engine.adapters and not inplace):
            raise self._taken(name)
        try:
            await asyncio.to_thread(self.engine.load_adapter, name, path, inplace)
        except lora.AdapterNotFound as exc:
            raise RequestError(str(exc), "lora_path", status=404) from exc
        except lora.AdapterError as exc:
            raise RequestError(str(exc), "lora_path") from exc
        except OSError:
            raise RequestError("lora_path cannot be read", "lora_path") from None
        except KeyError:
            raise self._taken(name) from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @staticmethod
    def _taken(name: str) -> RequestError:
        return RequestError(
            f"The lora adapter '{name}' has already been loaded.",
            "lora_name",
            kind="InvalidUserInput",
        )

    async def unload_lora(self, request: Request) -> Response:
        """`POST /v1/unload_lora_adapter`, answered as vLLM answers it."""
        name = _name(await _body(request), "lora_name")
        try:
            await asyncio.to_thread(self.engine.unload_adapter, name)
        except KeyError:
            raise RequestError(
                f"The lora adapter '{name}' cannot be found.", "lora_name", status=404
            ) from None
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def create_app(
    engine: Engine, *, served_model_name: str | None = None, api_key: str | None = None
) -> Starlette:
    """The ASGI app over a started `engine` (see `LocalServer`)."""
    return LocalServer(engine, served_model_name=served_model_name, api_key=api_key).app


def run(
    model_dir: str,
    sock: socket.socket,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    log_level: str = "warning",
    transfer_backend: str = "auto",
    allowed_paths: list[str] | None = None,
    transfer_allow: AddressPolicy | None = None,
    rendezvous_timeout: float = RENDEZVOUS_TIMEOUT,
    allowed_hosts: list[str] | None = None,
    **engine_options: Any,
) -> None:
    """Load the model, then serve on `sock` (bound by the caller, so a busy port fails before
    the model loads and before anything says it listens) until interrupted (`engine_options`
    go to `Engine`)."""
    from atropos.cli.listen import base_url, serve
    from atropos.local.engine import Engine

    try:
        engine = Engine(model_dir, **engine_options).start()
    except BaseException:
        sock.close()
        raise
    try:
        app = LocalServer(
            engine,
            served_model_name=served_model_name,
            api_key=api_key,
            transfer_backend=transfer_backend,
            allowed_paths=allowed_paths,
            transfer_allow=transfer_allow,
            rendezvous_timeout=rendezvous_timeout,
            host=sock.getsockname()[0],
            allowed_hosts=allowed_hosts,
        ).app
        print(
            f"atropos local: {base_url(sock)}/v1 model={served_model_name or model_dir}"
            f" device={engine.device} policy_version={engine.policy_version}"
            f"{' (api key required)' if api_key else ''}",
            flush=True,
        )
        serve(app, sock, log_level)
    finally:
        engine.close()
