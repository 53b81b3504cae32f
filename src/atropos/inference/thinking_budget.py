"""`max_reasoning_tokens` enforced on token-level generation (`ManagedServer`), on any server.

We render the chat template and send token ids, so we can end a reasoning block ourselves, the
way vLLM's `thinking_token_budget` and SGLang's thinking-budget processors do on the server:

1. The first request asks for at most `budget` tokens (fewer when `max_tokens` is smaller).
2. A choice that stopped before that is done.
3. A choice cut at the budget while its reasoning block (`<think>` ... `</think>`, found by the
   tokenizer's own tokens) is still open is closed by us: "\\n" and `</think>` are appended as
   ids, then generation continues from there (one request per such choice, `n=1`) for what is
   left of `max_tokens`. The appended ids were never sampled: they carry no logprob, and the
   trainer's mask leaves them out (`forced_at`).
4. A choice cut at the budget whose block had closed (or that never opened one) continues
   from where it stopped, unchanged: the cut is invisible in its tokens.

The reasoning block gets at most `budget` tokens of the completion (the opening `<think>`, when
the model writes it, counts). Continuing by token ids keeps every id exactly as sampled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from atropos.inference.base import gather_or_cancel

Sample = Callable[
    [list[int], int, "int | None"],
    Awaitable[tuple[list[int], list[list[int]], list[list[float]], list[str]]],
]
"""`sample(input_ids, n, max_tokens) -> (prompt, outputs, logprobs, finish reasons)`."""

FORCED_LOGPROB = 1.0
"""The logprob placed on ids we appended (masked for the trainer, like prompt positions)."""


@dataclass(frozen=True)
class ThinkMarkers:
    """A tokenizer's reasoning-block tokens, and the ids that close a block at its budget.

    >>> markers = ThinkMarkers(open_id=7, close_id=8, forced=(3, 8))
    >>> markers.is_open([1, 7, 5]), markers.is_open([7, 5, 8, 2]), markers.is_open([1, 2])
    (True, False, False)
    """

    open_id: int
    close_id: int
    forced: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Any) -> ThinkMarkers | None:
        """The markers of a tokenizer with single `<think>` and `</think>` tokens, else None."""
        get_vocab = getattr(tokenizer, "get_vocab", None)
        vocab = get_vocab() if callable(get_vocab) else {}
        open_id, close_id = vocab.get("<think>"), vocab.get("</think>")
        if not isinstance(open_id, int) or not isinstance(close_id, int):
            return None
        newline = list(tokenizer.encode("\n", add_special_tokens=False))
        return cls(open_id, close_id, (*newline, close_id))

    def is_open(self, ids: Sequence[int]) -> bool:
        """Whether `ids` end inside a reasoning block (its last marker opens one)."""
        for token in reversed(ids):
            if token == self.close_id:
                return False
            if token == self.open_id:
                return True
        return False


@dataclass
class Choice:
    """One completion generated within the budget.

    Attributes:
        output: the completion's ids, appended ids included.
        logprobs: one per id (`FORCED_LOGPROB` on the appended ones).
        finish_reason: the finish reason of its last request.
        forced_at: where in `output` the ids we appended start (None: none were).
        forced: how many ids we appended.
    """

    output: list[int]
    logprobs: list[float]
    finish_reason: str
    forced_at: int | None = None
    forced: int = 0


def _next_step(
    markers: ThinkMarkers,
    ids: list[int],
    out: list[int],
    finish: str,
    budget: int,
    limit: int | None,
) -> tuple[tuple[int, ...], int | None] | None:
    """For a choice after the first request: (ids to append, tokens left) to continue it, or
    None when it is done (it stopped by itself, or nothing of `limit` is left)."""
    if finish != "length" or len(out) < budget:
        return None
    forced = markers.forced if markers.is_open(ids) else ()
    if limit is None:
        return forced, None
    left = limit - len(out) - len(forced)
    return (forced, left) if left > 0 else None


async def sample_within_budget(
    sample: Sample,
    input_ids: list[int],
    n: int,
    limit: int | None,
    budget: int,
    markers: ThinkMarkers,
) -> tuple[list[int], list[Choice]]:
    """`n` completions of `input_ids` of at most `limit` tokens (None: the server's default
    after the first request), whose reasoning blocks take at most `budget` tokens.

    Returns:
        The prompt ids as the server saw them, and one `Choice` per completion.
    """
    first = budget if limit is None else min(budget, limit)
    prompt, outs, lps, finishes = await sample(input_ids, n, first)
    choices = [Choice(list(o), list(lp), f) for o, lp, f in zip(outs, lps, finishes, strict=True)]
    if limit is not None and limit <= budget:
        return prompt, choices
    steps = [
        _next_step(markers, [*prompt, *c.output], c.output, c.finish_reason, budget, limit)
        for c in choices
    ]
    todo = [(c, step) for c, step in zip(choices, steps, strict=True) if step is not None]
    if not todo:
        return prompt, choices
    answers = await gather_or_cancel(
        sample([*prompt, *c.output, *forced], 1, left) for c, (forced, left) in todo
    )
    for (choice, (forced, _)), (_, more, more_lps, more_finish) in zip(todo, answers, strict=True):
        if forced:
            choice.forced_at, choice.forced = len(choice.output), len(forced)
        choice.output += [*forced, *more[0]]
        choice.logprobs += [FORCED_LOGPROB] * len(forced) + list(more_lps[0])
        choice.finish_reason = more_finish[0]
    return prompt, choices
