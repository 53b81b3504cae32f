"""The deterministic "model" behind `FakeInferenceServer`: tokenizer, request fields, outputs.

Completions are seeded pseudo-random token ids (or a responder's text, tokenized), cut by stop
strings, stop token ids and `max_tokens` the way an inference engine cuts them, with
deterministic negative logprobs. Nothing here touches the network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from atropos.inference.tokenizer import import_transformers_quietly

# Request fields are read as `atropos local serve` reads them (one set of rules, one error type).
from atropos.local.protocol import RequestError as BadRequest
from atropos.local.protocol import get_bool, get_float, get_int, get_stop, render_chat

#: `responder(prompt_text)` returns the completion text, or None for the random default.
Responder = Callable[[str], "str | None | Awaitable[str | None]"]


def load_tokenizer(path: str | None = None) -> Any:
    """Load a tokenizer from a local directory (default: the shipped tiny tokenizer), offline."""
    from atropos.tiny import tokenizer_path

    transformers = import_transformers_quietly()
    return transformers.AutoTokenizer.from_pretrained(path or tokenizer_path())


@dataclass(frozen=True)
class Sampling:
    """The sampling fields the fake honours (the rest are accepted and ignored)."""

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    top_k: int = 0  # alternatives to report per position (top logprobs), not a sampling cut


def sampling_from(
    body: Mapping[str, Any], *, max_key: str, max_default: int | None, top_k: int = 0
) -> Sampling:
    """Read the common sampling fields of `body` (OpenAI, vLLM and SGLang spell them alike)."""
    get_float(body, "top_p", 1.0, 0.0, 1.0)  # validated; the fake does not need it
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(i, int) for i in stop_ids):
        raise BadRequest("stop_token_ids must be a list of token ids", "stop_token_ids")
    return Sampling(
        n=get_int(body, "n", 1, 1, 128) or 1,
        max_tokens=get_int(body, max_key, max_default, 1, 1 << 20),
        temperature=get_float(body, "temperature", 1.0, 0.0, 100.0),
        seed=get_int(body, "seed", None, -(1 << 63), (1 << 64) - 1),
        stop=get_stop(body),
        stop_token_ids=tuple(stop_ids),
        ignore_eos=get_bool(body, "ignore_eos"),
        top_k=top_k,
    )


# --- generation -----------------------------------------------------------------------------


@dataclass
class Output:
    """One generated choice: ids, a logprob per id, alternatives per position, why it ended."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # sampled first


GENERATIONS_KEPT = 4096
"""Answers kept for repeated requests when there is no responder (least recently used out)."""


