"""Chat-template tokenization for the trainer: `tokenize_for_trainer` and its helpers.

atroposlib 0.4.0's `tokenize_for_trainer` semantics, fixed for transformers 5 (where
`apply_chat_template(tokenize=True)` returns a `BatchEncoding`) and for end-of-turn tokens other
than eos. Its tokens are re-derived from text, so results say `token_source: "retokenized"`;
`ManagedServer` is the token-exact path.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

#: Roles whose turns are trained when `train_on_all_assistant_turns` is set (upstream's list).
UNMASKED_ROLES = ("assistant", "agent")

_PROBE = "atroposendofturnprobe"
_EOT_CACHE: weakref.WeakKeyDictionary[Any, tuple[int, ...]] = weakref.WeakKeyDictionary()


class TrainerTokens(TypedDict):
    """What `tokenize_for_trainer` returns."""

    tokens: list[int]
    masks: list[int]
    token_source: Literal["retokenized"]
    messages: NotRequired[list[Any]]


def as_token_ids(value: Any) -> list[int]:
    """Normalize what `apply_chat_template(tokenize=True)` or `encode` returned to a list of ids.

    Accepts a list of ints, a batch of one such list, a mapping with `input_ids` (transformers
    5's `BatchEncoding`), or anything with `tolist()` (tensors, arrays).

    Raises:
        TypeError: the value holds no token ids, or holds a batch of several sequences.

    >>> as_token_ids({"input_ids": [1, 2], "attention_mask": [1, 1]})
    [1, 2]
    >>> as_token_ids([[5, 6]])
    [5, 6]
    """
    if isinstance(value, Mapping):
        if "input_ids" not in value:
            raise TypeError(f"expected a mapping with 'input_ids', got keys {sorted(value)}")
        value = value["input_ids"]
    if hasattr(value, "tolist") and not isinstance(value, list):
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise TypeError(f"expected token ids, got {type(value).__name__}")
    if value and not isinstance(value[0], int):
        if len(value) != 1:
            raise TypeError(f"expected one sequence of token ids, got a batch of {len(value)}")
        return as_token_ids(value[0])
    ids = list(value)
    if not all(isinstance(i, int) for i in ids):
        raise TypeError("expected token ids to be ints")
    return ids


def template_ids(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of `messages` rendered with the tokenizer's chat template.

    Works whether `apply_chat_template(tokenize=True)` returns a list or a `BatchEncoding`.
    """
    result = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
    return as_token_ids(result)


def special_ids(tokenizer: Any) -> set[int]:
    """Ids the tokenizer calls special, plus eos (empty for tokenizers that expose neither)."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", None) or ()}
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return ids


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids the chat template appends after an assistant message's content.

    Found by rendering a probe conversation, e.g. `[<|im_end|>, "\\n"]` for ChatML templates.
    Empty when the template appends nothing that contains a special token, or can't be probed.
    """
    try:
        cached = _EOT_CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: no caching
        cached = None
    if cached is not None:
        return list(cached)
    ids: list[int] = []
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
            tokenize=False,
        )
        if isinstance(text, str) and _PROBE in text:
            tail = text[text.rindex(_PROBE) + len(_PROBE) :]
            ids = as_token_ids(tokenizer.encode(tail, add_special_tokens=False)) if tail else []
    except Exception:  # a template that can't render the probe: fall back to eos alone
        ids = []
    if not set(ids) & special_ids(tokenizer):
        ids = []
    try:
        _EOT_CACHE[tokenizer] = tuple(ids)
    except TypeError:
        pass
    return ids


def trailing_end_of_turn(tokens: Sequence[int], tokenizer: Any) -> int:
    """How many trailing tokens of `tokens` are end-of-turn tokens (template suffix and/or eos).

    Matches the longest head of `end_of_turn_ids` that ends `tokens` and contains a special
    token (so `<|im_end|>` alone and `<|im_end|>\\n` both count), then one eos before it.
    """
    suffix = end_of_turn_ids(tokenizer)
    special = special_ids(tokenizer)
    n = 0
    for k in range(min(len(suffix), len(tokens)), 0, -1):
        head = suffix[:k]
        if list(tokens[-k:]) == head and set(head) & special:
            n = k
            break
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and len(tokens) > n and tokens[len(tokens) - n - 1] == eos:
        n += 1
    return n


