"""The backend contract every inference server client meets, and the HTTP plumbing they share.

A backend (`openai.py`, `vllm.py`, `sglang.py`, `trl.py`) talks to one server. It makes exactly
one attempt per call: retries, failover, capacity and deadlines belong to `manager.ServerManager`.
`HTTPBackend` holds one `http.HTTPClient` per backend (a lean keep-alive HTTP/1.1 client,
opened lazily inside the running loop, with an unlimited connection pool: RL workloads keep
thousands of requests in flight), and translates every transport failure into
`errors.InferenceError` in one place (`_request`).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import sys
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import msgspec
from openai.types import Completion
from openai.types.chat import ChatCompletion
from typing_extensions import TypedDict

from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError, InferenceTimeout, UnsupportedOperation
from atropos.inference.http import HTTPClient, HTTPResponse

Split = Literal["train", "eval"]
T = TypeVar("T")

TokensAndLogprobs = tuple[list[int], list[list[int]], list[list[float]], list[str]]
"""(prompt_tokens, output tokens per choice, output logprobs per choice, finish reasons)."""

MISSING_LOGPROB = -9999.0
"""Stands in for a logprob the server reports as null (vLLM's own convention for -inf)."""


class PolicyVersions:
    """The lowest `policy_version` the inference servers reported while this was current.

    Servers that hot-swap weights (our local server) put a top-level `"policy_version": <int>`
    in their answers: the weight version that generated every token of that answer. Every
    backend call notes it (`note_policy_version`, in `HTTPBackend._request`) into the
    `PolicyVersions` of the calling context. Use `with PolicyVersions() as seen: ...`: calls
    made inside the block, by this task or by tasks it starts there (they copy the context),
    are noted in `seen.lowest` (None when no server reported a version), and also in any
    `PolicyVersions` block around it. The env runners open one per rollout (a group is stamped
    with the lowest version of its completions); `ManagedServer` opens one per generation (a
    sequence node records the lowest version of its tokens).

    >>> with PolicyVersions() as outer:
    ...     with PolicyVersions() as inner:
    ...         note_policy_version({"choices": [], "policy_version": 7})
    ...     note_policy_version({"policy_version": 5})
    >>> inner.lowest, outer.lowest
    (7, 5)
    """

    __slots__ = ("lowest", "_outer", "_token")

    def __init__(self) -> None:
        self.lowest: int | None = None
        self._outer: PolicyVersions | None = None
        self._token: contextvars.Token[PolicyVersions | None] | None = None

    def note(self, version: int) -> None:
        """Record one reported version here and in every block around this one."""
        box: PolicyVersions | None = self
        while box is not None:
            if box.lowest is None or version < box.lowest:
                box.lowest = version
            box = box._outer

    def __enter__(self) -> PolicyVersions:
        self._outer = _POLICY_VERSIONS.get()
        self._token = _POLICY_VERSIONS.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _POLICY_VERSIONS.reset(self._token)
            self._token = None


_POLICY_VERSIONS: contextvars.ContextVar[PolicyVersions | None] = contextvars.ContextVar(
    "atropos_policy_versions", default=None
)


def _version_of(answer: Any) -> int | None:
    if isinstance(answer, dict):
        version = answer.get("policy_version")
    elif isinstance(answer, list):  # SGLang answers n > 1 with a list of objects
        found = [_version_of(item) for item in answer if isinstance(item, dict)]
        return min((v for v in found if v is not None), default=None)
    else:  # a typed answer (msgspec Struct) or None
        version = getattr(answer, "policy_version", None)
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def note_policy_version(answer: Any) -> None:
    """Note the answer's top-level `policy_version` (if any) in the current `PolicyVersions`."""
    box = _POLICY_VERSIONS.get()
    if box is not None:
        version = _version_of(answer)
        if version is not None:
            box.note(version)


class Call:
    """What the backend request made now belongs to: the manager's call (`ServerManager._call`).

    `deadline`: the call's loop time deadline, absolute (set once per call, at its start; every
    stage checks it, none re-arms a timer of its own: the HTTP client's one timer per request
    fires at the sooner of it and the request's `config.timeout`). `headers`: the session hint
    header lines of the server it goes to (`routing.header_lines`), or None. Backends that read it
    (`HTTPBackend`, `keeps_deadline = True`) are called without a timer around them; any other
    backend is awaited under one (`within`).
    """

    __slots__ = ("deadline", "headers")

    def __init__(self, deadline: float, headers: str | None = None) -> None:
        self.deadline = deadline
        self.headers = headers


CURRENT_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "atropos_inference_call", default=None
)
"""The `Call` whose backend request is being made now (None outside `ServerManager`)."""


