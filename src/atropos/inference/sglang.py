"""Backend for SGLang: OpenAI chat/text completions plus exact token ids and logprobs.

Chat and text completions are the OpenAI ones (`openai.OpenAIBackend`, SGLang serves them under
`/v1`). Health is `GET {base_url}/models`: current SGLang serves `/health` with the same handler
as `/health_generate`, which runs a one-token generation when the server is idle, so we do not
use it (probes must spend no tokens).

Token ids and logprobs use SGLang's native `POST {root}/generate` (`root` is `base_url` without
`/v1`). We send:

- `input_ids` (the prompt's token ids), or `text` with `logprob_start_len: 0` when we have no ids
  and no tokenizer (then the server's tokenization is read back from the input logprobs);
- `sampling_params`: the caller's sampling kwargs with `max_tokens` renamed `max_new_tokens`,
  plus `n`;
- `return_logprob: true`, `return_text_in_logprobs: false`.

We read one object (n == 1) or a list of `n` objects, each with `meta_info.output_token_logprobs`
(a list of `[logprob, token_id, text]`), `meta_info.finish_reason` (`{"type": "stop" | "length"
| "abort", ...}`) and, for text prompts, `meta_info.input_token_logprobs` (same triples, the first
logprob null). `get_logprobs` sends `max_new_tokens: 1`, `temperature: 0`, `logprob_start_len: 0`,
`top_logprobs_num: top_k` and reads `meta_info.input_token_logprobs` and
`meta_info.input_top_logprobs` (per prompt position a list of `[logprob, token_id, text]`, null
for the first position).

The logprobs SGLang returns for sampled tokens are those of the distribution it sampled from,
temperature applied, unless the server runs with `SGLANG_RETURN_ORIGINAL_LOGPROB=1` (SGLang
0.5.23): start it so for training, where the policy's own logprobs are wanted (as vLLM returns
them; at temperature 0.5 the two differ by 0.4 nats on the tiny policy).

Sources: SGLang docs, "Sampling Parameters" (the `/generate` arguments `text`, `input_ids`,
`sampling_params`, `return_logprob`, `logprob_start_len`, `top_logprobs_num`,
`return_text_in_logprobs`; sampling `max_new_tokens`, `stop`, `n`, ...),
https://docs.sglang.io/basic_usage/sampling_params.html; "SGLang Native APIs" (`/generate`,
`/health`, `/health_generate`), https://docs.sglang.io/basic_usage/native_api.html; the
`meta_info` logprob fields as built in `python/sglang/srt/managers/tokenizer_manager.py`
(`convert_logprob_style`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from atropos.inference.base import (
    IGNORED_KWARGS,
    MISSING_LOGPROB,
    PromptLogprobs,
    TokensAndLogprobs,
    check_choice_counts,
    normalize_max_tokens,
)
from atropos.inference.errors import InferenceError
from atropos.inference.openai import OpenAIBackend, check_not_aborted
from atropos.inference.prompt_json import ids_json


def _triples(entries: Any) -> tuple[list[int], list[float]]:
    """(ids, logprobs) from SGLang's `[logprob, token_id, text]` triples.

    >>> _triples([[-0.5, 11, None], [None, 12, None]])
    ([11, 12], [-0.5, -9999.0])
    """
    ids = [int(e[1]) for e in entries or []]
    lps = [MISSING_LOGPROB if e[0] is None else float(e[0]) for e in entries or []]
    return ids, lps


def _finish(reason: Any) -> str:
    if isinstance(reason, dict):
        reason = reason.get("type")
    return str(reason or "unknown")


class SGLangBackend(OpenAIBackend):
    """SGLang: OpenAI completions plus native `/generate` token ids (see the module docstring)."""

    supports_tokens = True
    supports_prompt_logprobs = True

    async def _sample_tokens(
        self, prompt: str | None, input_ids: list[int] | None, n: int, sampling: dict[str, Any]
    ) -> TokensAndLogprobs:
        """`tokens_and_logprobs_completion` by `/generate`: ids and logprobs as SGLang made them."""
        ids = await self._prompt_ids(prompt, input_ids)
        body = self._generate_body(ids, prompt, self._sampling(sampling, n=n))
        results = await self._generate(body)
        outputs, logprobs, finish = [], [], []
        for result in results:
            meta = result.get("meta_info") or {}
            out_ids, out_lps = _triples(meta.get("output_token_logprobs"))
            if not out_ids and result.get("output_ids"):
                out_ids = [int(t) for t in result["output_ids"]]
            outputs.append(out_ids)
            logprobs.append(out_lps)
            finish.append(_finish(meta.get("finish_reason")))
        if ids is None:
            ids = _triples(results[0].get("meta_info", {}).get("input_token_logprobs"))[0]
        check_not_aborted(self.base_url, finish)  # a pause_generation in mode abort
        check_choice_counts(self.base_url, n, outputs, logprobs, finish)
        return ids, outputs, logprobs, finish

    async def get_logprobs(self, **kwargs: Any) -> PromptLogprobs:
        """Top-k logprobs of every prompt position (`prompt=` or `input_ids=`, `top_k=1`)."""
        top_k = int(kwargs.pop("top_k", 1))
        prompt, input_ids = kwargs.pop("prompt", None), kwargs.pop("input_ids", None)
        ids = await self._prompt_ids(prompt, input_ids)
        params = self._sampling({**kwargs, "max_tokens": 1, "temperature": 0.0}, n=1)
        body = self._generate_body(ids, prompt, params)
        body.update(logprob_start_len=0, top_logprobs_num=top_k)
        meta = (await self._generate(body))[0].get("meta_info") or {}
        seen = _triples(meta.get("input_token_logprobs"))[0]
        ids = seen or ids or []
        top = list(meta.get("input_top_logprobs") or [])
        if len(top) == len(ids) - 1:
            top = [None, *top]  # some versions omit the context-free first position
        if len(top) != len(ids):
            raise InferenceError(
                f"{len(top)} input_top_logprobs entries for {len(ids)} prompt tokens",
                server=self.base_url,
            )
        pairs = [_triples(position) for position in top]
        return PromptLogprobs(
            prompt_tokens=ids,
            prompt_topk_token_ids=[p[0][:top_k] for p in pairs],
            prompt_topk_logprobs=[p[1][:top_k] for p in pairs],
        )

    def _sampling(self, kwargs: dict[str, Any], *, n: int) -> dict[str, Any]:
        params = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
        params.update(params.pop("extra_body", None) or {})
        limit = normalize_max_tokens(params)
        if limit is not None:
            params["max_new_tokens"] = limit
        params["n"] = n
        return params

    def _generate_body(
        self, ids: list[int] | None, prompt: str | None, params: dict[str, Any]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "sampling_params": params,
            "return_logprob": True,
            "return_text_in_logprobs": False,
        }
        if ids is not None:
            body["input_ids"] = msgspec.Raw(ids_json(ids))  # (`prompt_json`)
        else:
            body.update(text=prompt, logprob_start_len=0)
        return body

    async def _generate(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        data = await self._post(self.root + "/generate", body)
        results = data if isinstance(data, list) else [data]
        if not results or not all(isinstance(r, dict) for r in results):
            raise InferenceError(
                f"/generate: unexpected answer {str(data)[:200]}", server=self.base_url
            )
        return results
