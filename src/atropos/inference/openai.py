"""Backend for any OpenAI-compatible endpoint (OpenAI, OpenRouter, vLLM, SGLang, proxies).

Wire contract (OpenAI API reference, https://platform.openai.com/docs/api-reference):

- `POST {base_url}/chat/completions` and `POST {base_url}/completions`: we send the caller's
  kwargs as the JSON body (`messages` or `prompt`, `n`, `max_tokens`, `temperature`, `stop`, ...),
  with `model` set to `config.model_name` and `extra_body` merged in (as the OpenAI client does).
  We read the whole answer as `openai.types.chat.ChatCompletion` / `openai.types.Completion`
  (validated; when a server's answer strays from OpenAI's types, e.g. an unknown finish reason,
  built leniently with `model_construct` as the OpenAI client does). Server extras such as
  vLLM's `prompt_token_ids` survive as attributes, as does our local server's top-level
  `policy_version`, which is also noted for the caller (`base.PolicyVersions`).
- Health: `GET {base_url}/models` (lists models; spends no tokens). Upstream (atroposlib 0.4.0)
  probed with a real one-token generation every second.

`n`: some OpenAI-compatible servers ignore it and answer one choice. With
`config.n_kwarg_is_ignored` we send `n` separate requests (one request when n == 1, not two as
upstream did); without it we send `n` once and, if exactly one choice comes back, remember that this
server ignores `n` and fetch the missing `n - 1` in parallel.

Token ids and logprobs (`tokens_and_logprobs_completion`, `get_logprobs`) are not part of the
OpenAI API: this backend raises `UnsupportedOperation`; use server_type "vllm" or "sglang".

An answer with a choice whose finish reason is `abort` is a retryable error (`check_not_aborted`),
never a completion: vLLM (0.32) answers a request that `POST /pause?mode=abort` (a weight update)
ended with 200 and the partial output so far, SGLang likewise after `/pause_generation` in mode
abort; scored, that cut rollout would be a reward the policy never earned. Our local server says
503 for the same event, so both count as `http_5xx`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import pydantic
from openai.types import Completion
from openai.types.chat import ChatCompletion

from atropos.inference.base import HTTPBackend, gather_or_cancel
from atropos.inference.config import APIServerConfig
from atropos.inference.errors import InferenceError

R = TypeVar("R", ChatCompletion, Completion)
ABORTED = "abort"  # the finish reason of a generation the server ended (vLLM, SGLang)


def check_not_aborted(server: str, reasons: Sequence[Any]) -> None:
    """Raise a retryable `InferenceError` when any of the finish `reasons` is `abort`.

    One `in` over the list: every backend passes the reasons as read from JSON (strings, None,
    or an object the backend has already turned into its `type` string), so none is an
    `abort` by its `str` alone; a hot path, once per inference call.

    >>> check_not_aborted("http://s/v1", ["stop", "length"])
    >>> check_not_aborted("http://s/v1", ["length", "abort"])
    Traceback (most recent call last):
    ...
    atropos.inference.errors.InferenceError: the server aborted the generation (finish_reason \
'abort': a pause in mode abort for a weight update, or a shutdown); its partial output is no \
rollout, so the request is retried [http://s/v1]
    """
    if ABORTED in reasons:
        raise InferenceError(
            "the server aborted the generation (finish_reason 'abort': a pause in mode abort for"
            " a weight update, or a shutdown); its partial output is no rollout, so the request"
            " is retried",
            retryable=True,
            kind="http_5xx",
            server=server,
        )


def merge_completions(results: list[R]) -> R:
    """One response holding every choice of `results`, re-indexed 0..k-1, usage summed."""
    first = results[0]
    choices = [c for r in results for c in r.choices]
    choices = [c.model_copy(update={"index": i}) for i, c in enumerate(choices)]
    update: dict[str, Any] = {"choices": choices}
    usages = [r.usage for r in results]
    if len(results) > 1 and all(u is not None for u in usages):
        update["usage"] = first.usage.model_copy(  # type: ignore[union-attr]
            update={
                key: sum(getattr(u, key) or 0 for u in usages)
                for key in ("prompt_tokens", "completion_tokens", "total_tokens")
            }
        )
    return first.model_copy(update=update)


class OpenAIBackend(HTTPBackend):
    """Chat and text completions from any OpenAI-compatible server (see the module docstring)."""

    health_path = "/models"

    def __init__(self, config: APIServerConfig, *, tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer=tokenizer)
        self.n_kwarg_is_ignored = config.n_kwarg_is_ignored

    @property
    def health_url(self) -> str:
        """`GET {base_url}/models`: cheap, authenticated like generation, never spends tokens."""
        return self.base_url + self.health_path

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """POST `/chat/completions` with the OpenAI kwargs; `n` choices come back merged."""
        return await self._create("/chat/completions", kwargs, ChatCompletion)

    async def completion(self, **kwargs: Any) -> Completion:
        """POST `/completions` with the OpenAI kwargs; `n` choices come back merged."""
        return await self._create("/completions", kwargs, Completion)

    async def _create(self, path: str, kwargs: dict[str, Any], kind: type[R]) -> R:
        if kwargs.get("stream"):
            raise self._unsupported("stream=True", "the manager returns whole responses")
        body = self._model(kwargs)
        n = int(body.pop("n", None) or 1)
        if self.n_kwarg_is_ignored and n > 1:
            every: list[R] = await gather_or_cancel(self._one(path, body, kind) for _ in range(n))
            return merge_completions(every)
        first = await self._one(path, {**body, "n": n} if n > 1 else body, kind)
        got = len(first.choices)
        if got == n:
            return first
        if got == 1 and n > 1:
            self.n_kwarg_is_ignored = True  # this server ignores n: fan out from now on
            rest: list[R] = await gather_or_cancel(
                self._one(path, body, kind) for _ in range(n - 1)
            )
            rest.insert(0, first)
            return merge_completions(rest)
        raise InferenceError(f"asked for n={n} choices, got {got}", server=self.base_url)

    async def _one(self, path: str, body: dict[str, Any], kind: type[R]) -> R:
        data = await self._post(self.base_url + path, body)
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise InferenceError(
                f"POST {path}: expected an object with 'choices', got {str(data)[:200]}",
                server=self.base_url,
            )
        reasons = [c.get("finish_reason") for c in data["choices"] if isinstance(c, dict)]
        check_not_aborted(self.base_url, reasons)
        try:
            return kind.model_validate(data)  # fast (pydantic-core)
        except pydantic.ValidationError:
            return kind.model_construct(**data)  # lenient, as the OpenAI client itself reads