class CallDeadline(TimeoutError):
    """The `Call`'s deadline passed during a backend request (not the request's own timeout):
    `ServerManager` reports it as the call's deadline, as it did when its own timer fired."""


def _expired(call: Call | None) -> bool:
    """Whether `call`'s deadline has passed (within a millisecond: a timer may run that early)."""
    return call is not None and asyncio.get_running_loop().time() >= call.deadline - 1e-3


class PromptLogprobs(TypedDict):
    """Top-k logprobs of every prompt position (`get_logprobs`).

    Position 0 has no context, so its lists are empty; every other position has `top_k` entries,
    best first. All three lists have one entry per prompt token.
    """

    prompt_tokens: list[int]
    prompt_topk_token_ids: list[list[int]]
    prompt_topk_logprobs: list[list[float]]


@runtime_checkable
class InferenceServer(Protocol):
    """What `ServerManager` and `ManagedServer` need from a backend."""

    config: APIServerConfig
    supports_tokens: ClassVar[bool]
    supports_prompt_logprobs: ClassVar[bool]

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion: ...

    async def completion(self, **kwargs: Any) -> Completion: ...

    async def tokens_and_logprobs_completion(
        self,
        *,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        n: int = 1,
        max_tokens: int | None = None,
        **sampling: Any,
    ) -> TokensAndLogprobs: ...

    async def get_logprobs(self, **kwargs: Any) -> PromptLogprobs: ...

    async def check_health(self, timeout: float = 5.0) -> bool: ...

    async def aclose(self) -> None: ...


BACKENDS: dict[str, str] = {
    "openai": "atropos.inference.openai:OpenAIBackend",
    "vllm": "atropos.inference.vllm:VLLMBackend",
    "sglang": "atropos.inference.sglang:SGLangBackend",
    "trl": "atropos.inference.trl:TRLBackend",
}
"""`server_type` -> "module:Class", imported only when a server of that type is created."""


def create_backend(config: APIServerConfig, *, tokenizer: Any = None) -> InferenceServer:
    """The backend for `config.server_type` (one per server)."""
    target = BACKENDS.get(config.server_type)
    if target is None:
        raise ValueError(f"unknown server_type {config.server_type!r}; known: {sorted(BACKENDS)}")
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    backend: InferenceServer = cls(config, tokenizer=tokenizer)
    return backend


def server_root(base_url: str) -> str:
    """The server's root URL: `base_url` without a trailing `/v1` path segment.

    Only a whole last path segment is removed, never a substring elsewhere in the URL.

    >>> server_root("http://node1:9004/v1")
    'http://node1:9004'
    >>> server_root("https://v1.example.com/proxy/v1/")
    'https://v1.example.com/proxy'
    >>> server_root("http://127.0.0.1:8000")
    'http://127.0.0.1:8000'
    >>> server_root("http://host/api/v1beta")
    'http://host/api/v1beta'
    """
    parts = urlsplit(base_url.strip())
    path = parts.path.rstrip("/")
    if path.rsplit("/", 1)[-1] == "v1":
        path = path[: -len("v1")].rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def strip_double_bos(ids: list[int], bos_token_id: int | None) -> list[int]:
    """Drop one BOS when a prompt starts with two (template text + tokenizer both added one).

    >>> strip_double_bos([1, 1, 5, 6], 1)
    [1, 5, 6]
    >>> strip_double_bos([1, 5, 6], 1)
    [1, 5, 6]
    """
    if bos_token_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_token_id:
        return ids[1:]
    return ids


