"""Backend for vLLM: OpenAI chat/text completions plus exact token ids and logprobs.

Chat and text completions are the OpenAI ones (`openai.OpenAIBackend`). Health is
`GET {root}/health` (vLLM's liveness endpoint; no tokens spent), where `root` is `base_url`
without its `/v1` segment (`base.server_root`).

Token ids and logprobs, `config.vllm_token_api == "completions"` (the default; stock `vllm serve`):

- `POST {base_url}/completions` with `prompt` = the token ids (or the text when no ids and no
  tokenizer are at hand), `n`, `max_tokens`, the sampling kwargs, `logprobs: 0` (the sampled
  token's logprob only) and `return_tokens_as_token_ids: true`; `return_token_ids: true` only
  for a text prompt.
- We read, per choice (sorted by `index`): `logprobs.token_logprobs` (one per output token),
  the output ids from `logprobs.tokens`, which `return_tokens_as_token_ids` renders as
  `"token_id:<id>"` (or from `token_ids`, when the answer has them), and `finish_reason`; the
  prompt's ids are the ids sent, or a text prompt's `prompt_token_ids`. A prompt sent as ids
  does not ask for `return_token_ids`, which would echo every prompt id back: at 32k tokens of
  context ~130 KB of answer and ~0.2 ms to read it per call, and the server's own time to
  write it, to learn ids we sent (vLLM takes a prompt of ids as it is).
- A choice with finish reason `abort` (the request was in flight when a pause in mode abort
  began) makes the whole answer a retryable error (`openai.check_not_aborted`).
- `get_logprobs`: the same endpoint with `max_tokens: 1`, `temperature: 0`,
  `prompt_logprobs: top_k`; we read `choices[0].prompt_logprobs`, a list with one entry per
  prompt token (`null` for the first), each `{"<token id>": {"logprob", "rank",
  "decoded_token"}}`.
- Sources: vLLM docs, "OpenAI-Compatible Server" (extra parameters),
  https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html, and the API reference of
  `vllm.entrypoints.openai.completion.protocol` (`CompletionRequest.prompt: list[int] | ...`,
  `logprobs`, `prompt_logprobs`, `return_token_ids`, `return_tokens_as_token_ids`;
  `CompletionResponseChoice.token_ids`, `prompt_token_ids`, `prompt_logprobs`, `logprobs`),
  https://docs.vllm.ai/en/latest/api/vllm/entrypoints/openai/completion/protocol/, as exercised
  by vLLM's `tests/entrypoints/openai/test_return_token_ids.py`.

`config.vllm_token_api == "generate"` (atroposlib 0.4.0's custom
`example_trainer/vllm_api_server.py`): `POST {root}/generate` with `{"prompt": {"prompt_token_ids":
[...]}, "logprobs": 0, "n", "max_tokens", ...sampling}` (no `model`: it takes sampling fields only).
We read `logprobs` (per choice, per position a `{"<id>": logprob}` dict or a list of them, the
sampled token first) and `finish_reasons`. `get_logprobs` sends `prompt_logprobs: top_k` and
reads `prompt_logprobs` (`[pos]` or `[seq][pos]` entries, `null` for position 0).
This server needs token ids, so text prompts are encoded with the tokenizer. Its usual answer
(positions as `[{"<id>": lp}]`) is read in one typed msgspec pass; any other shape falls back
to the general reading.

Every answer's top-level `policy_version` (our local server's extension: the weight version
that generated its tokens) is noted for the caller (`base.PolicyVersions`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from atropos.inference.base import (
    _NOT_BODY,
    MISSING_LOGPROB,
    PromptLogprobs,
    TokensAndLogprobs,
    check_choice_counts,
    normalize_max_tokens,
)
from atropos.inference.errors import InferenceError
from atropos.inference.openai import OpenAIBackend, check_not_aborted
from atropos.inference.prompt_json import ids_json


class _Position(msgspec.Struct, array_like=True, gc=False):
    """One generated position of a `/generate` answer, `[{"<id>": lp}, ...]`: its first entry
    (the sampled token; any alternatives after it are skipped unread). A struct read from the
    array, untracked by the garbage collector (it holds one dict of numbers, no cycle): a list
    per position was one tracked object per generated token, and reading it cost about twice
    as much for a group of long completions."""

    first: dict[int, float]


class _GenerateAnswer(msgspec.Struct):
    """The usual `/generate` answer, read in one typed pass (`dict[int, float]`: msgspec turns
    the id keys into ints). Anything else (null logprobs, `{"logprob": ...}` values, positions
    as bare objects or empty) fails this shape and is read by the general path."""

    logprobs: list[list[_Position]]
    finish_reasons: list[str] = []  # SGLang-style {"type": ...}: the general path
    policy_version: int | None = None


_GENERATE_DECODER = msgspec.json.Decoder(_GenerateAnswer)


class _ChoiceLogprobs(msgspec.Struct, gc=False):
    token_logprobs: list[float | None] = []
    tokens: list[str] = []


class _Choice(msgspec.Struct, gc=False):
    """The fields of a `/completions` choice the token call reads (the others are skipped);
    untracked by the garbage collector, as `_Position` (it holds lists of numbers, no cycle)."""

    index: int = 0
    token_ids: list[int] | None = None
    prompt_token_ids: msgspec.Raw = msgspec.Raw()  # read by `_echoed`, only when needed
    logprobs: _ChoiceLogprobs | None = None
    finish_reason: str | None = None


class _CompletionsAnswer(msgspec.Struct):
    """The usual `/completions` answer to a token call, read in one typed pass; anything else
    fails this shape and is read by the general path."""

    choices: list[_Choice]
    policy_version: int | None = None


_COMPLETIONS_DECODER = msgspec.json.Decoder(_CompletionsAnswer)


_IDS_DECODER = msgspec.json.Decoder(list[int])


def _echoed(echo: msgspec.Raw, ids: list[int] | None, sent: msgspec.Raw | None) -> Any:
    """The prompt ids a choice echoed: `ids` themselves when the server spelt them as they were
    sent (`sent`, their JSON: no list read), else read from the echo; None when it has none.

    >>> _echoed(msgspec.Raw(b"[5,6]"), [5, 6], msgspec.Raw(b"[5,6]"))
    [5, 6]
    >>> _echoed(msgspec.Raw(b"[5, 7]"), [5, 6], msgspec.Raw(b"[5,6]"))
    [5, 7]
    >>> _echoed(msgspec.Raw(), None, None), _echoed(msgspec.Raw(b"null"), None, None)
    (None, None)
    """
    if sent is not None and echo == sent:
        return ids
    raw = bytes(echo)
    if not raw or raw == b"null":
        return None
    try:
        return _IDS_DECODER.decode(raw)
    except msgspec.ValidationError:  # ids spelt otherwise (strings, floats): made ints later
        return msgspec.json.decode(raw)


def _typed_rows(
    choices: list[_Choice],
) -> tuple[list[list[int]], list[list[float]], list[str], msgspec.Raw]:
    """Outputs, logprobs, finish reasons and prompt ids' JSON of typed choices (by index)."""
    if any(c.index != i for i, c in enumerate(choices)):
        choices = sorted(choices, key=lambda c: c.index)
    outputs: list[list[int]] = []
    logprobs: list[list[float]] = []
    finish: list[str] = []
    for choice in choices:
        lp = choice.logprobs or _ChoiceLogprobs()
        ids = choice.token_ids
        if ids is None:
            ids = [int(t.removeprefix("token_id:")) for t in lp.tokens]
        outputs.append(ids)
        values: Any = lp.token_logprobs
        if None in values:
            values = [MISSING_LOGPROB if v is None else v for v in values]
        logprobs.append(values)  # no None left
        finish.append(choice.finish_reason or "unknown")
    return outputs, logprobs, finish, choices[0].prompt_token_ids if choices else msgspec.Raw()


