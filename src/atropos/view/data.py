"""The page's data: each group reduced to what the page shows, as plain JSON values.

Scores get their statistics here (the page sorts and filters on them); messages are
normalised to `{role, content, images, extra}`; each group gets a one-line preview of its prompt
(the last user message) and of its best answer (the highest-scored sequence's last assistant
message), and the count of leading messages all its sequences share (shown once); images are
kept only as `data:image/*` URLs (bare base64 is sniffed and wrapped; remote URLs are never
loaded); numbers that JSON cannot carry (NaN, infinities) become null. With a tokenizer each
sequence also gets its token pieces and mask runs (see `atropos.view.tokens`), within a budget
of tokens per page.

>>> score_stats([1.0, 0.0, 0.5])
{'min': 0.0, 'mean': 0.5, 'max': 1.0, 'spread': 1.0}
>>> score_stats([None]) is None
True
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from atropos.view import tokens as tok
from atropos.view.read import Collection, Entry

TOKEN_BUDGET = 2_000_000
"""Token pieces embedded in one page at most (about 6 bytes each); later sequences show
their messages and counts only."""

IMAGE_BUDGET = 64 * 2**20
"""Bytes of image data embedded in one page at most."""

PREVIEW_CHARS = 200
"""Characters of a collapsed group's prompt and answer previews at most."""

_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg|gif|webp|bmp);base64,[A-Za-z0-9+/=\s]+\Z")
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)


def finite(x: Any) -> float | None:
    """`x` as a float, or None when it is no finite number.

    >>> finite(1), finite("2.5"), finite(float("nan")), finite(True), finite(None)
    (1.0, None, None, None, None)
    """
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    value = float(x)
    return value if math.isfinite(value) else None


def score_stats(scores: list[float | None]) -> dict[str, float] | None:
    """min, mean, max and spread (max - min) of the finite scores; None when there are none."""
    known = [s for s in scores if s is not None]
    if not known:
        return None
    low, high = min(known), max(known)
    return {"min": low, "mean": sum(known) / len(known), "max": high, "spread": high - low}


def jsonable(value: Any, depth: int = 0) -> Any:
    """`value` with non-finite floats as null and non-JSON values as their `repr`.

    >>> jsonable({"a": [1.5, float("inf")], "b": (1, 2), 3: {1, 2}})
    {'a': [1.5, None], 'b': [1, 2], '3': '{1, 2}'}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if depth > 50:
        return "..."
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value]
    return repr(value)


def image_url(value: Any) -> str | None:
    """A `data:image/...;base64,` URL for an image given as such a URL or as bare base64.

    Anything else (a remote or `file:` URL, SVG, text that is no image) gives None: the page
    never makes a request.

    >>> png = base64.b64encode(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(8)).decode()
    >>> image_url(png).startswith("data:image/png;base64,")
    True
    >>> image_url("https://example.com/cat.png") is None
    True
    >>> image_url("data:image/svg+xml;base64,PHN2Zz4=") is None
    True
    """
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.startswith("data:"):
        return text if _DATA_URL.match(text) else None
    if len(text) < 16 or not re.fullmatch(r"[A-Za-z0-9+/=\s]+", text):
        return None
    try:
        head = base64.b64decode(text[:64] + "=" * (-len(text[:64]) % 4), validate=False)
    except (binascii.Error, ValueError):
        return None
    kind = next((k for magic, k in _MAGIC if head.startswith(magic)), None)
    if kind is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "webp"
    return f"data:image/{kind};base64,{''.join(text.split())}" if kind else None


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    return [value]


@dataclass
class Budget:
    """What is left to embed in one page."""

    tokens: int = TOKEN_BUDGET
    image_bytes: int = IMAGE_BUDGET
    tokens_omitted: int = 0  # sequences left without their token view
    images_omitted: int = 0  # images left out (remote, not images, over the budget)

    def images(self, values: Any) -> list[str]:
        kept = []
        for v in _flat(values) if values is not None else []:
            url = image_url(v)
            if url is None or len(url) > self.image_bytes:
                self.images_omitted += 1
                continue
            self.image_bytes -= len(url)
            kept.append(url)
        return kept


def _content(content: Any, budget: Budget) -> tuple[str, list[str]]:
    """(text, images) of a message's content: a string, or OpenAI-style parts."""
    if isinstance(content, str):
        return content, []
    if isinstance(content, list):
        texts: list[str] = []
        images: list[Any] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in ("image_url", "image"):
                ref = part.get("image_url", part.get("image"))
                images.append(ref.get("url") if isinstance(ref, dict) else ref)
            else:
                texts.append(json.dumps(jsonable(part), ensure_ascii=False))
        return "\n".join(texts), budget.images(images)
    if content is None:
        return "", []
    return json.dumps(jsonable(content), ensure_ascii=False), []