def normalize_max_tokens(kwargs: dict[str, Any]) -> int | None:
    """Pop `max_tokens` and its aliases (`max_new_tokens`, `max_completion_tokens`) from kwargs.

    >>> kw = {"max_new_tokens": 7, "temperature": 1.0}
    >>> normalize_max_tokens(kw), kw
    (7, {'temperature': 1.0})
    """
    value = None
    for key in ("max_completion_tokens", "max_new_tokens", "max_tokens"):
        if key in kwargs:
            found = kwargs.pop(key)
            value = found if found is not None else value
    return None if value is None else int(value)


IGNORED_KWARGS = ("split", "skip_reasoning", "model")
"""Routing hints a backend drops: the manager uses `split`; `model` comes from the config."""
_NOT_BODY = frozenset((*IGNORED_KWARGS, "extra_headers", "extra_query", "timeout", "extra_body"))
"""Keys `HTTPBackend._model` removes or merges (a call without any is copied as it is)."""


def _encode_hook(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)  # pydantic models, e.g. openai message objects
    if callable(dump):
        return dump(exclude_none=True)
    raise TypeError(f"cannot send {type(obj).__name__} as JSON")


_ENCODER = msgspec.json.Encoder(enc_hook=_encode_hook)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare for inference servers; use our own backoff