class Engine:
    """Tokenizes, renders chat templates and generates deterministic completions."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        seed: int = 0,
        completion_tokens: tuple[int, int] = (3, 20),
        responder: Responder | None = None,
        max_model_len: int = 4096,
    ) -> None:
        """Index the vocabulary; `completion_tokens` bounds the random completion length."""
        lo, hi = completion_tokens
        if not 0 <= lo <= hi:
            raise ValueError(f"expected 0 <= min <= max completion tokens, got {completion_tokens}")
        self.tokenizer = tokenizer
        self.seed, self.length, self.responder = seed, (lo, hi), responder
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        eos = tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise ValueError("the fake server's tokenizer needs an eos token")
        self.eos_id: int = eos
        self.pool = self._plain_ids()
        self._made: OrderedDict[tuple[tuple[int, ...], Sampling], list[Output]] = OrderedDict()

    def _plain_ids(self) -> list[int]:
        """Ids that decode to printable ASCII and can never spell a special token ("<", ">")."""
        special = set(self.tokenizer.all_special_ids)
        pool = []
        for i in range(self.vocab_size):
            text = self.tokenizer.decode([i])
            if i in special or not text or "<" in text or ">" in text:
                continue
            if all(32 <= ord(c) < 127 or c == "\n" for c in text):
                pool.append(i)
        return pool

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (as logprob entries show it)."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(self, body: Mapping[str, Any]) -> str:
        """The prompt text of a chat request, rendered with the chat template."""
        return render_chat(body, self.tokenizer)

    def check_length(self, prompt_ids: Sequence[int], sampling: Sampling) -> Sampling:
        """Refuse prompts that overflow the context (as vLLM does); fill in a missing max."""
        room = self.max_model_len - len(prompt_ids)
        wanted = sampling.max_tokens
        if room < 1 or (wanted is not None and wanted > room):
            raise BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {len(prompt_ids) + (wanted or 0)} tokens ({len(prompt_ids)} in "
                f"the prompt, {wanted or 0} in the completion).",
                "max_tokens",
            )
        if wanted is None:
            return dataclasses.replace(sampling, max_tokens=room)
        return sampling

    async def generate(
        self, prompt_ids: Sequence[int], prompt_text: str, s: Sampling
    ) -> list[Output]:
        """`s.n` completions of the prompt; the same request always gets the same answer.

        Without a responder the answer depends on the ids and the sampling fields alone, so the
        last `GENERATIONS_KEPT` answers are kept and handed out again (treat them as read-only).
        """
        key = None
        if self.responder is None:
            key = (tuple(prompt_ids), s)
            made = self._made.get(key)
            if made is not None:
                self._made.move_to_end(key)
                return list(made)
        outputs = await self._generate(prompt_ids, prompt_text, s)
        if key is not None:
            self._made[key] = outputs
            if len(self._made) > GENERATIONS_KEPT:
                self._made.popitem(last=False)
            return list(outputs)
        return outputs

    async def _generate(
        self, prompt_ids: Sequence[int], prompt_text: str, s: Sampling
    ) -> list[Output]:
        outputs = []
        for choice in range(s.n):
            # Greedy decoding (temperature 0) gives every choice the same answer, as engines do.
            key = f"{self.seed}|{s.seed}|{0 if s.temperature == 0 else choice}|{list(prompt_ids)}"
            rng = random.Random(hashlib.blake2b(key.encode(), digest_size=8).digest())
            content = await self._content(prompt_text, rng, s)
            ids, finish, reason = self._cut(content, rng, s)
            scale = 0.2 if s.temperature == 0 else 2.5
            lps = [-round(0.005 + scale * rng.random(), 6) for _ in ids]
            top = [self._alternatives(i, lp, rng, s.top_k) for i, lp in zip(ids, lps, strict=True)]
            outputs.append(Output(ids, lps, finish, reason, top))
        return outputs

    def prompt_logprobs(
        self, prompt_ids: Sequence[int], k: int
    ) -> list[list[tuple[int, float]] | None]:
        """Deterministic logprobs of the prompt's tokens: None for the first, then `k` entries
        per position (the prompt's own token first), as vLLM's `prompt_logprobs`."""
        if not prompt_ids:
            return []
        key = f"prompt|{self.seed}|{list(prompt_ids)}"
        rng = random.Random(hashlib.blake2b(key.encode(), digest_size=8).digest())
        lps = [-round(0.005 + 4 * rng.random(), 6) for _ in prompt_ids[1:]]  # independent of k
        out: list[list[tuple[int, float]] | None] = [None]
        for token, lp in zip(prompt_ids[1:], lps, strict=True):
            out.append(self._alternatives(token, lp, rng, k))
        return out

    async def _content(self, prompt_text: str, rng: random.Random, s: Sampling) -> list[int]:
        if self.responder is not None:
            text = self.responder(prompt_text)
            if inspect.isawaitable(text):
                text = await text
            if text is not None:
                return self.encode(str(text))
        return [rng.choice(self.pool) for _ in range(rng.randint(*self.length))]

    def _cut(
        self, content: list[int], rng: random.Random, s: Sampling
    ) -> tuple[list[int], str, str | int | None]:
        """End the completion as an engine would: stop token, stop string, max_tokens or eos."""
        limit = s.max_tokens if s.max_tokens is not None else len(content) + 1
        if s.ignore_eos:
            natural = content + [rng.choice(self.pool) for _ in range(max(0, limit - len(content)))]
        else:
            natural = content + [self.eos_id]
        ids = natural[:limit]
        truncated = s.ignore_eos or len(natural) > limit  # without eos, only the limit ends it
        for pos, token in enumerate(ids):
            if token in s.stop_token_ids:
                return ids[: pos + 1], "stop", token
        body = ids[:-1] if ids and ids[-1] == self.eos_id and not truncated else ids
        if s.stop:
            text = self.decode(body)
            hits = [(text.find(stop), stop) for stop in s.stop if stop in text]
            if hits:
                at, stop = min(hits)
                return body[: self._prefix_tokens(body, text[:at])], "stop", stop
        return ids, ("length" if truncated else "stop"), None

    def _prefix_tokens(self, ids: list[int], text: str) -> int:
        """The most leading tokens of `ids` whose text is a prefix of `text`."""
        lo, hi = 0, len(ids)
        while lo < hi:  # binary search on a (nearly) monotone predicate...
            mid = (lo + hi + 1) // 2
            if text.startswith(self.decode(ids[:mid])):
                lo = mid
            else:
                hi = mid - 1
        while lo and not text.startswith(self.decode(ids[:lo])):  # ...then make sure
            lo -= 1
        return lo

    def _alternatives(
        self, token: int, lp: float, rng: random.Random, k: int
    ) -> list[tuple[int, float]]:
        """`k` (id, logprob) entries with the sampled token first, the rest less likely."""
        if k <= 0:
            return [(token, lp)]
        others = [i for i in rng.sample(self.pool, min(k + 1, len(self.pool))) if i != token]
        alts = [
            (i, round(lp - 0.5 * (j + 1) - 0.1 * rng.random(), 6)) for j, i in enumerate(others)
        ]
        return [(token, lp), *alts[: k - 1]]