def _sampled(logprobs: list[list[_Position]]) -> tuple[list[list[int]], list[list[float]]]:
    """Per choice, the sampled ids and their logprobs: the first entry of every position."""
    outputs, values = [], []
    for seq in logprobs:
        ids: list[int] = []
        lps: list[float] = []
        for position in seq:
            for token, lp in position.first.items():
                ids.append(token)
                lps.append(lp)
                break
        if len(ids) != len(seq):
            raise ValueError("a position without a sampled token")
        outputs.append(ids)
        values.append(lps)
    return outputs, values


def _logprob(value: Any) -> float:
    if isinstance(value, dict):
        value = value.get("logprob")
    return MISSING_LOGPROB if value is None else float(value)


def _first_entry(position: Any) -> tuple[int, float]:
    """The first (id, logprob) of a generated position: `{"<id>": lp}` or `[{"<id>": lp}]`."""
    entry = position[0] if isinstance(position, list) else position
    key, value = next(iter(entry.items()))
    return int(key), _logprob(value)


def top_k_of(position: Any, k: int) -> tuple[list[int], list[float]]:
    """The `k` best (id, logprob) of one prompt position, from any of vLLM's shapes.

    >>> top_k_of({"5": {"logprob": -0.1, "rank": 1}, "9": {"logprob": -2.0, "rank": 2}}, 1)
    ([5], [-0.1])
    >>> top_k_of([{"7": -0.5}], 1), top_k_of(None, 1)
    (([7], [-0.5]), ([], []))
    """
    if position is None:
        return [], []
    entries: dict[int, float] = {}
    for part in position if isinstance(position, list) else [position]:
        for key, value in part.items():
            entries[int(key)] = _logprob(value)
    best = sorted(entries.items(), key=lambda kv: kv[1], reverse=True)[:k]
    return [i for i, _ in best], [lp for _, lp in best]