class HTTPBackend:
    """Base of the HTTP backends: session, auth, one-attempt requests, health probe, tokenizer.

    Args:
        config: the server.
        tokenizer: a Hugging Face style tokenizer (`encode`, `decode`, `bos_token_id`). Optional:
            when absent and one is needed it is loaded lazily from `config.tokenizer_name`
            (or `config.model_name` when that is "none").
    """

    supports_tokens: ClassVar[bool] = False
    supports_prompt_logprobs: ClassVar[bool] = False
    keeps_deadline: ClassVar[bool] = True
    """Every wait of a call reads `CURRENT_CALL`'s deadline: the manager adds no timer."""
    health_path: ClassVar[str] = "/health"
    """GET at the server root; never a generation endpoint, so probes spend no tokens."""

    def __init__(self, config: APIServerConfig, *, tokenizer: Any = None) -> None:
        if not config.base_url:
            raise ValueError(f"{type(self).__name__} needs config.base_url, got an empty one")
        self.config = config
        self.base_url = config.base_url.rstrip("/")
        self.root = server_root(config.base_url)
        self.tokenizer: Any = tokenizer
        self._bos: tuple[Any, int | None] = (None, None)
        self._session: HTTPClient | None = None
        self._closed = False
        self.health_error = ""  # what the last failed health probe met

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url} model={self.config.model_name!r}>"

    @property
    def health_url(self) -> str:
        """The URL `check_health` GETs."""
        return self.root + self.health_path

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = self.config.api_key.get_secret_value()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _http(self) -> HTTPClient:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._session is None:
            self._session = HTTPClient(self._headers())
        return self._session

    async def _request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        decoder: msgspec.json.Decoder[Any] | None = None,
    ) -> Any:
        """One HTTP exchange, JSON in and out; every failure becomes an `InferenceError`.

        `decoder` reads the answer into a typed shape (a fast path); an answer it cannot read
        that is still JSON is returned as plain JSON data, for the caller's general path. A
        top-level `policy_version` in the answer is recorded (`note_policy_version`).
        """
        total = self.config.timeout if timeout is None else timeout
        data = None if body is None else _ENCODER.encode(body)
        call = CURRENT_CALL.get()
        client = self._session
        if client is None or self._closed:
            client = self._http()
        try:
            if call is None:
                answer = await client.request(method, url, data, timeout=total)
            else:
                answer = await client.request(
                    method, url, data, call.headers, timeout=total, deadline=call.deadline
                )
        except TimeoutError as exc:
            if _expired(call):
                raise CallDeadline(f"{method} {url}: the call's deadline passed") from None
            raise InferenceTimeout(
                f"{method} {url}: no answer within {total:g} s", server=self.base_url
            ) from exc
        except OSError as exc:  # refused, reset, unreachable, not HTTP (ConnectionError)
            raise InferenceError(
                f"{method} {url}: {type(exc).__name__}: {exc}",
                retryable=True,
                kind="connection",
                server=self.base_url,
            ) from exc
        return self._read(method, url, answer, decoder)

    def _read(
        self,
        method: str,
        url: str,
        answer: HTTPResponse,
        decoder: msgspec.json.Decoder[Any] | None,
    ) -> Any:
        """`_request`'s answer as JSON data (an `InferenceError` for a failed status)."""
        status, raw = answer.status, answer.body
        if status >= 400:
            raise InferenceError.from_status(
                status,
                raw.decode("utf-8", "replace"),
                server=self.base_url,
                retry_after=_retry_after(answer.headers.get("retry-after")),
                url=url,
            )
        if not raw:
            return None
        try:
            if decoder is not None:
                try:
                    data = decoder.decode(raw)
                except msgspec.ValidationError:
                    data = msgspec.json.decode(raw)  # JSON of another shape: the slow path
            else:
                data = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InferenceError(
                f"{method} {url}: the answer is not JSON ({raw[:200]!r})", server=self.base_url
            ) from exc
        note_policy_version(data)
        return data

    def _post(
        self, url: str, body: Mapping[str, Any], decoder: msgspec.json.Decoder[Any] | None = None
    ) -> Awaitable[Any]:
        """`_request("POST", ...)` (its coroutine: no frame of its own)."""
        return self._request("POST", url, body, decoder=decoder)

    async def check_health(self, timeout: float = 5.0) -> bool:
        """True when `GET health_url` answers 2xx within `timeout` seconds. Spends no tokens.

        What a failed probe met is kept in `health_error` ("" after a passing one), for the
        pool's messages about an unreachable server.
        """
        try:
            answer = await self._http().request("GET", self.health_url, timeout=timeout)
        except TimeoutError:
            self.health_error = f"no answer within {timeout:g} s"
            return False
        except OSError as exc:
            self.health_error = f"{type(exc).__name__}: {exc}"
            return False
        ok = 200 <= answer.status < 300  # any body (JSON, text or none); only the status counts
        self.health_error = "" if ok else f"HTTP {answer.status}"
        return ok

    async def aclose(self) -> None:
        """Close the connection pool; the backend cannot be used afterwards."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _model(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """kwargs for the wire: routing hints dropped, `extra_body` merged, our model name set."""
        if _NOT_BODY.isdisjoint(kwargs):  # the usual call: sampling fields only
            body = dict(kwargs)
            body["model"] = self.config.model_name
            return body
        body = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
        for key in ("extra_headers", "extra_query", "timeout"):
            body.pop(key, None)  # OpenAI-client options that are not part of the body
        extra = body.pop("extra_body", None) or {}
        body.update(extra)
        body["model"] = self.config.model_name
        return body

    async def _get_tokenizer(self) -> Any:
        if self.tokenizer is None:
            name = self.config.tokenizer_name
            name = self.config.model_name if name == "none" else name
            call = CURRENT_CALL.get()  # the call's deadline bounds the load too
            try:
                from atropos.inference.tokenizer import load_tokenizer

                loading = asyncio.to_thread(load_tokenizer, name)
                self.tokenizer = await (loading if call is None else within(call.deadline, loading))
            except Exception as exc:  # any loader failure means: no tokenizer for this server
                if isinstance(exc, TimeoutError) and _expired(call):
                    raise CallDeadline(f"loading the tokenizer {name!r}") from None
                raise UnsupportedOperation(
                    f"{type(self).__name__} needs a tokenizer here and could not load {name!r} "
                    f"({type(exc).__name__}: {exc}); pass tokenizer= or set tokenizer_name",
                    server=self.base_url,
                ) from exc
        return self.tokenizer

    async def _prompt_ids(
        self, prompt: str | None, input_ids: list[int] | None, *, require: bool = False
    ) -> list[int] | None:
        """The prompt as token ids, or None to let the server tokenize `prompt` itself.

        Text is encoded locally only when `require`d, a tokenizer was given, or `tokenizer_name`
        is set; a doubled leading BOS is stripped whenever the tokenizer (hence BOS) is known.
        """
        if input_ids is None and prompt is None:
            raise ValueError("pass prompt= or input_ids=")
        if input_ids is not None:
            return self._given_ids(input_ids)
        if require or self.tokenizer is not None or self.config.tokenizer_name != "none":
            ids = list((await self._get_tokenizer()).encode(prompt))
        else:
            return None
        return strip_double_bos(ids, self._bos_id())

    def _given_ids(self, input_ids: list[int]) -> list[int]:
        """`_prompt_ids` of given ids (no await: the usual call's path)."""
        ids = input_ids  # taken as is when it is a list of ints (checked by its first)
        if type(ids) is not list or (ids and type(ids[0]) is not int):
            ids = [int(t) for t in input_ids]
        return strip_double_bos(ids, self._bos_id())

    def _bos_id(self) -> int | None:
        """The tokenizer's BOS id, read once per tokenizer (transformers computes it on every
        read)."""
        if self._bos[0] is not self.tokenizer:
            self._bos = (self.tokenizer, getattr(self.tokenizer, "bos_token_id", None))
        return self._bos[1]

    def _unsupported(self, what: str, hint: str) -> UnsupportedOperation:
        return UnsupportedOperation(
            f"{type(self).__name__} does not support {what}: {hint}", server=self.base_url
        )

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """An OpenAI chat completion (see the backend's module docstring for the wire fields)."""
        raise self._unsupported("chat_completion", "use an OpenAI-compatible backend")

    async def completion(self, **kwargs: Any) -> Completion:
        """An OpenAI text completion."""
        raise self._unsupported("completion", "use an OpenAI-compatible backend")

    def tokens_and_logprobs_completion(
        self,
        *,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        n: int = 1,
        max_tokens: int | None = None,
        **sampling: Any,
    ) -> Coroutine[Any, Any, TokensAndLogprobs]:
        """Sample `n` completions; return exact token ids and their logprobs (await it).

        `max_tokens` joins the sampling kwargs (where an alias of it may already be); the
        backend's `_sample_tokens` does the rest (its coroutine is returned: no frame here).
        """
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        return self._sample_tokens(prompt, input_ids, n, sampling)

    async def _sample_tokens(
        self, prompt: str | None, input_ids: list[int] | None, n: int, sampling: dict[str, Any]
    ) -> TokensAndLogprobs:
        """`tokens_and_logprobs_completion` of this backend (`max_tokens` is in `sampling`)."""
        raise self._unsupported(
            "tokens_and_logprobs_completion", "use server_type 'vllm' or 'sglang'"
        )

    async def get_logprobs(self, **kwargs: Any) -> PromptLogprobs:
        """Top-k logprobs of every prompt position."""
        raise self._unsupported("get_logprobs", "use server_type 'vllm' or 'sglang'")


def check_choice_counts(
    server: str, n: int, outputs: list[list[int]], logprobs: list[list[float]], finish: list[str]
) -> None:
    """Raise a protocol `InferenceError` unless there are `n` aligned choices."""
    if not (len(outputs) == len(logprobs) == len(finish) == n):
        raise InferenceError(
            f"asked for {n} choices, got {len(outputs)} token lists, {len(logprobs)} logprob "
            f"lists and {len(finish)} finish reasons",
            server=server,
        )
    if list(map(len, outputs)) == list(map(len, logprobs)):
        return
    for i, (ids, lps) in enumerate(zip(outputs, logprobs, strict=True)):
        if len(ids) != len(lps):
            raise InferenceError(
                f"choice {i}: {len(ids)} tokens but {len(lps)} logprobs", server=server
            )


if sys.version_info >= (3, 11):

    async def within(deadline: float, call: Awaitable[T]) -> T:
        """Await `call`, raising TimeoutError at loop time `deadline` (no extra task).

        Unlike `asyncio.wait_for` on Python 3.11, a cancellation of the caller that lands while
        `call` is being cancelled for its timeout is never lost nor raised early: an
        `asyncio.Condition.wait()` in `call` gets its lock back before the error leaves.
        """
        async with asyncio.timeout_at(deadline):
            return await call

else:  # pragma: no cover - Python 3.10

    async def within(deadline: float, call: Awaitable[T]) -> T:
        """Await `call`, raising TimeoutError at loop time `deadline`."""
        remaining = deadline - asyncio.get_running_loop().time()
        return await asyncio.wait_for(call, max(0.0, remaining))


async def gather_or_cancel(aws: Iterable[Awaitable[T]]) -> list[T]:
    """`asyncio.gather`, except that the first failure cancels (and awaits) the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
