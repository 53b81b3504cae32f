"""Token-exact sequences for `ManagedServer`: `SequenceNode`, `DriftKind`, extension by ids.

A node holds one sequence as the server saw it (prompt + completion ids), its trainer mask and
logprobs. A later prompt that continues a held sequence is built by appending token ids to it;
`classify_drift` says whether the re-rendered prompt agreed with the held ids (P11 in STYLE.md).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

MASKED = -100
# The logprob placeholder of masked positions: upstream's 1.0, held as the int 1 so it is sent
# as `1` (equal to 1.0 everywhere, a float to every JSON reader that builds tensors): encoding
# a float costs ~50 ns, an int ~5, and prompt positions are most of a group's logprobs.
PROMPT_LOGPROB = 1


class DriftKind(str, enum.Enum):
    """How a re-rendered prompt relates to the held tokens of the sequence it continues.

    * `CLEAN`: the held ids are a prefix of the re-rendered prompt's ids.
    * `REALIGN`: same text, different tokenization of the held part; the held ids are kept and
      only the new text is tokenized and appended.
    * `FORK`: the re-render changed earlier content (an edited turn, a template that rewrites
      history); a fresh sequence starts from the re-rendered prompt.
    """

    CLEAN = "clean"
    REALIGN = "realign"
    FORK = "fork"


@dataclass
class SequenceNode:
    """One sequence, token-exact: the prompt and completion ids as the server returned them.

    Attributes:
        tokens: prompt + completion ids.
        masked_tokens: -100 where the trainer must not learn (prompt, template tokens), the id
            elsewhere (completions, including earlier assistant turns of the conversation).
        logprobs: 1.0 on masked prompt positions, the server's logprob on completion tokens.
        finish_reason: the server's finish reason of the last completion ("stop", "length").
        full_text: the prompt text plus the completion text as returned to the caller.
        token_source: "server" (ids from the server) or "retokenized" (ids from text).
        messages: for chat sequences, the prompt messages plus the assistant reply.
        drift: how this sequence's last prompt extended a held one (None: it started fresh).
        policy_version: the lowest weight version the server reported for the calls that
            generated this sequence's completions (earlier turns included; a call whose `n` was
            split into several requests counts all of them); None when the server reports none.
    """

    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    finish_reason: str = ""
    full_text: str = ""
    token_source: Literal["server", "retokenized"] = "server"
    messages: list[dict[str, Any]] | None = None
    drift: DriftKind | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    policy_version: int | None = None

    def __post_init__(self) -> None:
        """Refuse misaligned rows: tokens, masks and logprobs must have one entry each."""
        n = len(self.tokens)
        if len(self.masked_tokens) != n or len(self.logprobs) != n:
            raise ValueError(
                f"expected equal lengths, got {n} tokens, {len(self.masked_tokens)} masked "
                f"tokens and {len(self.logprobs)} logprobs"
            )
        self.metadata.setdefault("finish_reason", self.finish_reason)

    def copy(self) -> SequenceNode:
        """A deep copy that shares nothing mutable with this node, made without `copy.deepcopy`.

        Token, mask and logprob rows hold numbers, so copying the lists is enough; `messages`
        and `metadata` are copied container by container (`copy.deepcopy` only for values
        that are neither containers nor immutable scalars). Several times faster than
        `copy.deepcopy(node)`, which visits every number of every row.

        >>> node = SequenceNode([1, 2], [-100, 2], [1.0, -0.5], messages=[{"role": "user"}])
        >>> twin = node.copy()
        >>> twin == node, twin.tokens is node.tokens, twin.messages[0] is node.messages[0]
        (True, False, False)
        """
        twin = copy.copy(self)  # a new object with the same fields, no __post_init__ check
        twin.tokens = list(self.tokens)
        twin.masked_tokens = list(self.masked_tokens)
        twin.logprobs = list(self.logprobs)
        twin.messages = _copy_data(self.messages)
        twin.metadata = _copy_data(self.metadata)
        return twin

    def to_dict(self) -> dict[str, Any]:
        """A plain-JSON dict of the node (`drift` as its string value)."""
        out = dataclasses.asdict(self)
        out["drift"] = self.drift.value if self.drift is not None else None
        return out


_IMMUTABLE = (str, int, float, bool, bytes, type(None), enum.Enum)


def _copy_data(value: Any) -> Any:
    """`copy.deepcopy` for JSON-like data (dicts, lists, tuples, scalars), only faster."""
    if isinstance(value, _IMMUTABLE):
        return value
    if type(value) is dict:
        return {k: _copy_data(v) for k, v in value.items()}
    if type(value) is list:
        return [_copy_data(v) for v in value]
    if type(value) is tuple:
        return tuple(_copy_data(v) for v in value)
    return copy.deepcopy(value)


def classify_drift(
    held: Sequence[int],
    held_text: str,
    prompt_ids: Sequence[int],
    prompt_text: str,
    encode: Callable[[str], list[int]],
) -> tuple[DriftKind, list[int]]:
    """Classify a new prompt against a held sequence; return the kind and the ids to send.

    Args:
        held: the held sequence's ids (prompt + completion, as the server returned them).
        held_text: those ids decoded, special tokens kept.
        prompt_ids: the new prompt, tokenized from `prompt_text`.
        prompt_text: the new prompt as text (a rendered chat template, or a raw prompt).
        encode: tokenizes a text suffix (no special tokens added).

    Returns:
        `(CLEAN, prompt_ids)` when `held` is their prefix; `(REALIGN, held + encode(rest))`
        when `held_text` is a prefix of `prompt_text`; else `(FORK, prompt_ids)`.

    >>> classify_drift([1, 2], "ab", [1, 2, 3], "abc", lambda s: [9])
    (<DriftKind.CLEAN: 'clean'>, [1, 2, 3])
    >>> classify_drift([1, 5], "ab", [1, 2, 3], "abc", lambda s: [ord(c) for c in s])
    (<DriftKind.REALIGN: 'realign'>, [1, 5, 99])
    >>> classify_drift([1, 5], "aX", [1, 2, 3], "abc", lambda s: [])
    (<DriftKind.FORK: 'fork'>, [1, 2, 3])
    """
    if list(prompt_ids[: len(held)]) == list(held):
        return DriftKind.CLEAN, list(prompt_ids)
    if prompt_text.startswith(held_text):
        return DriftKind.REALIGN, [*held, *encode(prompt_text[len(held_text) :])]
    return DriftKind.FORK, list(prompt_ids)


def build_node(
    *,
    prompt_tokens: Sequence[int],
    output: Sequence[int],
    output_logprobs: Sequence[float],
    finish_reason: str,
    parent: SequenceNode | None,
    end_of_turn: int = 0,
    full_text: str = "",
    messages: list[dict[str, Any]] | None = None,
    drift: DriftKind | None = None,
    policy_version: int | None = None,
    unlearned: tuple[int, int] | None = None,
    prefixed: bool = False,
) -> SequenceNode:
    """The node of one choice: prompt masked, completion trainable, logprobs aligned 1:1.

    When `parent` is given and the server's prompt starts with its tokens, the parent's masks and
    logprobs are kept (earlier completions stay trainable) and only the new prompt tokens are
    masked (`prefixed=True`: the caller knows the prompt starts with them, and they are not
    compared again). `end_of_turn` trailing output tokens are kept but masked (a "length"
    completion that ended in an end-of-turn token must not teach the model to stop).
    `unlearned` is `(start, count)`: output ids we inserted ourselves (a reasoning block closed
    at its budget, `thinking_budget.py`), kept but masked like prompt ids. The node's
    `policy_version` is the lowest of `policy_version` and the parent's (when kept).

    Raises:
        ValueError: the server's logprobs do not match its output ids one to one.
    """
    node = build_nodes(
        prompt_tokens=prompt_tokens,
        outputs=[output],
        output_logprobs=[output_logprobs],
        finish_reasons=[finish_reason],
        full_texts=[full_text],
        parent=parent,
        prefixed=prefixed,
        end_of_turn=[end_of_turn] if end_of_turn else None,
        drift=drift,
        policy_version=policy_version,
        unlearned=[unlearned] if unlearned is not None else None,
    )[0]
    node.messages = messages
    return node


def build_nodes(
    *,
    prompt_tokens: Sequence[int],
    outputs: Sequence[Sequence[int]],
    output_logprobs: Sequence[Sequence[float]],
    finish_reasons: Sequence[str],
    full_texts: Sequence[str],
    parent: SequenceNode | None,
    prefixed: bool = False,
    end_of_turn: Sequence[int] | None = None,
    drift: DriftKind | None = None,
    policy_version: int | None = None,
    unlearned: Sequence[tuple[int, int] | None] | None = None,
    take_parent: bool = False,
) -> list[SequenceNode]:
    """`build_node` for every choice of one prompt (a group's `n` completions): the prompt's
    mask and logprob rows are made once and each node's rows are one concatenation of them
    with its completion, but the last node's: those rows extended in place (so a continued
    conversation's rows are copied once per call, not twice: at 32k tokens, ~260 us a call
    against ~410). No node shares a list with another, or with the parent. `end_of_turn` and
    `unlearned` are per choice (None: none anywhere).

    `take_parent`: the parent is being replaced by these nodes and nothing will read it again
    (`ManagedServer(reuse_rows=True)`), so the last node takes its three rows, extended in
    place, and the parent is left empty: a continued conversation is then not copied at all.

    Long because its keyword-only signature and docstring are most of it; the body is a hot path.
    """
    prompt = prompt_tokens if type(prompt_tokens) is list else list(prompt_tokens)
    taken: list[int] | None = None  # the parent's tokens, for the last node
    masked: list[int]
    logprobs: list[Any]
    if parent is not None and (prefixed or starts_with(prompt, parent.tokens)):
        new = len(prompt) - len(parent.tokens)
        if take_parent:
            taken, masked, logprobs = _take_rows(parent, prompt)
            masked += [MASKED] * new
            logprobs += [PROMPT_LOGPROB] * new
        else:
            masked = parent.masked_tokens + [MASKED] * new
            logprobs = parent.logprobs + [PROMPT_LOGPROB] * new
        if parent.policy_version is not None:
            if policy_version is None or parent.policy_version < policy_version:
                policy_version = parent.policy_version
    else:
        masked, logprobs = [MASKED] * len(prompt), [PROMPT_LOGPROB] * len(prompt)
    nodes = []
    last = len(outputs) - 1
    for i, out in enumerate(outputs):
        out = out if type(out) is list else list(out)
        lps = output_logprobs[i]
        if len(lps) != len(out) or type(lps) is not list or (lps and type(lps[0]) is not float):
            lps = _logprob_row(lps, len(out))
        eot = end_of_turn[i] if end_of_turn is not None else 0
        spliced = unlearned[i] if unlearned is not None else None
        if eot or spliced is not None:
            row, lp_row = _masked_rows(masked, logprobs, len(prompt), out, lps, eot, spliced)
        elif i == last:  # the prompt's rows are this call's own: the last node takes them
            masked += out
            logprobs += lps
            row, lp_row = masked, logprobs
        else:
            row, lp_row = masked + out, logprobs + lps
        if i == last and taken is not None:
            taken += out
            tokens = taken
        else:
            tokens = prompt + out
        node = _NEW_NODE(SequenceNode)  # rows aligned by construction: no __post_init__ check
        finish = finish_reasons[i]
        node.__dict__ = {
            "tokens": tokens,
            "masked_tokens": row,
            "logprobs": lp_row,
            "finish_reason": finish,
            "full_text": full_texts[i],
            "token_source": "server",
            "messages": None,
            "drift": drift,
            "metadata": {"finish_reason": finish},
            "policy_version": policy_version,
        }
        nodes.append(node)
    return nodes


_NEW_NODE = object.__new__


def _take_rows(parent: SequenceNode, prompt: list[int]) -> tuple[list[int], list[int], list[Any]]:
    """The parent's three rows, its tokens extended to `prompt` (which they open), and the
    parent left an empty node (read again, it is visibly not the sequence it was)."""
    tokens, masked, logprobs = parent.tokens, parent.masked_tokens, parent.logprobs
    if tokens is prompt:  # (the prompt's list stays the prompt's)
        tokens = list(tokens)
    tokens += prompt[len(tokens) :]
    parent.tokens, parent.masked_tokens, parent.logprobs = [], [], []
    return tokens, masked, logprobs


def starts_with(ids: list[int], prefix: list[int]) -> bool:
    """Whether `ids` starts with `prefix` (compared in place when `ids` is no longer).

    >>> starts_with([1, 2, 3], [1, 2]), starts_with([1, 2], [1, 2]), starts_with([1], [1, 2])
    (True, True, False)
    """
    if len(ids) == len(prefix):
        return ids == prefix
    return len(ids) > len(prefix) and ids[: len(prefix)] == prefix


def _logprob_row(lps: Sequence[float], n: int) -> list[Any]:
    """The server's logprobs of an output of `n` ids as a list of floats, checked 1:1."""
    if len(lps) != n:
        raise ValueError(f"the server returned {len(lps)} logprobs for {n} output tokens")
    if type(lps) is not list or (lps and type(lps[0]) is not float):
        return [float(x) for x in lps]
    return lps


def _masked_rows(
    masked: list[int],
    logprobs: list[Any],
    at: int,
    out: list[int],
    lps: list[Any],
    end_of_turn: int,
    unlearned: tuple[int, int] | None,
) -> tuple[list[int], list[Any]]:
    """A node's mask and logprob rows when some of its output is not learned: `end_of_turn`
    trailing ids, `unlearned` (`(start, count)` within the output, which begins at `at`)."""
    keep = len(out) - end_of_turn
    row = masked + out[:keep] + [MASKED] * end_of_turn
    lp_row = logprobs + lps[:keep] + [PROMPT_LOGPROB] * end_of_turn
    if unlearned is not None:
        start = at + unlearned[0]
        for i in range(start, start + unlearned[1]):
            row[i], lp_row[i] = MASKED, PROMPT_LOGPROB
    return row, lp_row