def _boundary(
    tokenizer: Any,
    tokens: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    template_kwargs: Mapping[str, Any],
) -> int:
    """Where the turn after `messages` starts in `tokens`.

    Upstream's rule (the template of `messages` plus the generation prompt), checked: when that
    is not a prefix of `tokens` (the next turn is not the assistant's, say a tool's), the
    template of `messages` alone, else the longest common prefix.
    """
    if not messages:
        return 0  # templates refuse an empty conversation
    common = 0
    for add_generation_prompt in (True, False):
        head = template_ids(
            tokenizer, messages, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        if list(tokens[: len(head)]) == head:
            return len(head)
        common = max(common, _common_prefix(head, tokens))
    return common


def _as_sampled(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tokens: list[int],
    template_kwargs: Mapping[str, Any],
) -> tuple[int, list[int]] | None:
    """The last assistant turn as it was sampled, when the template's switches change only the
    generation prompt (Qwen3's `enable_thinking=False` adds an empty think block there, not to a
    rendered history): the prompt with its generation prompt, then the reply and the end of
    turn; (where the reply starts, the ids). None when the full render already extends the
    prompt (the usual path is exact) or the last turn is not the assistant's."""
    if len(messages) < 2 or messages[-1].get("role") not in UNMASKED_ROLES:
        return None
    head = template_ids(tokenizer, messages[:-1], add_generation_prompt=True, **template_kwargs)
    if tokens[: len(head)] == head:
        return None
    reply = str(messages[-1].get("content") or "")
    body = as_token_ids(tokenizer.encode(reply, add_special_tokens=False))
    return len(head), head + body + end_of_turn_ids(tokenizer)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def tokenize_for_trainer(
    tokenizer: Any,
    chat: Sequence[Mapping[str, Any]],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
    template_kwargs: Mapping[str, Any] | None = None,
) -> TrainerTokens:
    """Tokenize a finished chat with its chat template and mask what the trainer must not learn.

    Upstream semantics: by default only the last message is trained (everything after the
    template prefix of `chat[:-1]` plus generation prompt, including its end-of-turn tokens);
    with `train_on_all_assistant_turns`, every `assistant`/`agent` turn is. Boundaries are
    checked against the tokens: when the generation prompt does not open the next turn (a last
    message from a tool), the turn starts after the template of the earlier messages. Like
    upstream, this needs a prefix-stable template (a date-dependent system prompt or stripped
    think blocks break it).

    Args:
        tokenizer: a transformers tokenizer (any object with `apply_chat_template`, `encode`).
        chat: the messages, `{"role", "content", ...}` mappings.
        include_messages: also return `chat` under `messages`.
        train_on_all_assistant_turns: unmask every assistant turn, not only the last message.
        finish_reason: `"length"` drops a trailing end-of-turn the template appended (eos,
            `<|im_end|>` and the newline after it), so truncated generations are not taught to
            stop.
        template_kwargs: chat-template kwargs the generation rendered with (the env's reasoning
            switches, `ManagedServer.reasoning.kwargs`), so the tokens match what was sampled.

    Returns:
        `{"tokens", "masks", "token_source": "retokenized"}` (+ `"messages"`), where masks hold
        -100 on untrained positions and the token id elsewhere.

    Example:
        >>> from atropos.testing.fake_engine import load_tokenizer
        >>> tok = load_tokenizer()
        >>> chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
        >>> out = tokenize_for_trainer(tok, chat)
        >>> tok.decode([t for t in out["masks"] if t != -100])
        '4<|im_end|>\\n'
        >>> out = tokenize_for_trainer(tok, chat, finish_reason="length")
        >>> tok.decode([t for t in out["masks"] if t != -100])
        '4'

    Long because the mask's boundaries are found and checked in sequence against the same tokens.
    """
    messages = list(chat)
    extra = dict(template_kwargs or {})
    tokens = template_ids(tokenizer, messages, **extra)
    last_only = not train_on_all_assistant_turns
    sampled = _as_sampled(tokenizer, messages, tokens, extra) if extra and last_only else None
    if sampled is not None:
        start, tokens = sampled
        masks = [-100] * start + tokens[start:]
    elif train_on_all_assistant_turns:
        masks = [-100] * len(tokens)
        for i, message in enumerate(messages):
            if message.get("role") in UNMASKED_ROLES:
                start = _boundary(tokenizer, tokens, messages[:i], extra)
                end = _boundary(tokenizer, tokens, messages[: i + 1], extra)
                masks[start:end] = tokens[start:end]
    else:
        start = _boundary(tokenizer, tokens, messages[:-1], extra)
        masks = [-100] * start + tokens[start:]
    if finish_reason == "length":
        drop = trailing_end_of_turn(tokens, tokenizer)
        if drop:
            tokens, masks = tokens[:-drop], masks[:-drop]
    out: TrainerTokens = {"tokens": tokens, "masks": masks, "token_source": "retokenized"}
    if include_messages:
        out["messages"] = messages
    return out