class VLLMBackend(OpenAIBackend):
    """vLLM: OpenAI completions plus token ids and logprobs (see the module docstring)."""

    supports_tokens = True
    supports_prompt_logprobs = True
    health_path = "/health"

    @property
    def health_url(self) -> str:
        """`GET {root}/health`."""
        return self.root + self.health_path

    async def _sample_tokens(
        self, prompt: str | None, input_ids: list[int] | None, n: int, sampling: dict[str, Any]
    ) -> TokensAndLogprobs:
        """`tokens_and_logprobs_completion`: ids and logprobs exactly as vLLM produced them."""
        limit = normalize_max_tokens(sampling)
        if self.config.vllm_token_api == "generate":
            # /generate takes sampling fields only (no model); `sampling` is this call's own
            # dict, used as the body as it is when it holds nothing `_model` would drop
            body = sampling if _NOT_BODY.isdisjoint(sampling) else self._model(sampling)
            body.pop("model", None)
            body["n"] = n
            if limit is not None:
                body["max_tokens"] = limit
            if input_ids is not None:
                given = self._given_ids(input_ids)
            else:
                given = await self._prompt_ids(prompt, input_ids, require=True) or []
            body["prompt"] = {"prompt_token_ids": msgspec.Raw(ids_json(given))}
            body["logprobs"] = 0
            url = self.root + "/generate"
            data = await self._request("POST", url, body, decoder=_GENERATE_DECODER)
            return self._generated(given, n, data)
        if _NOT_BODY.isdisjoint(sampling):  # as above: this call's own dict is the body
            body = sampling
            body["model"] = self.config.model_name
        else:
            body = self._model(sampling)
        body["n"] = n
        if limit is not None:
            body["max_tokens"] = limit
        ids = await self._prompt_ids(prompt, input_ids)
        sent = msgspec.Raw(ids_json(ids)) if ids is not None else None  # spliced as is
        body.update(
            prompt=sent if sent is not None else prompt,
            logprobs=0,
            return_tokens_as_token_ids=True,
        )
        if sent is None:  # the ids of a text prompt come back with the answer
            body["return_token_ids"] = True
        url = self.base_url + "/completions"
        data = await self._request("POST", url, body, decoder=_COMPLETIONS_DECODER)
        if isinstance(data, _CompletionsAnswer) and data.choices:
            outputs, logprobs, finish, echo = _typed_rows(data.choices)
            prompt_ids = _echoed(echo, ids, sent)
        else:
            outputs, logprobs, finish, prompt_ids = self._read_completions(data)
        if prompt_ids is None:
            if ids is None:
                raise InferenceError(
                    "vLLM did not return prompt_token_ids (needs return_token_ids support); "
                    "pass input_ids or a tokenizer",
                    server=self.base_url,
                )
            prompt_ids = ids
        check_not_aborted(self.base_url, finish)
        check_choice_counts(self.base_url, n, outputs, logprobs, finish)
        if type(prompt_ids) is not list or (prompt_ids and type(prompt_ids[0]) is not int):
            prompt_ids = [int(t) for t in prompt_ids]
        return prompt_ids, outputs, logprobs, finish

    def _read_completions(
        self, data: Any
    ) -> tuple[list[list[int]], list[list[float]], list[str], list[int] | None]:
        """The general reading of a `/completions` answer (any shape of its choices)."""
        choices = sorted(self._choices(data), key=lambda c: int(c.get("index", 0)))
        outputs, logprobs, finish = [], [], []
        for choice in choices:
            lp = choice.get("logprobs") or {}
            token_ids = choice.get("token_ids")
            if token_ids is None:
                token_ids = [int(str(t).removeprefix("token_id:")) for t in lp.get("tokens", [])]
            outputs.append([int(t) for t in token_ids])
            logprobs.append([_logprob(v) for v in lp.get("token_logprobs") or []])
            finish.append(str(choice.get("finish_reason") or "unknown"))
        return outputs, logprobs, finish, choices[0].get("prompt_token_ids") if choices else None

    async def get_logprobs(self, **kwargs: Any) -> PromptLogprobs:
        """Top-k logprobs of every prompt position (`prompt=` or `input_ids=`, `top_k=1`)."""
        top_k = int(kwargs.pop("top_k", 1))
        prompt, input_ids = kwargs.pop("prompt", None), kwargs.pop("input_ids", None)
        body = self._model(kwargs)
        body.update(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=top_k)
        ids: list[int] | None
        if self.config.vllm_token_api == "generate":
            ids = await self._prompt_ids(prompt, input_ids, require=True) or []
            body.pop("model", None)
            body.update(prompt={"prompt_token_ids": ids}, logprobs=0)
            data = await self._post(self.root + "/generate", body)
            raw = data.get("prompt_logprobs") if isinstance(data, dict) else None
        else:
            ids = await self._prompt_ids(prompt, input_ids)
            body.update(prompt=ids if ids is not None else prompt, return_token_ids=True)
            choice = self._choices(await self._post(self.base_url + "/completions", body))[0]
            ids = [int(t) for t in choice.get("prompt_token_ids") or ids or []]
            raw = choice.get("prompt_logprobs")
        ids = ids or []
        positions = self._positions(raw, len(ids))
        top = [top_k_of(p, top_k) for p in positions]
        return PromptLogprobs(
            prompt_tokens=ids,
            prompt_topk_token_ids=[t[0] for t in top],
            prompt_topk_logprobs=[t[1] for t in top],
        )

    def _generated(self, ids: list[int], n: int, data: Any) -> TokensAndLogprobs:
        """The rows of a `/generate` answer to a request for `n` choices of prompt `ids`."""
        try:
            if not isinstance(data, _GenerateAnswer):
                raise ValueError("not the usual shape")
            outputs, logprobs = _sampled(data.logprobs)
            finish: list[str] = data.finish_reasons
        except (ValueError, IndexError):
            outputs, logprobs, reasons = self._read_generate(data)
            finish = [str(f.get("type") if isinstance(f, dict) else f) for f in reasons or ()]
        check_not_aborted(self.base_url, finish)
        check_choice_counts(self.base_url, n, outputs, logprobs, finish)
        return ids, outputs, logprobs, finish

    def _read_generate(self, data: Any) -> tuple[list[list[int]], list[list[float]], list[Any]]:
        """The general reading of a `/generate` answer (any of vLLM's logprob shapes)."""
        if isinstance(data, _GenerateAnswer):
            data = msgspec.to_builtins(data)
        if not isinstance(data, dict) or not isinstance(data.get("logprobs"), list):
            raise InferenceError(
                f"/generate: no 'logprobs' in {str(data)[:200]}", server=self.base_url
            )
        outputs, logprobs = [], []
        for seq in data["logprobs"]:
            sampled = [_first_entry(position) for position in seq]  # the sampled token is first
            outputs.append([token for token, _ in sampled])
            logprobs.append([lp for _, lp in sampled])
        return outputs, logprobs, data.get("finish_reasons") or []

    def _choices(self, data: Any) -> list[dict[str, Any]]:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise InferenceError(
                f"/completions: no choices in {str(data)[:200]}", server=self.base_url
            )
        return choices

    def _positions(self, raw: Any, length: int) -> list[Any]:
        """Per-position entries from `[pos]` or `[seq][pos]`, checked against the prompt length."""
        if not isinstance(raw, list):
            raise InferenceError("the server returned no prompt_logprobs", server=self.base_url)
        if len(raw) == 1 and length != 1 and isinstance(raw[0], list) and len(raw[0]) == length:
            raw = raw[0]
        positions: list[Any] = raw
        if len(positions) != length:
            raise InferenceError(
                f"{len(raw)} prompt_logprobs entries for {length} prompt tokens",
                server=self.base_url,
            )
        return positions
