"""Request fields in, generation results out: what the local server and its engine exchange.

`parse_completion` and `parse_chat` check a JSON body (every bad field is a `RequestError`
naming it, answered 400) and turn it into prompts (token ids) and a `Sampling`; the engine
returns a `Result`; `atropos.local.responses` shapes it as vLLM does. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atropos.http import decode
from atropos.wire import ProtocolError

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs
PAUSE_MODES = ("abort", "wait", "keep")  # vLLM's modes of POST /pause (`Engine.pause`)


class Aborted(RuntimeError):
    """A request failed by a pause in mode abort (the server answers 503: retry it)."""


class RequestError(Exception):
    """A request the server refuses: an OpenAI-style error with an HTTP status."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, kind: str = ""
    ) -> None:
        """Keep the message, the offending field, the status and the error type."""
        super().__init__(message)
        self.message, self.param, self.status = message, param, status
        self.kind = kind or ("NotFoundError" if status == 404 else "BadRequestError")

    def body(self) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`, as OpenAI and vLLM answer."""
        error = {"message": self.message, "type": self.kind, "param": self.param}
        return {"error": error | {"code": self.status}}


@dataclass(frozen=True)
class Sampling:
    """How to sample one request's rows (`n` per prompt)."""

    n: int = 1
    max_tokens: int | None = 16  # None: the rest of the context (`max_model_len` - prompt)
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1): off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # alternatives per output position; None: no logprobs asked
    prompt_logprobs: int | None = None  # alternatives per prompt position


@dataclass
class Output:
    """One generated row: ids with their raw logprobs, top alternatives, why it ended, text."""

    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]  # per position, the best `Sampling.logprobs` (id, lp)
    finish_reason: str  # "stop" | "length"
    stop_reason: str | int | None
    text: str


#: Per prompt position: None for the first, then (id, logprob, rank) with the prompt's own token
#: first, followed by the best alternatives.
PromptLogprobs = list[list[tuple[int, float, int]] | None]


@dataclass
class Result:
    """Everything one request generated: its first tokens under weight version
    `policy_version`, its last under `policy_version_last` (the same unless the weights
    changed under a kept request, see `atropos.local.engine`)."""

    outputs: list[list[Output]]  # [prompt][choice]
    prompt_logprobs: list[PromptLogprobs | None]  # [prompt], None unless asked
    policy_version: int
    policy_version_last: int | None = None  # None: policy_version


@dataclass
class Parsed:
    """A checked request: the model it names, its prompts as ids, and how to sample."""

    model: str | None
    prompts: list[list[int]]
    sampling: Sampling
    return_token_ids: bool
    as_token_ids: bool  # spell logprob tokens "token_id:<id>"


class Codec:
    """The tokenizer as the server uses it, with the model's vocabulary and context sizes."""

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int) -> None:
        """`vocab_size`: ids below it are valid; `max_model_len`: prompt plus output tokens."""
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of `text`."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """One token as logprob entries spell it."""
        return self.decode([token_id], skip_special_tokens=False)


# --- fields ---------------------------------------------------------------------------------


def get_int(body: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int | None:
    """An optional integer within [lo, hi]; `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be an integer, got {value!r}", key)
    if not lo <= value <= hi:
        raise RequestError(f"{key} must be between {lo} and {hi}, got {value}", key)
    return value