def messages(conversation: Any, budget: Budget) -> list[dict[str, Any]] | None:
    """One sequence's messages as `{role, content, images, extra}` (extra: other keys, JSON).

    >>> messages([{"role": "user", "content": "hi", "name": "x"}, "plain"], Budget())
    [{'role': 'user', 'content': 'hi', 'images': [], 'extra': '{"name": "x"}'}, \
{'role': '', 'content': 'plain', 'images': [], 'extra': None}]
    """
    if conversation is None:
        return None
    if not isinstance(conversation, list):
        conversation = [conversation]
    out = []
    for m in conversation:
        if not isinstance(m, dict):
            m = {"role": "", "content": m}
        text, images = _content(m.get("content"), budget)
        rest = {k: v for k, v in m.items() if k not in ("role", "content")}
        out.append(
            {
                "role": str(m.get("role", "")),
                "content": text,
                "images": images,
                "extra": json.dumps(jsonable(rest), ensure_ascii=False) if rest else None,
            }
        )
    return out


def _row(rows: Any, i: int) -> Any:
    if isinstance(rows, list) and i < len(rows):
        return rows[i]
    return None


def _int_row(row: Any) -> list[int] | None:
    if not isinstance(row, list):
        return None
    if all(isinstance(x, int) and not isinstance(x, bool) for x in row):
        return row
    return None


def _mean_trained(logprobs: Any, masks: list[int] | None) -> float | None:
    if not isinstance(logprobs, list) or masks is None or len(logprobs) != len(masks):
        return None
    vals = [finite(lp) for lp, m in zip(logprobs, masks, strict=True) if m != tok.MASKED]
    known = [v for v in vals if v is not None]
    return sum(known) / len(known) if known else None


def sequence(group: dict[str, Any], i: int, tokenizer: Any, budget: Budget) -> dict[str, Any]:
    """What the page shows of sequence `i` of `group`."""
    ids = _int_row(_row(group.get("tokens"), i))
    masks = _int_row(_row(group.get("masks"), i))
    if ids is not None and masks is not None and len(masks) != len(ids):
        masks = None
    override = _row(group.get("overrides"), i)
    finish = override.get("finish_reason") if isinstance(override, dict) else None
    seq: dict[str, Any] = {
        "score": finite(_row(group.get("scores"), i)),
        "n": len(ids) if ids is not None else None,
        "trained": sum(m != tok.MASKED for m in masks) if masks is not None else None,
        "finish": str(finish) if finish is not None else None,
        "overrides": jsonable(override) if override else None,
        "messages": messages(_row(group.get("messages"), i), budget),
        "lp": _mean_trained(_row(group.get("inference_logprobs"), i), masks),
        "pieces": None,
        "runs": None,
    }
    if tokenizer is not None and ids is not None:
        if len(ids) > budget.tokens:
            budget.tokens_omitted += 1
        else:
            try:
                seq["pieces"] = tok.pieces(tokenizer, ids)
            except Exception as err:  # ids the tokenizer does not know: no token view
                seq["pieces_error"] = f"{type(err).__name__}: {err}"
            else:
                budget.tokens -= len(ids)
                seq["runs"] = tok.mask_runs(masks) if masks is not None else None
    return seq


def group_data(entry: Entry, tokenizer: Any, budget: Budget) -> dict[str, Any]:
    """What the page shows of one group."""
    g = entry.group
    count = len(g["scores"])
    seqs = [sequence(g, i, tokenizer, budget) for i in range(count)]
    scores = [s["score"] for s in seqs]
    env = g.get("env_id")
    best = best_index(scores)
    prompt, answer = previews(seqs, best)
    return {
        "where": entry.where,
        "received": entry.received,
        "env": env if isinstance(env, int) and not isinstance(env, bool) else None,
        "group_id": _str_or_none(g.get("group_id")),
        "policy_version": _str_or_none(g.get("policy_version")),
        "token_source": _str_or_none(g.get("token_source")),
        "stats": score_stats(scores),
        "best": best,
        "prompt_preview": prompt,
        "answer_preview": answer,
        "shared": shared_prefix([s["messages"] for s in seqs]),
        "seqs": seqs,
        "images": budget.images(g.get("images")),
        "group_overrides": jsonable(g.get("group_overrides")) or None,
    }


