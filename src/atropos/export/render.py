"""A sequence of a group as a chat conversation, and where its prompt ends.

From the group's `messages` when it has them (one conversation per sequence); otherwise the
tokens are decoded with a tokenizer and the prompt is what comes before the first trained
position of the mask, the same boundary the trainer uses. Upstream (atroposlib 0.4.0) split
every decoded text at the group's common *character* prefix, which can end mid-token, breaks
when the prefix recurs in a completion, crashes on an empty prefix and empties the completion
of a group of one; the mask has none of these failure modes.

>>> split_by_mask([5, 6, 7, 8], [-100, -100, 7, 8])
([5, 6], [7, 8])
>>> split_by_mask([5, 6], [5, 6])  # all trained: an empty prompt
([], [5, 6])
>>> parse_transcript("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello<|im_end|>\\n")
[({'role': 'user', 'content': 'Hi'}, 29), ({'role': 'assistant', 'content': 'Hello'}, 67)]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from atropos.export.source import MASKED, Group

Message = dict[str, Any]

# One chat-template family each: (marker that identifies it, a block: role, content, end).
_TEMPLATES = [
    (
        "<|im_start|>",  # ChatML (Qwen, Hermes, the tiny tokenizer)
        re.compile(
            r"<\|im_start\|>([^\n<]*)\n(.*?)(?:<\|im_end\|>|(?=<\|im_start\|>)|\Z)", re.DOTALL
        ),
    ),
    (
        "<|start_header_id|>",  # Llama 3
        re.compile(
            r"<\|start_header_id\|>([^<]*)<\|end_header_id\|>\n\n(.*?)"
            r"(?:<\|eot_id\|>|(?=<\|start_header_id\|>)|\Z)",
            re.DOTALL,
        ),
    ),
]


@dataclass
class Conversation:
    """One sequence as chat messages; `prompt_len` messages are the prompt, when the masks
    fixed it (decoded from tokens), else None (a pair's shared prompt is then found from the
    messages themselves, see `shared_prompt`)."""

    messages: list[Message]
    prompt_len: int | None = None


def first_trained(mask: Sequence[int]) -> int | None:
    """The first position the trainer learns from, or None when no position is trained.

    >>> first_trained([-100, -100, 9]), first_trained([-100]), first_trained([3])
    (2, None, 0)
    """
    return next((j for j, m in enumerate(mask) if m != MASKED), None)


def split_by_mask(tokens: Sequence[int], mask: Sequence[int]) -> tuple[list[int], list[int]]:
    """`(prompt, completion)` token ids, cut at the first trained position.

    Raises:
        ValueError: when no position is trained (there is no completion).

    A prompt token that recurs in the completion (which broke upstream's split) changes nothing:

    >>> split_by_mask([1, 2, 1, 2], [-100, -100, 1, 2])
    ([1, 2], [1, 2])
    """
    cut = first_trained(mask)
    if cut is None:
        raise ValueError("no trained position: the sequence has no completion")
    return list(tokens[:cut]), list(tokens[cut:])


def parse_transcript(text: str, specials: Sequence[str] = ()) -> list[tuple[Message, int]] | None:
    """Chat messages in a decoded ChatML or Llama 3 transcript, each with the offset where
    its block ends; None when the text has neither template's markers.

    `specials` (the tokenizer's special tokens, e.g. an end-of-text token) are removed from
    the contents.

    >>> parse_transcript("plain text") is None
    True
    >>> text = "<|start_header_id|>user<|end_header_id|>\\n\\n2+2?<|eot_id|>"
    >>> parse_transcript(text + "<|start_header_id|>assistant<|end_header_id|>\\n\\n4")
    [({'role': 'user', 'content': '2+2?'}, 56), ({'role': 'assistant', 'content': '4'}, 104)]
    """
    for marker, block in _TEMPLATES:
        if marker in text:
            out = []
            for m in block.finditer(text):
                content = m.group(2)
                for special in specials:
                    content = content.replace(special, "")
                out.append(({"role": m.group(1).strip(), "content": content}, m.end()))
            return out
    return None


def from_tokens(tokens: Sequence[int], mask: Sequence[int], tokenizer: Any) -> Conversation:
    """Decode one sequence into messages; the prompt is the messages that end before the
    first trained position (a message the cut falls inside, e.g. a prefilled answer, is part
    of the completion).

    Text with no known template markers becomes a user message (the prompt, special tokens
    skipped; none when the prompt is empty) and an assistant message (the completion).

    Raises:
        ValueError: when no position is trained.
    """
    prompt_ids, completion_ids = split_by_mask(tokens, mask)
    full = tokenizer.decode(list(tokens))
    specials = list(getattr(tokenizer, "all_special_tokens", None) or ())
    blocks = parse_transcript(full, specials)
    cut = len(tokenizer.decode(prompt_ids)) if prompt_ids else 0
    if blocks and any(end > cut for _, end in blocks):
        prompt_len = sum(1 for _, end in blocks if end <= cut)
        return Conversation([message for message, _ in blocks], prompt_len)
    prompt = tokenizer.decode(prompt_ids, skip_special_tokens=True) if prompt_ids else ""
    completion = tokenizer.decode(completion_ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": prompt}] if prompt else []
    messages.append({"role": "assistant", "content": completion})
    return Conversation(messages, len(messages) - 1)


def valid_messages(value: Any) -> list[Message] | None:
    """`value` if it is a list of messages (dicts with a string `role` and a `content`).

    >>> valid_messages([{"role": "user", "content": "hi"}])
    [{'role': 'user', 'content': 'hi'}]
    >>> valid_messages([{"content": "hi"}]) is None, valid_messages("hi") is None
    (True, True)
    """
    if not isinstance(value, list) or not value:
        return None
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m):
            return None
    return value


def _has_answer(messages: list[Message]) -> bool:
    return any(m["role"] == "assistant" for m in messages)


def conversation(group: Group, i: int, tokenizer: Callable[[], Any] | None) -> Conversation | str:
    """Sequence `i` of `group` as a conversation, or the reason it cannot be one.

    In order: the group's messages for it, when they hold an assistant message; else its
    tokens decoded with `tokenizer()` (called only then, so a tokenizer is loaded only when
    some group needs one); else a single message holding a whole decoded transcript (what
    `--env.include_messages` writes for groups without messages) parsed back into messages.

    Reasons: `no_messages` (no messages and no tokenizer), `nothing_trained` (the mask
    trains no position), `undecodable` (the tokenizer failed on the tokens),
    `no_assistant_message` (messages with no answer, no tokenizer).

    >>> chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    >>> g = Group(tokens=[[1, 2]], masks=[[-100, 2]], scores=[1.0], messages=[chat])
    >>> conversation(g, 0, None).messages[-1]
    {'role': 'assistant', 'content': 'b'}
    >>> conversation(Group(tokens=[[1]], masks=[[1]], scores=[1.0]), 0, None)
    'no_messages'
    """
    rows = group.messages or []
    messages = valid_messages(rows[i]) if i < len(rows) else None
    if messages is not None and _has_answer(messages):
        return Conversation(messages)
    if tokenizer is not None:
        if first_trained(group.masks[i]) is None:
            return "nothing_trained"
        tok = tokenizer()  # a tokenizer that cannot load stops the export (not per sequence)
        try:
            return from_tokens(group.tokens[i], group.masks[i], tok)
        except Exception:  # ids the tokenizer rejects (negative, huge): this sequence only
            return "undecodable"
    if messages is None:
        return "no_messages"
    if len(messages) == 1 and isinstance(messages[0]["content"], str):
        blocks = parse_transcript(messages[0]["content"])
        parsed = [m for m, _ in blocks or []]
        if _has_answer(parsed):
            return Conversation(parsed)
    return "no_assistant_message"


def _prompt_end(messages: list[Message], shared: int) -> int | None:
    """Where the prompt of `messages` ends given `shared` leading messages in common with
    the other side of a pair: at the first answer from there on (or at the last answer)."""
    answers = [j for j, m in enumerate(messages) if m["role"] == "assistant"]
    if not answers:
        return None
    start = min(shared, answers[-1])
    return next(j for j in answers if j >= start)


def shared_prompt(a: Conversation, b: Conversation) -> int | None:
    """How many leading messages `a` and `b` share as their prompt, or None when their
    prompts differ (a DPO pair needs one prompt).

    With mask-fixed prompts these are compared. Otherwise the prompt ends where both
    conversations reach an answer after their common part, so a conversation history or
    few-shot examples stay in the prompt, and identical answers still split before them.

    >>> u = {"role": "user", "content": "q"}
    >>> def ans(text): return {"role": "assistant", "content": text}
    >>> shared_prompt(Conversation([u, ans("x")]), Conversation([u, ans("y")]))
    1
    >>> shared_prompt(Conversation([u, ans("x")]), Conversation([u, ans("x")]))
    1
    >>> history = [u, ans("h"), {"role": "user", "content": "q2"}]
    >>> shared_prompt(Conversation([*history, ans("x")]), Conversation([*history, ans("y")]))
    3
    >>> other = {"role": "user", "content": "other"}
    >>> shared_prompt(Conversation([u, ans("x")]), Conversation([other, ans("y")])) is None
    True
    """
    if a.prompt_len is not None and b.prompt_len is not None:
        same = a.messages[: a.prompt_len] == b.messages[: b.prompt_len]
        return a.prompt_len if same else None
    common = 0
    for x, y in zip(a.messages, b.messages, strict=False):
        if x != y:
            break
        common += 1
    ends = {_prompt_end(a.messages, common), _prompt_end(b.messages, common)}
    if len(ends) != 1:
        return None
    [end] = ends
    if end is None or a.messages[:end] != b.messages[:end]:
        return None
    return end
