"""Backend for TRL's `trl vllm-serve` server (the generation server of TRL's online trainers).

Wire contract (TRL `trl/scripts/vllm_serve.py`, the `/generate/` route and its docstring, and
`trl/generation/vllm_client.py` `VLLMClient.generate`; https://github.com/huggingface/trl):

- `POST {root}/generate/` with `{"prompts": [text], "n", "max_tokens", "temperature", "top_p",
  "top_k", "min_p", "repetition_penalty", "truncate_prompt_tokens"}` (the request model's own
  fields) and every other sampling kwarg (e.g. `stop`, `seed`) in `generation_kwargs`, which
  current TRL passes to vLLM's `SamplingParams` (older servers ignore it, so `stop` is then not
  applied). The server takes text prompts only: token-id prompts are decoded with the tokenizer
  and the ids the server actually used come back in `prompt_ids`.
- We read `completion_ids` (one list per choice), `prompt_ids` and `logprobs` (per choice, the
  sampled token's logprob; current TRL sets `logprobs=0`). Servers from before TRL returned
  `prompt_ids`/`logprobs` answer only `completion_ids`: then `tokens_and_logprobs_completion`
  raises `UnsupportedOperation` (upgrade TRL) while text completions still work.
- The server reports no finish reason: we report "stop" when a completion ends in the
  tokenizer's EOS (when a tokenizer is at hand) or is shorter than `max_tokens` (TRL's default
  is 16), and "length" otherwise.
- Health: `GET {root}/health/` (returns `{"status": "ok"}`; no tokens).
- `chat_completion` renders the chat template locally (`tokenizer.apply_chat_template`, with
  the request's `chat_template_kwargs`, as vLLM's chat route would: reasoning switches such as
  `enable_thinking` go there) and decodes the completions with the tokenizer (given, or loaded
  from `tokenizer_name` / `model_name`). `get_logprobs` is not available: TRL returns no prompt
  logprobs.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atropos.inference.base import (
    IGNORED_KWARGS,
    MISSING_LOGPROB,
    HTTPBackend,
    TokensAndLogprobs,
    check_choice_counts,
    normalize_max_tokens,
)
from atropos.inference.errors import InferenceError

TRL_DEFAULT_MAX_TOKENS = 16
REQUEST_FIELDS = frozenset(
    {"repetition_penalty", "temperature", "top_p", "top_k", "min_p", "truncate_prompt_tokens"}
)
"""Top-level fields of TRL's `GenerateRequest`; other sampling kwargs go in `generation_kwargs`."""


