"""`PromptCache`: the rendered text and token ids of a new conversation's prompt, per tokenizer.

A dataset environment starts conversations from the same prompts again and again (every pass
over its items, every retry), and `ManagedServer` rendered the chat template (about 50 us for a
short prompt through transformers) and tokenized the result (about 40 us) for each. This cache
keeps the last `SIZE` prompts' text and ids for each tokenizer, least recently used out.

A prompt is cached only when its render is a function of the key: every message has only a
`role` and a string `content` (tool calls, names and multimodal content are rendered each time),
no tools, template kwargs (the reasoning settings and the call's own `chat_template_kwargs`)
with hashable values, and a template that does not read the clock (transformers gives templates
`strftime_now`, which some use to print today's date). The key holds the template's source, so a
tokenizer whose template is replaced gets fresh renders. Callers get a copy of the cached ids.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Hashable
from typing import Any, ClassVar

_PLAIN = frozenset({"role", "content"})


class PromptCache:
    """The text and ids of recent prompts rendered with one tokenizer (see the module)."""

    SIZE = 4096
    """Prompts kept per tokenizer."""

    _caches: ClassVar[weakref.WeakKeyDictionary[Any, PromptCache]] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[str, list[int]]] = {}

    @classmethod
    def of(cls, tokenizer: Any) -> PromptCache | None:
        """The cache of `tokenizer` (None: it cannot be weakly referenced, so no caching)."""
        try:
            found = cls._caches.get(tokenizer)
            if found is None:
                found = cls._caches[tokenizer] = cls()
        except TypeError:
            return None
        return found

    @staticmethod
    def key(tokenizer: Any, msgs: list[dict[str, Any]], extra: dict[str, Any]) -> Hashable | None:
        """The key of this render, or None when it may not be cached."""
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or "tools" in extra or _reads_clock(template):
            return None
        parts: list[Any] = [template]
        for m in msgs:
            content = m.get("content")
            if type(content) is not str or not _PLAIN.issuperset(m):
                return None
            parts.append(m.get("role"))
            parts.append(content)
        if extra:
            parts.append(tuple(sorted(extra.items())))
        key = tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def get(self, key: Hashable) -> tuple[str, list[int]] | None:
        """The cached text and a copy of the ids (None: not cached)."""
        entries = self._entries
        found = entries.pop(key, None)  # popped and put back: the most recently used is last
        if found is None:
            return None
        entries[key] = found
        return found[0], list(found[1])

    def put(self, key: Hashable, text: str, ids: list[int]) -> None:
        """Keep a copy of `ids` for `key`, dropping the least recently used past `SIZE`."""
        entries = self._entries
        entries[key] = (text, list(ids))
        if len(entries) > self.SIZE:
            try:
                del entries[next(iter(entries))]
            except (RuntimeError, KeyError, StopIteration):  # another thread may be here too
                pass


@functools.lru_cache(maxsize=64)
def _reads_clock(template: str) -> bool:
    """Whether a chat template may print the date (`strftime_now`): searched once per template
    (a template is thousands of characters; the lookup hashes a string that keeps its hash)."""
    return "strftime_now" in template
