"""Batched incremental decoding: left-padded prefill, then one token per step with the KV cache.

`decode_rows` fills each `Row` in place. The prompts are left-padded; the attention mask hides
the padding and the position ids count only real tokens (`cumsum(mask) - 1`), so every row sees
exactly what it would see alone. Each step:

- logprobs are `log_softmax` of the raw logits (temperature 1, before top-p/top-k), vLLM's
  default "raw_logprobs" mode: the number a trainer gets from a plain forward pass.
- temperature 0 takes the argmax; otherwise the logits are divided by the temperature, cut by
  `top_k` and `top_p`, and a token is drawn with the row's own `torch.Generator` (so a seeded
  request draws the same tokens whatever else shares its batch).
- a row ends on one of its `stop_token_ids`, on an eos / end-of-turn token (unless
  `ignore_eos`), on a stop string in its decoded text, or at its token limit; finished rows are
  dropped from the batch and from the cache.

Prompt logprobs (`Sampling.prompt_logprobs`) come from the prefill logits.

Between two steps `between()` (the engine's) may park the batch while the weights change, or
end it by raising; it returns the weight version of the next step, and every row keeps the
versions of its first and last tokens (`first_version`, `last_version`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from atropos.local.protocol import Output, PromptLogprobs, Sampling


@dataclass
class Row:
    """One sequence being generated: choice `choice` of prompt `prompt_index` of `job`."""

    job: Any
    prompt_index: int
    choice: int
    prompt: list[int]
    sampling: Sampling
    limit: int  # most tokens to generate
    generator: torch.Generator | None  # None: greedy
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""
    prompt_logprobs: PromptLogprobs | None = None
    first_version: int = 0  # the weight version of the first token
    last_version: int = 0  # the weight version of the last token

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.sampling.prompt_logprobs is not None and self.choice == 0

    def output(self) -> Output:
        """The finished row as the server answers it."""
        return Output(
            self.ids,
            self.logprobs,
            self.top,
            self.finish_reason or "length",
            self.stop_reason,
            self.text,
        )

    def add(
        self,
        token: int,
        logprob: float,
        top: list[tuple[int, float]],
        stop_ids: frozenset[int],
        decode: Callable[[list[int], bool], str],
    ) -> bool:
        """Append one sampled token; True when the row has finished (its text is then set)."""
        s = self.sampling
        self.ids.append(token)
        self.logprobs.append(logprob)
        self.top.append(top)
        keep_last = s.include_stop_str_in_output
        if token in s.stop_token_ids:
            self.finish_reason, self.stop_reason = "stop", token
        elif token in stop_ids and not s.ignore_eos:
            self.finish_reason = "stop"
        elif s.stop:
            text = decode(self.ids, s.skip_special_tokens)
            hits = [(text.find(stop), stop) for stop in s.stop if stop in text]
            if hits:
                at, stop = min(hits)
                self.finish_reason, self.stop_reason = "stop", stop
                self.text = text[: at + len(stop)] if keep_last else text[:at]
                return True
        if self.finish_reason is None and len(self.ids) < self.limit:
            return False
        if self.finish_reason is None:
            self.finish_reason = "length"
            self.text = decode(self.ids, s.skip_special_tokens)
        else:  # a stop token: its text is left out unless include_stop_str_in_output
            self.text = decode(self.ids if keep_last else self.ids[:-1], s.skip_special_tokens)
        return True


def _forward(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any, every: bool
) -> tuple[torch.Tensor, Any]:
    """One forward pass: (logits, the KV cache), the logits of the last position only unless
    `every`."""
    names = forward_names(model.__class__)
    extra: dict[str, Any] = {names.cache: cache}
    if names.logits_to_keep and not every:
        extra["logits_to_keep"] = 1
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
    return out.logits, getattr(out, names.cache)


@dataclass(frozen=True)
class ForwardNames:
    """How a causal LM's `forward` spells what decoding passes it.

    transformers 5.24 renamed the KV cache argument and output field `past_key_values` to
    `cache` (the old name warns, and goes in 5.40); `logits_to_keep` arrived in 4.50. Reading the
    signature, not the version, keeps custom and remote-code models working too.
    """

    cache: str  # "cache" or "past_key_values": the argument and the output field
    logits_to_keep: bool


@functools.cache
def forward_names(model_class: Any) -> ForwardNames:
    """The names `model_class.forward` takes (read once per class)."""
    params = inspect.signature(model_class.forward).parameters
    return ForwardNames(
        cache="cache" if "cache" in params else "past_key_values",
        logits_to_keep="logits_to_keep" in params,
    )


def _prompt_logprobs(row: Row, logits: torch.Tensor, width: int) -> PromptLogprobs:
    """None, then per prompt token (id, logprob, rank) and the best alternatives."""
    k = row.sampling.prompt_logprobs or 0
    prompt = row.prompt
    start = width - len(prompt)  # left padding
    lps = torch.log_softmax(logits[start : width - 1].float(), dim=-1)
    targets = torch.tensor(prompt[1:], dtype=torch.long, device=lps.device)
    own = lps.gather(1, targets[:, None])[:, 0]
    ranks = (lps > own[:, None]).sum(dim=1) + 1
    best = lps.topk(k, dim=-1) if k else None
    positions: PromptLogprobs = [None]
    own_l, ranks_l = own.tolist(), ranks.tolist()
    best_ids = best.indices.tolist() if best is not None else [[] for _ in own_l]
    best_lps = best.values.tolist() if best is not None else [[] for _ in own_l]
    for t, token in enumerate(prompt[1:]):
        entries = [(token, own_l[t], ranks_l[t])]
        entries += [
            (i, lp, r)
            for r, (i, lp) in enumerate(zip(best_ids[t], best_lps[t], strict=True), start=1)
            if i != token
        ]
        positions.append(entries)
    return positions


def _sample(logits: torch.Tensor, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, raw logprobs of the whole vocabulary) for one step."""
    raw = torch.log_softmax(logits.float(), dim=-1)
    tokens = raw.argmax(dim=-1)
    hot = [i for i, row in enumerate(rows) if row.generator is not None]
    if not hot:
        return tokens, raw
    device = logits.device
    sub = logits[hot].float()
    temps = torch.tensor([rows[i].sampling.temperature for i in hot], device=device)
    sub = sub / temps[:, None]
    top_k = [rows[i].sampling.top_k for i in hot]
    if any(top_k):
        kth = torch.stack(
            [
                row_logits.topk(min(k, row_logits.numel())).values[-1] if k else row_logits.min()
                for row_logits, k in zip(sub, top_k, strict=True)
            ]
        )
        sub = sub.masked_fill(sub < kth[:, None], float("-inf"))
    probs = torch.softmax(sub, dim=-1)
    top_p = torch.tensor([rows[i].sampling.top_p for i in hot], device=device)
    if bool((top_p < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the better tokens
        sorted_probs = sorted_probs.masked_fill(before > top_p[:, None], 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
    # Exponential race: argmax(p / E), E ~ Exp(1), draws a token with probability p / sum(p).
    noise = torch.stack(
        [
            torch.empty(probs.shape[1], device=device).exponential_(generator=rows[i].generator)
            for i in hot
        ]
    )
    tokens[hot] = (probs / noise).argmax(dim=-1)
    return tokens, raw


@torch.no_grad()
def decode_rows(
    model: Any,
    rows: list[Row],
    *,
    stop_ids: frozenset[int],
    pad_id: int,
    decode: Callable[[list[int], bool], str],
    device: str,
    version: int = 0,
    between: Callable[[], int] | None = None,
) -> None:
    """Generate every row to its end (see the module docstring).

    Long because it is the decode loop read top to bottom: prefill, then sample, stop and
    prune per step share the batch's tensors and the cache.
    """
    width = max(len(row.prompt) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row.prompt) :] = torch.tensor(row.prompt)
        mask[i, width - len(row.prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    all_logits = any(row.wants_prompt_logprobs for row in rows)
    logits, cache = _forward(model, ids, mask, pos, None, all_logits)
    if all_logits:
        for i, row in enumerate(rows):
            if row.wants_prompt_logprobs:
                row.prompt_logprobs = _prompt_logprobs(row, logits[i], width)
    logits = logits[:, -1]
    pos = pos[:, -1:]
    live = list(range(len(rows)))  # rows[live[j]] is batch row j
    prune = getattr(cache, "batch_select_indices", None)
    k = max((row.sampling.logprobs or 0) for row in rows)
    for row in rows:
        row.first_version = row.last_version = version
    while True:
        batch = [rows[i] for i in live]
        tokens, raw = _sample(logits, batch)
        chosen = raw.gather(1, tokens[:, None])[:, 0].tolist()
        best = raw.topk(k, dim=-1) if k else None
        best_ids = best.indices.tolist() if best is not None else None
        best_lps = best.values.tolist() if best is not None else None
        keep = []
        for j, (row, token) in enumerate(zip(batch, tokens.tolist(), strict=True)):
            if row.finish_reason is not None:  # finished, still in an unprunable cache
                continue
            top = []
            if best_ids is not None and best_lps is not None and row.sampling.logprobs:
                n = row.sampling.logprobs
                top = list(zip(best_ids[j][:n], best_lps[j][:n], strict=True))
            row.last_version = version
            if not row.add(token, chosen[j], top, stop_ids, decode):
                keep.append(j)
        if not keep:
            return
        if prune is not None and len(keep) < len(live):
            index = torch.tensor(keep, device=ids.device)
            prune(index)
            tokens, mask, pos = tokens[index], mask[index], pos[index]
            live = [live[j] for j in keep]
        if between is not None:
            version = between()
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        pos = pos + 1
        logits, cache = _forward(model, tokens[:, None], mask, pos, cache, False)
        logits = logits[:, -1]