def best_index(scores: list[float | None]) -> int | None:
    """The index of the highest finite score (the first of equals); None when there is none.

    >>> best_index([0.5, None, 1.0, 1.0]), best_index([None])
    (2, None)
    """
    best: int | None = None
    top = 0.0
    for i, score in enumerate(scores):
        if score is not None and (best is None or score > top):
            best, top = i, score
    return best


def shared_prefix(conversations: list[list[dict[str, Any]] | None]) -> int:
    """How many leading messages every conversation of a group has in common, leaving each
    at least its last message (its own part). 0 for a single sequence, or when any sequence
    has no messages.

    >>> q, a, b = ({"role": r, "content": c} for r, c in [("user", "q"), ("a", "1"), ("a", "2")])
    >>> shared_prefix([[q, a], [q, b]]), shared_prefix([[q, a], [q, a]]), shared_prefix([[q, a]])
    (1, 1, 0)
    """
    if len(conversations) < 2 or any(not c for c in conversations):
        return 0
    convs = [c for c in conversations if c]
    limit = min(len(c) for c in convs) - 1
    k = 0
    while k < limit and all(c[k] == convs[0][k] for c in convs[1:]):
        k += 1
    return k


def one_line(text: str, limit: int = PREVIEW_CHARS) -> str:
    """`text` on one line (runs of whitespace as one space), cut to `limit` characters.

    >>> one_line("What is\\n\\n  2 + 2?"), one_line("x" * 10, 4)
    ('What is 2 + 2?', 'xxx…')
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _last(messages: list[dict[str, Any]] | None, role: str) -> str | None:
    for m in reversed(messages or []):
        if m["role"].lower() == role and m["content"].strip():
            return one_line(m["content"])
    return None


def previews(seqs: list[dict[str, Any]], best: int | None) -> tuple[str | None, str | None]:
    """(prompt, answer) previews of a group: the last user message and the best sequence's
    last assistant message, each on one line (taken from the first sequence when no score
    is known)."""
    if not seqs:
        return None, None
    chosen = seqs[best if best is not None else 0]["messages"]
    return _last(chosen, "user"), _last(chosen, "assistant")


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def page_data(
    found: Collection,
    title: str,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    budget: Budget | None = None,
    recorded: str | None = None,
) -> dict[str, Any]:
    """Everything the page's script needs, as JSON values; `recorded` is the tokenizer the run
    says it used (`read.recorded_tokenizer`), named when no tokenizer was given."""
    budget = budget or Budget()
    groups = [e.shown or group_data(e, tokenizer, budget) for e in found.entries]
    notes = list(found.notes)
    if tokenizer is None and recorded is not None:
        notes.append(
            f"This run used the tokenizer {recorded!r}: `atropos view FILE --tokenizer"
            f" {recorded}` highlights the trained tokens. Messages and token counts are shown."
        )
    elif tokenizer is None:
        notes.append(
            "Token highlighting needs a tokenizer: run `atropos view FILE --tokenizer NAME`"
            " (the model's tokenizer, or `tiny` for the test one). Messages and token counts"
            " are shown."
        )
    if budget.tokens_omitted:
        notes.append(
            f"{_count(budget.tokens_omitted, 'sequence')} without a token view: a page holds"
            f" about {TOKEN_BUDGET:,} tokens at most (show fewer groups with --limit)."
        )
    if budget.images_omitted:
        notes.append(
            f"{_count(budget.images_omitted, 'image')} not shown: only inline data:image/* or"
            " base64 images are shown (never remote URLs), within the page's image budget."
        )
    if found.unread:
        notes.append(
            f"Showing the first {found.limit:,} groups: {found.unread:,} more were not read"
            " (raise --limit to see more)."
        )
    return {
        "title": title,
        "limit": found.limit,
        "unread": found.unread,
        "tokenizer": tokenizer_name if tokenizer is not None else None,
        "sources": [{"name": s.name, "groups": s.groups, "bad": s.bad} for s in found.sources],
        "bad": found.bad,
        "bad_examples": [
            {"source": b.source, "line": b.line, "reason": b.reason} for b in found.bad_examples
        ],
        "notes": notes,
        "groups": groups,
    }