def _pop_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take `chat_template_kwargs` out of a request's kwargs (and its `extra_body`): they are
    for rendering here, not sampling fields for the server.

    >>> kw = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "seed": 1}}
    >>> _pop_template_kwargs(kw), kw
    ({'enable_thinking': False}, {'extra_body': {'seed': 1}})
    """
    found: dict[str, Any] = {}
    extra = kwargs.get("extra_body")
    if isinstance(extra, dict) and "chat_template_kwargs" in extra:
        extra = dict(extra)
        found.update(extra.pop("chat_template_kwargs") or {})
        kwargs["extra_body"] = extra
    found.update(kwargs.pop("chat_template_kwargs", None) or {})
    return found


class TRLBackend(HTTPBackend):
    """`trl vllm-serve`: text prompts in, completion ids (and logprobs) out (see module docs)."""

    supports_tokens = True
    health_path = "/health/"

    async def _generate(
        self, text: str, n: int, kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        params = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
        params.update(params.pop("extra_body", None) or {})
        limit = normalize_max_tokens(params)
        body: dict[str, Any] = {"prompts": [text], "n": n}
        if limit is not None:
            body["max_tokens"] = limit
        extra = {k: v for k, v in params.items() if k not in REQUEST_FIELDS}
        body.update({k: v for k, v in params.items() if k in REQUEST_FIELDS})
        if extra:
            body["generation_kwargs"] = extra
        data = await self._post(self.root + "/generate/", body)
        if not isinstance(data, dict) or not isinstance(data.get("completion_ids"), list):
            raise InferenceError(
                f"/generate/: no completion_ids in {str(data)[:200]}", server=self.base_url
            )
        if len(data["completion_ids"]) != n:
            raise InferenceError(
                f"asked for {n} completions, got {len(data['completion_ids'])}",
                server=self.base_url,
            )
        return data, limit if limit is not None else TRL_DEFAULT_MAX_TOKENS

    def _finish(self, ids: list[int], limit: int) -> str:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and ids and ids[-1] == eos:
            return "stop"
        return "length" if len(ids) >= limit else "stop"

    async def _sample_tokens(
        self, prompt: str | None, input_ids: list[int] | None, n: int, sampling: dict[str, Any]
    ) -> TokensAndLogprobs:
        """`tokens_and_logprobs_completion`: ids and sampled-token logprobs from TRL's server."""
        if prompt is None and input_ids is None:
            raise ValueError("pass prompt= or input_ids=")
        text = prompt
        if input_ids is not None:
            tokenizer = await self._get_tokenizer()
            text = tokenizer.decode(list(input_ids), skip_special_tokens=False)
        data, limit = await self._generate(str(text), n, sampling)
        if data.get("logprobs") is None:
            raise self._unsupported(
                "token logprobs on this server",
                "it answers no 'logprobs' (TRL older than its prompt_ids/logprobs answer); "
                "upgrade TRL or use server_type 'vllm'",
            )
        outputs = [[int(t) for t in ids] for ids in data["completion_ids"]]
        logprobs = [
            [MISSING_LOGPROB if v is None else float(v) for v in lps] for lps in data["logprobs"]
        ]
        finish = [self._finish(ids, limit) for ids in outputs]
        prompt_ids = (data.get("prompt_ids") or [None])[0]
        if prompt_ids is None:
            prompt_ids = input_ids if input_ids is not None else []
        check_choice_counts(self.base_url, n, outputs, logprobs, finish)
        return [int(t) for t in prompt_ids], outputs, logprobs, finish

    async def completion(self, **kwargs: Any) -> Completion:
        """A text completion: `/generate/` on `prompt`, decoded with the tokenizer."""
        prompt = kwargs.pop("prompt")
        n = int(kwargs.pop("n", None) or 1)
        tokenizer = await self._get_tokenizer()
        data, limit = await self._generate(str(prompt), n, kwargs)
        choices = [
            {
                "index": i,
                "text": tokenizer.decode(ids, skip_special_tokens=True),
                "finish_reason": self._finish(ids, limit),
                "logprobs": None,
            }
            for i, ids in enumerate(data["completion_ids"])
        ]
        return Completion.model_validate(self._envelope("cmpl", "text_completion", choices, data))

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """A chat completion: the chat template is rendered locally, then `/generate/`."""
        messages = kwargs.pop("messages")
        n = int(kwargs.pop("n", None) or 1)
        template_kwargs = _pop_template_kwargs(kwargs)
        tokenizer = await self._get_tokenizer()
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
        data, limit = await self._generate(str(text), n, kwargs)
        choices = [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": tokenizer.decode(ids, skip_special_tokens=True),
                },
                "finish_reason": self._finish(ids, limit),
                "logprobs": None,
            }
            for i, ids in enumerate(data["completion_ids"])
        ]
        return ChatCompletion.model_validate(
            self._envelope("chatcmpl", "chat.completion", choices, data)
        )

    def _envelope(
        self, prefix: str, obj: str, choices: list[dict[str, Any]], data: dict[str, Any]
    ) -> dict[str, Any]:
        prompt_tokens = len((data.get("prompt_ids") or [[]])[0])
        completion_tokens = sum(len(ids) for ids in data["completion_ids"])
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": obj,
            "created": int(time.time()),
            "model": self.config.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
