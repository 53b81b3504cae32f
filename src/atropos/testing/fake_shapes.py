"""Request handlers of `FakeInferenceServer`, one per wire shape: OpenAI, vLLM, SGLang, TRL.

Each handler takes the JSON body and returns the JSON answer; which fields each honours is listed
in `atropos.testing.fake_server`'s docstring. Bad input raises `BadRequest`.

vLLM's `/generate` answers are kept, encoded, by request (the prompt's ids and the sampling
fields; the same request always gets the same answer): a repeated request still waits out the
latency and counts its tokens, but is not generated, shaped and JSON-encoded again. This keeps
the fake cheap when benchmarks send it thousands of requests a second.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import Response

from atropos.local.protocol import RequestError as BadRequest
from atropos.local.protocol import get_bool, get_ids, get_int
from atropos.local.responses import answer_head
from atropos.testing.fake_engine import (
    Engine,
    Output,
    Sampling,
    sampling_from,
)

Prompts = list[tuple[list[int], str]]
#: Generates for every prompt (after the latency), counting tokens: the server's `_run`.
Runner = Callable[[Prompts, Sampling], Awaitable[list[list[Output]]]]

# vLLM's SamplingParams fields (+ the request's own keys): anything else is a client bug there.
VLLM_GENERATE_FIELDS = frozenset(
    "prompt stream n best_of presence_penalty frequency_penalty repetition_penalty temperature "
    "top_p top_k min_p seed stop stop_token_ids bad_words include_stop_str_in_output ignore_eos "
    "max_tokens min_tokens logprobs prompt_logprobs detokenize skip_special_tokens "
    "spaces_between_special_tokens truncate_prompt_tokens allowed_token_ids logit_bias "
    "structured_outputs guided_decoding extra_args output_kind".split()
)
SGLANG_SAMPLING_FIELDS = frozenset(
    "max_new_tokens min_new_tokens n temperature top_p top_k min_p stop stop_token_ids "
    "ignore_eos skip_special_tokens spaces_between_special_tokens no_stop_trim frequency_penalty "
    "presence_penalty repetition_penalty json_schema regex ebnf structural_tag custom_params "
    "sampling_seed stream_interval logit_bias".split()
)


ANSWERS_KEPT = 4096
"""vLLM `/generate` answers kept for repeated requests (least recently used out)."""


class Shapes:
    """The generation endpoints' handlers, over one `Engine`."""

    def __init__(
        self,
        engine: Engine,
        run: Runner,
        model: str,
        *,
        policy_version: int | Callable[[], int] | None = None,
    ) -> None:
        """`run` generates; `model` is the name answered when a request names none;
        `policy_version` (an int or a function) is reported in answers when set."""
        self.engine, self.run, self.model = engine, run, model
        self.policy_version = policy_version
        self._answers: OrderedDict[Any, tuple[str, bytes]] = OrderedDict()

    def _version(self) -> int | None:
        version = self.policy_version
        return version() if callable(version) else version

    def _stamp(self, answer: dict[str, Any]) -> dict[str, Any]:
        """Add `policy_version` (when set), as our local server does."""
        version = self._version()
        if version is not None:
            answer["policy_version"] = version
        return answer

    def _text(self, out: Output, body: Mapping[str, Any]) -> str:
        return self.engine.decode(out.ids, get_bool(body, "skip_special_tokens", True))

    def _token(self, token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else self.engine.token_text(token_id)

    def _usage(self, prompts: Prompts, outs: list[list[Output]]) -> Any:
        prompt = sum(len(ids) for ids, _ in prompts)
        completion = sum(len(o.ids) for group in outs for o in group)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _answer(
        self,
        kind: str,
        body: Mapping[str, Any],
        choices: list[dict[str, Any]],
        prompts: Prompts,
        outs: list[list[Output]],
    ) -> dict[str, Any]:
        """An OpenAI answer of object `kind` (the local server's head) around `choices`."""
        head = answer_head(kind, body.get("model") or self.model)
        return {**head, "choices": choices, "usage": self._usage(prompts, outs)}

    @staticmethod
    def _refuse_streaming(body: Mapping[str, Any]) -> None:
        if get_bool(body, "stream"):
            raise BadRequest("stream is not supported by the fake server", "stream")

    # --- OpenAI shapes --------------------------------------------------------------------

    def _completion_prompts(self, prompt: Any) -> Prompts:
        vocab = self.engine.vocab_size
        if isinstance(prompt, str):
            return [(self.engine.encode(prompt, add_special_tokens=True), prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return [(self.engine.encode(p, add_special_tokens=True), p) for p in prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            batch = [get_ids(p, "prompt", vocab) for p in prompt]
        else:
            batch = [get_ids(prompt, "prompt", vocab)]
        return [(ids, self.engine.decode(ids, skip_special_tokens=False)) for ids in batch]

    async def completions(self, body: dict[str, Any]) -> Any:
        """`POST /v1/completions`."""
        self._refuse_streaming(body)
        if get_bool(body, "echo"):
            raise BadRequest("echo is not supported by the fake server", "echo")
        prompts = self._completion_prompts(body.get("prompt"))
        k = get_int(body, "logprobs", None, 0, 20)
        pk = get_int(body, "prompt_logprobs", None, 0, 20)
        s = sampling_from(
            body, max_key="max_tokens", max_default=16, top_k=0 if k is None else k + 1
        )
        as_ids = get_bool(body, "return_tokens_as_token_ids")
        with_ids = get_bool(body, "return_token_ids")
        outs = await self.run(prompts, s)
        choices: list[dict[str, Any]] = []
        for (prompt_ids, _), group in zip(prompts, outs, strict=True):
            for out in group:
                choice: dict[str, Any] = {"index": len(choices), "text": self._text(out, body)}
                choice["logprobs"] = None if k is None else self._completion_logprobs(out, as_ids)
                choice |= {"finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
                if with_ids:
                    choice |= {"token_ids": out.ids, "prompt_token_ids": prompt_ids}
                if pk is not None:
                    choice["prompt_logprobs"] = self._prompt_logprobs(prompt_ids, pk)
                choices.append(choice)
        return self._stamp(self._answer("text_completion", body, choices, prompts, outs))

    def _completion_logprobs(self, out: Output, as_ids: bool) -> Any:
        tokens = [self._token(i, as_ids) for i in out.ids]
        offsets, at = [], 0
        for token_id in out.ids:
            offsets.append(at)
            at += len(self.engine.token_text(token_id))
        top = [{self._token(i, as_ids): lp for i, lp in position} for position in out.top]
        return {
            "tokens": tokens,
            "token_logprobs": out.logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    async def chat(self, body: dict[str, Any]) -> Any:
        """`POST /v1/chat/completions`."""
        self._refuse_streaming(body)
        text = self.engine.render_chat(body)
        prompts = [(self.engine.encode(text), text)]
        want = get_bool(body, "logprobs")
        k = get_int(body, "top_logprobs", 0, 0, 20) or 0
        if k and not want:
            raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
        key = (
            "max_completion_tokens"
            if body.get("max_completion_tokens") is not None
            else "max_tokens"
        )
        s = sampling_from(body, max_key=key, max_default=None, top_k=k)
        as_ids = get_bool(body, "return_tokens_as_token_ids")
        outs = await self.run(prompts, s)
        choices: list[dict[str, Any]] = []
        for i, out in enumerate(outs[0]):
            message = {"role": "assistant", "content": self._text(out, body)}
            choice: dict[str, Any] = {"index": i, "message": message}
            choice["logprobs"] = self._chat_logprobs(out, as_ids, k) if want else None
            choice |= {"finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
            if get_bool(body, "return_token_ids"):
                choice["token_ids"] = out.ids
            choices.append(choice)
        response = self._answer("chat.completion", body, choices, prompts, outs)
        if get_bool(body, "return_token_ids"):
            response["prompt_token_ids"] = prompts[0][0]
        pk = get_int(body, "prompt_logprobs", None, 0, 20)
        if pk is not None:
            response["prompt_logprobs"] = self._prompt_logprobs(prompts[0][0], pk)
        return self._stamp(response)

    def _prompt_logprobs(self, prompt_ids: list[int], k: int) -> list[Any]:
        """vLLM's `prompt_logprobs`: None, then per position `{"<id>": {logprob, rank, ...}}`."""
        return [
            None
            if position is None
            else {
                str(i): {"logprob": lp, "rank": rank, "decoded_token": self.engine.token_text(i)}
                for rank, (i, lp) in enumerate(position, start=1)
            }
            for position in self.engine.prompt_logprobs(prompt_ids, k + 1)
        ]

    def _chat_logprobs(self, out: Output, as_ids: bool, k: int) -> Any:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            token = self._token(token_id, as_ids)
            return {"token": token, "logprob": lp, "bytes": list(token.encode())}

        content = []
        for token_id, lp, position in zip(out.ids, out.logprobs, out.top, strict=True):
            content.append(
                entry(token_id, lp) | {"top_logprobs": [entry(*alt) for alt in position[:k]]}
            )
        return {"content": content}

    # --- /generate: vLLM and SGLang -------------------------------------------------------

    async def generate(self, body: dict[str, Any]) -> Any:
        """`POST /generate`: vLLM's shape when the body has `prompt`, else SGLang's."""
        if "prompt" in body:
            return await self._vllm_generate(body)
        if "input_ids" in body or "text" in body:
            return await self._sglang_generate(body)
        raise BadRequest(
            "expected a vLLM body ('prompt') or an SGLang body ('input_ids' or 'text')"
        )

    async def _vllm_generate(self, body: dict[str, Any]) -> Any:
        unknown = sorted(set(body) - VLLM_GENERATE_FIELDS)
        if unknown:
            raise BadRequest(f"unknown sampling fields for vLLM /generate: {unknown}", unknown[0])
        self._refuse_streaming(body)
        prompt = body["prompt"]
        text: str | None = None
        if isinstance(prompt, dict):
            ids = get_ids(
                prompt.get("prompt_token_ids"), "prompt.prompt_token_ids", self.engine.vocab_size
            )
        elif isinstance(prompt, str) and prompt:
            ids, text = self.engine.encode(prompt, add_special_tokens=True), prompt
        else:
            raise BadRequest("prompt must be a string or {'prompt_token_ids': [...]}", "prompt")
        k = get_int(body, "logprobs", None, 0, 20)
        pk = get_int(body, "prompt_logprobs", None, 0, 20)
        s = sampling_from(
            body, max_key="max_tokens", max_default=16, top_k=0 if k is None else k + 1
        )
        skip = get_bool(body, "skip_special_tokens", True)
        version = self._version()
        key = None
        if self.engine.responder is None:  # answers depend on the request alone
            key = (tuple(ids), text, s, k, pk, skip, version)
            kept = self._answers.get(key)
            if kept is not None:
                self._answers.move_to_end(key)
                await self.run([(ids, kept[0])], s)  # the latency and the token counts
                return Response(kept[1], media_type="application/json")
        if text is None:
            text = self.engine.decode(ids, skip_special_tokens=False)
        outs = (await self.run([(ids, text)], s))[0]
        ret: dict[str, Any] = {
            "text": [self._text(o, body) for o in outs],
            "prompt": text,
            "finish_reasons": [o.finish_reason for o in outs],
        }
        if k is not None:
            ret["logprobs"] = [[[{str(i): lp for i, lp in pos}] for pos in o.top] for o in outs]
            ret["prompt_token_ids"] = ids
            ret["token_ids"] = [o.ids for o in outs]
        if pk is not None:
            ret["prompt_logprobs"] = [
                None if pos is None else {str(i): lp for i, lp in pos}
                for pos in self.engine.prompt_logprobs(ids, pk + 1)
            ]
        if version is not None:
            ret["policy_version"] = version
        if key is None:
            return ret
        # encoded as JSONResponse encodes (compact, UTF-8), once per distinct request
        encoded = json.dumps(
            ret, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode()
        self._answers[key] = (text, encoded)
        if len(self._answers) > ANSWERS_KEPT:
            self._answers.popitem(last=False)
        return Response(encoded, media_type="application/json")

    def _sglang_prompts(self, body: Mapping[str, Any]) -> tuple[Prompts, bool]:
        if ("input_ids" in body) == ("text" in body):
            raise BadRequest("give exactly one of 'input_ids' and 'text'", "input_ids")
        vocab = self.engine.vocab_size
        if "text" in body:
            texts = body["text"]
            batch = isinstance(texts, list)
            texts = texts if batch else [texts]
            if not texts or not all(isinstance(t, str) and t for t in texts):
                raise BadRequest("text must be a non-empty string or a list of them", "text")
            return [(self.engine.encode(t, add_special_tokens=True), t) for t in texts], batch
        raw = body["input_ids"]
        batch = isinstance(raw, list) and bool(raw) and isinstance(raw[0], list)
        groups = (
            [get_ids(ids, "input_ids", vocab) for ids in raw]
            if batch
            else [get_ids(raw, "input_ids", vocab)]
        )
        return [(ids, self.engine.decode(ids, skip_special_tokens=False)) for ids in groups], batch

    async def _sglang_generate(self, body: dict[str, Any]) -> Any:
        self._refuse_streaming(body)
        prompts, batch = self._sglang_prompts(body)
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be one object (per-item lists: unsupported)")
        unknown = sorted(set(params) - SGLANG_SAMPLING_FIELDS)
        if unknown:
            raise BadRequest(f"unknown sampling_params for SGLang: {unknown}", unknown[0])
        want = get_bool(body, "return_logprob")
        top_n = get_int(body, "top_logprobs_num", 0, 0, 20) or 0
        start = get_int(body, "logprob_start_len", -1, -1, 1 << 30)
        with_text = get_bool(body, "return_text_in_logprobs")
        seeded = {**params, "seed": params.get("sampling_seed")}  # SGLang's name for it
        s = sampling_from(seeded, max_key="max_new_tokens", max_default=128, top_k=top_n)
        outs = await self.run(prompts, s)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        items: list[dict[str, Any]] = []
        for (ids, _), group in zip(prompts, outs, strict=True):
            for out in group:
                meta = self._sglang_meta(out, ids, s.max_tokens or 0)
                meta["id"] = rid if len(prompts) * s.n == 1 else f"{rid}-{len(items)}"
                if want:
                    meta |= self._sglang_logprobs(out, ids, top_n, start, with_text)
                items.append(
                    {"text": self._text(out, params), "output_ids": out.ids, "meta_info": meta}
                )
        return items if batch or len(items) > 1 else items[0]

    def _sglang_meta(self, out: Output, prompt_ids: list[int], max_new: int) -> dict[str, Any]:
        if out.finish_reason == "length":
            finish: dict[str, Any] = {"type": "length", "length": max_new}
        else:
            matched = out.stop_reason if out.stop_reason is not None else self.engine.eos_id
            finish = {"type": "stop", "matched": matched}
        return {
            "finish_reason": finish,
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(out.ids),
            "cached_tokens": 0,
        }

    def _sglang_logprobs(
        self, out: Output, prompt_ids: list[int], top_n: int, start: int | None, with_text: bool
    ) -> dict[str, Any]:
        def triple(token_id: int, lp: float | None) -> list[Any]:
            return [lp, token_id, self.engine.token_text(token_id) if with_text else None]

        meta: dict[str, Any] = {
            "output_token_logprobs": [
                triple(i, lp) for i, lp in zip(out.ids, out.logprobs, strict=True)
            ]
        }
        if top_n:
            meta["output_top_logprobs"] = [
                [triple(i, lp) for i, lp in pos[:top_n]] for pos in out.top
            ]
        if start is not None and start >= 0:
            lps = list(zip(prompt_ids, self.engine.prompt_logprobs(prompt_ids, top_n), strict=True))
            meta["input_token_logprobs"] = [
                triple(token, None if pos is None else pos[0][1]) for token, pos in lps[start:]
            ]
            if top_n:
                meta["input_top_logprobs"] = [
                    None if pos is None else [triple(i, lp) for i, lp in pos[:top_n]]
                    for _, pos in lps[start:]
                ]
        return meta

    # --- TRL ------------------------------------------------------------------------------

    async def trl_generate(self, body: dict[str, Any]) -> Any:
        """`POST /generate/`: TRL `vllm-serve`'s shape."""
        texts = body.get("prompts")
        if (
            not isinstance(texts, list)
            or not texts
            or not all(isinstance(t, str) and t for t in texts)
        ):
            raise BadRequest("prompts must be a non-empty list of strings", "prompts")
        prompts = [(self.engine.encode(t, add_special_tokens=True), t) for t in texts]
        s = sampling_from(body, max_key="max_tokens", max_default=16)
        outs = await self.run(prompts, s)
        return {
            "prompt_ids": [ids for ids, _ in prompts],
            "completion_ids": [o.ids for group in outs for o in group],
            "logprobs": [o.logprobs for group in outs for o in group],
        }
