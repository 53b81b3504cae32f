"""vLLM-shaped JSON answers of the local server, built from an engine `Result`.

The shapes follow vLLM's OpenAI-compatible server (`CompletionResponse`, `ChatCompletionResponse`
and their choices, dumped with every field, null when unused) as `atropos.inference.vllm` reads
them and `atropos.testing.fake_shapes` serves them:

- completions: per choice `index`, `text`, `logprobs` (`tokens`, `token_logprobs`,
  `top_logprobs` (per position a dict of the sampled token then the best `logprobs` tokens),
  `text_offset`), `finish_reason`, `stop_reason`, `token_ids` and `prompt_token_ids` (with
  `return_token_ids`), `prompt_logprobs`.
- chat: per choice `message`, `logprobs.content[i]` (`token`, `logprob`, `bytes`,
  `top_logprobs`: the first `top_logprobs` of the sampled token then the best ones, as vLLM
  lists them), `token_ids`; top-level `prompt_token_ids` and `prompt_logprobs`.
- tokens are spelled `token_id:<id>` with `return_tokens_as_token_ids`.
- `prompt_logprobs`: None for the first prompt token, then `{"<id>": {"logprob", "rank",
  "decoded_token"}}`, the prompt's own token first.

Every answer also carries `policy_version`, the weight version that generated its first tokens,
and `policy_version_last`, the version of its last ones (atropos extensions; they differ only
when the weights were updated under a request kept in flight, and the first, the oldest, is what
staleness counts). Logprobs below -9999 are written as -9999, as vLLM does, so the JSON stays
valid.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from atropos.local.protocol import Codec, Output, Parsed, PromptLogprobs, Result

FLOOR = -9999.0


def _lp(value: float) -> float:
    return value if value > FLOOR else FLOOR


ID_PREFIXES = {"text_completion": "cmpl", "chat.completion": "chatcmpl"}
"""The id prefix of each kind of answer (its `object`), as OpenAI and vLLM write it."""


def answer_head(kind: str, model: str) -> dict[str, Any]:
    """The fields a completion answer opens with: a new `id`, its `object`, `created`, `model`.

    >>> head = answer_head("chat.completion", "tiny")
    >>> head["id"].startswith("chatcmpl-"), head["object"], head["model"]
    (True, 'chat.completion', 'tiny')
    """
    return {
        "id": f"{ID_PREFIXES[kind]}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
    }


class Shaper:
    """Builds the JSON answers of one server; token texts come from its codec."""

    def __init__(self, codec: Codec) -> None:
        """Keep the codec."""
        self.codec = codec

    def _token(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else self.codec.token_text(token_id)

    def _usage(self, parsed: Parsed, result: Result) -> dict[str, Any]:
        prompt = sum(len(ids) for ids in parsed.prompts)
        completion = sum(len(o.ids) for group in result.outputs for o in group)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
        }

    def _prompt_logprobs(self, positions: PromptLogprobs | None) -> list[Any] | None:
        if positions is None:
            return None
        return [
            None
            if entries is None
            else {
                str(i): {
                    "logprob": _lp(lp),
                    "rank": rank,
                    "decoded_token": self.codec.token_text(i),
                }
                for i, lp, rank in entries
            }
            for entries in positions
        ]

    def completion(self, parsed: Parsed, result: Result, model: str) -> dict[str, Any]:
        """The body of `POST /v1/completions`."""
        choices: list[dict[str, Any]] = []
        for index, (ids, group) in enumerate(zip(parsed.prompts, result.outputs, strict=True)):
            prompt_lps = self._prompt_logprobs(result.prompt_logprobs[index])
            for out in group:
                logprobs = None
                if parsed.sampling.logprobs is not None:
                    logprobs = self._completion_logprobs(out, parsed.as_token_ids)
                choices.append(
                    {
                        "index": len(choices),
                        "text": out.text,
                        "logprobs": logprobs,
                        "finish_reason": out.finish_reason,
                        "stop_reason": out.stop_reason,
                        "token_ids": out.ids if parsed.return_token_ids else None,
                        "prompt_logprobs": prompt_lps,
                        "prompt_token_ids": ids if parsed.return_token_ids else None,
                    }
                )
        return self._answer("text_completion", model, choices, parsed, result, {})

    def _answer(
        self,
        kind: str,
        model: str,
        choices: list[dict[str, Any]],
        parsed: Parsed,
        result: Result,
        extra: dict[str, Any],
    ) -> dict[str, Any]:
        """The top level of an answer of object `kind`, with the `extra` fields of that kind."""
        return {
            **answer_head(kind, model),
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self._usage(parsed, result),
            **extra,
            "kv_transfer_params": None,
            "policy_version": result.policy_version,
            "policy_version_last": (
                result.policy_version
                if result.policy_version_last is None
                else result.policy_version_last
            ),
        }

    def _completion_logprobs(self, out: Output, as_ids: bool) -> dict[str, Any]:
        tokens = [self._token(i, as_ids) for i in out.ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        top = [
            {self._token(i, as_ids): _lp(lp) for i, lp in [(token_id, sampled), *alternatives]}
            for token_id, sampled, alternatives in zip(out.ids, out.logprobs, out.top, strict=True)
        ]
        return {
            "text_offset": offsets,
            "token_logprobs": [_lp(lp) for lp in out.logprobs],
            "tokens": tokens,
            "top_logprobs": top,
        }

    def chat(self, parsed: Parsed, result: Result, model: str) -> dict[str, Any]:
        """The body of `POST /v1/chat/completions`."""
        k = parsed.sampling.logprobs
        choices = []
        for index, out in enumerate(result.outputs[0]):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": out.text,
                "tool_calls": [],
                "reasoning_content": None,
            }
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": None if k is None else self._chat_logprobs(out, parsed, k),
                    "finish_reason": out.finish_reason,
                    "stop_reason": out.stop_reason,
                    "token_ids": out.ids if parsed.return_token_ids else None,
                }
            )
        extra = {
            "prompt_logprobs": self._prompt_logprobs(result.prompt_logprobs[0]),
            "prompt_token_ids": parsed.prompts[0] if parsed.return_token_ids else None,
        }
        return self._answer("chat.completion", model, choices, parsed, result, extra)

    def _chat_logprobs(self, out: Output, parsed: Parsed, k: int) -> dict[str, Any]:
        as_ids = parsed.as_token_ids

        def entry(token_id: int, lp: float) -> dict[str, Any]:
            token = self._token(token_id, as_ids)
            return {"token": token, "logprob": _lp(lp), "bytes": list(token.encode())}

        content = []
        for token_id, sampled, alternatives in zip(out.ids, out.logprobs, out.top, strict=True):
            ranked = {token_id: sampled} | {i: lp for i, lp in alternatives if i != token_id}
            top = [entry(i, lp) for i, lp in list(ranked.items())[:k]]
            content.append(entry(token_id, sampled) | {"top_logprobs": top})
        return {"content": content}


def models_body(
    name: str, root: str, max_model_len: int, adapters: dict[str, str], created: int
) -> dict[str, Any]:
    """`GET /v1/models`: the base model, then one card per loaded LoRA adapter (vLLM's shape)."""

    def card(model_id: str, path: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": "atropos",
            "root": path,
            "parent": parent,
            "max_model_len": max_model_len if parent is None else None,
            "permission": [],
        }

    cards = [card(name, root, None)]
    cards += [card(adapter, path, name) for adapter, path in adapters.items()]
    return {"object": "list", "data": cards}