def get_float(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    """An optional number within [lo, hi]; `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{key} must be a number, got {value!r}", key)
    if not lo <= value <= hi:
        raise RequestError(f"{key} must be between {lo} and {hi}, got {value}", key)
    return float(value)


def get_bool(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """An optional boolean; `default` when absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be a boolean, got {value!r}", key)
    return value


def get_ids(value: Any, key: str, vocab_size: int) -> list[int]:
    """A non-empty list of token ids below `vocab_size`."""
    if not isinstance(value, list) or not value:
        raise RequestError(f"{key} must be a non-empty list of token ids", key)
    for i in value:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab_size:
            raise RequestError(f"{key} holds {i!r}, not a token id below {vocab_size}", key)
    return list(value)


def get_stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """`stop`: absent, a string, or a list of non-empty strings."""
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise RequestError("stop must be a non-empty string or a list of them", "stop")
    return tuple(value)


def _model(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"model must be a string, got {model!r}", "model")
    return model or None


def _all(value: Any, kind: type) -> bool:
    """Whether `value` is a non-empty list of `kind`."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, kind) for v in value)


def _refuse(body: Mapping[str, Any], *keys: str) -> None:
    for key in keys:
        if get_bool(body, key):
            raise RequestError(f"{key}=true is not supported by atropos local serve", key)


def _sampling(
    body: Mapping[str, Any],
    codec: Codec,
    *,
    max_key: str,
    max_default: int | None,
    logprobs: int | None,
) -> Sampling:
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise RequestError("stop_token_ids must be a list of token ids", "stop_token_ids")
    top_k = get_int(body, "top_k", 0, -1, codec.vocab_size)
    # vLLM: an absent field takes the request's default, an explicit null is "no limit"
    max_default = max_default if body.get(max_key, max_default) is not None else None
    return Sampling(
        n=get_int(body, "n", 1, 1, 1024) or 1,
        max_tokens=get_int(body, max_key, max_default, 1, codec.max_model_len),
        temperature=get_float(body, "temperature", 1.0, 0.0, 100.0),
        top_p=get_float(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=max(top_k or 0, 0),
        seed=get_int(body, "seed", None, -(1 << 63), (1 << 64) - 1),
        stop=get_stop(body),
        stop_token_ids=tuple(get_ids(stop_ids, "stop_token_ids", codec.vocab_size))
        if stop_ids
        else (),
        ignore_eos=get_bool(body, "ignore_eos"),
        include_stop_str_in_output=get_bool(body, "include_stop_str_in_output"),
        skip_special_tokens=get_bool(body, "skip_special_tokens", True),
        logprobs=logprobs,
        prompt_logprobs=get_int(body, "prompt_logprobs", None, 0, MAX_LOGPROBS),
    )


def _check_lengths(prompts: list[list[int]], sampling: Sampling, codec: Codec, key: str) -> None:
    """Refuse prompts that leave no room for the requested tokens (vLLM's message)."""
    limit = codec.max_model_len
    for ids in prompts:
        wanted = sampling.max_tokens or 1
        if len(ids) + wanted > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested"
                f" {len(ids) + wanted} tokens ({len(ids)} in the prompt, {wanted} in the"
                " completion). Please reduce the length of the prompt or the completion.",
                key,
            )


# --- the two generation requests ------------------------------------------------------------


def parse_completion(body: Mapping[str, Any], codec: Codec) -> Parsed:
    """`POST /v1/completions`: `prompt` is a string, strings, token ids or lists of them.

    `max_tokens` absent is 16 (vLLM's `CompletionRequest.max_tokens`, OpenAI's default); null
    is the rest of the context, as in vLLM (`vllm.entrypoints.utils.get_max_tokens`)."""
    _refuse(body, "stream", "echo")
    prompt: Any = body.get("prompt")
    vocab = codec.vocab_size
    if isinstance(prompt, str) or _all(prompt, str):
        texts = [prompt] if isinstance(prompt, str) else prompt
        prompts = [codec.encode(t, add_special_tokens=True) for t in texts]
        if not all(prompts):
            raise RequestError("prompt must not be empty (it encodes to no tokens)", "prompt")
    elif _all(prompt, list):
        prompts = [get_ids(p, "prompt", vocab) for p in prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = [get_ids(prompt, "prompt", vocab)]
    else:
        raise RequestError(
            "prompt must be a string, a list of strings, a list of token ids or a list of such"
            " lists",
            "prompt",
        )
    sampling = _sampling(
        body,
        codec,
        max_key="max_tokens",
        max_default=16,
        logprobs=get_int(body, "logprobs", None, 0, MAX_LOGPROBS),
    )
    _check_lengths(prompts, sampling, codec, "max_tokens")
    return Parsed(
        model=_model(body),
        prompts=prompts,
        sampling=sampling,
        return_token_ids=get_bool(body, "return_token_ids"),
        as_token_ids=get_bool(body, "return_tokens_as_token_ids"),
    )


def parse_chat(body: Mapping[str, Any], codec: Codec) -> Parsed:
    """`POST /v1/chat/completions`: `messages` rendered with the tokenizer's chat template.

    No `max_completion_tokens` or `max_tokens` (absent or null): the rest of the context,
    `max_model_len` minus the prompt, as vLLM's `ChatCompletionRequest` (both default None)."""
    _refuse(body, "stream")
    text = render_chat(body, codec.tokenizer)
    ids = codec.encode(text, add_special_tokens=False)
    if not ids:
        raise RequestError("the rendered chat prompt is empty", "messages")
    want = get_bool(body, "logprobs")
    k = get_int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if k and not want:
        raise RequestError("top_logprobs needs logprobs=true", "top_logprobs")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    sampling = _sampling(
        body, codec, max_key=key, max_default=None, logprobs=(k or 0) if want else None
    )
    _check_lengths([ids], sampling, codec, key)
    return Parsed(
        model=_model(body),
        prompts=[ids],
        sampling=sampling,
        return_token_ids=get_bool(body, "return_token_ids"),
        as_token_ids=get_bool(body, "return_tokens_as_token_ids"),
    )


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body read as a JSON object; anything else is a `RequestError` (400).

    >>> json_object(b'{"n": 2}')
    {'n': 2}
    >>> json_object(b"[1]")
    Traceback (most recent call last):
    ...
    atropos.local.protocol.RequestError: the body must be a JSON object
    """
    try:
        return decode.json_object(raw)
    except ProtocolError as err:
        raise RequestError(str(err)) from None


def render_chat(body: Mapping[str, Any], tokenizer: Any) -> str:
    """The prompt text of a chat request: the chat template, with the generation prompt."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", "messages")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'", "messages")
        if not isinstance(m.get("content"), str | list | None):
            raise RequestError("message content must be a string, a list or null", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("tools must be a list", "tools")
    extra = body.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=get_bool(body, "add_generation_prompt", True),
            **extra,
        )
    except Exception as exc:  # a template error is the client's problem
        raise RequestError(f"the chat template failed: {exc}", "messages") from exc
    return str(text)
