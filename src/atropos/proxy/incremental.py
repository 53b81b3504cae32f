"""Incremental chat-template rendering for proxy sessions: a continued conversation renders only
the messages its call adds.

A session's `ManagedServer` renders the whole conversation every call (`render_whole`), so an
agent's sixteenth call renders sixteen turns of history again. `IncrementalRender` is the
session's `ManagedServer.renderer` (`inference.managed.ChatRenderer`): when a call's messages
are the previous call's prompt messages `H`, then an assistant message (the answer the agent got
back), then new messages `A`, the text is the previous prompt's text plus what the template
writes after it, found on a *window*:

    head = [H[0]] if it is a system message, else []    (tools go with every render)
    X = render(head + H[-1:], generation prompt)
    Y = render(head + H[-1:] + [assistant] + A, generation prompt unless A ends with one)
    B = render(head, no generation prompt)

Checked before it is used (else the whole conversation is rendered, as before): `Y` starts
with `X` (the template only appends after the prompt), `X` starts with `B`, and the previous
prompt's text ends with `X[len(B):]` (the window renders the last held message as the whole
conversation did). The text is then `previous text + Y[len(X):]`, the same string the full
render gives, and the session's `ManagedServer` tokenizes and classifies it as it does any
prompt (only the added text is tokenized where the tokenizer allows it: `inference.held`).

That *long* window renders twice per call (`X` changes with the last held message). Where the
probe finds it exact, the *short* window renders once: without the last held message,

    G = render(head, generation prompt)                 (cached with B while head and tools stay)
    Y = render(head + [assistant] + A, generation prompt unless A ends with one)

checked as above with `G` for `X` (`Y` starts with `G`, `G` with `B`, the previous prompt's
text ends with `G[len(B):]`, the generation prompt), giving `previous text + Y[len(G):]`. It
differs from the full render for a template that writes an answer according to the message
before it (after a tool result, say), which its checks cannot see; the probe can, so such a
template gets the long window (`window_kind`), and a call whose short window fails its checks
takes the long one, as the probe ran it.

The one-render window's `Y` is mostly filled in rather than rendered: a call's new messages
have the same shape call after call (roles and keys; the head and tools stay), and where one
traced render proved the template uses their strings only as text, tests or strips, the shape's
skeleton is filled with the call's strings (`atropos.proxy.skeleton`; `_after`). Skeletons are
kept in the template's `SkeletonBook`, by head and tools: every session with the same system
message and tools uses the one proved first, by any of them.

A template that rewrites earlier turns when later ones come (Qwen3 drops the reasoning of
assistant turns before the last user message; a template that counts messages) would pass the
window's checks and still differ from the full render. So each template is probed once
(`template_is_stable`): conversations with a system message and without, tools and none, a
reasoning block, tool calls and grouped tool results are rendered both ways at every cut, and
a window is used only if every cut gives the full render's text (and the direct Jinja render
below gives `apply_chat_template`'s): the long one first, then the short one. Calls with
`chat_template_kwargs`, a reasoning plan's template kwargs, or a `skip_reasoning` render are
always rendered whole, by `render_whole`.

The windows are rendered with the tokenizer's compiled Jinja template directly (transformers'
own compiled template, with the special tokens as variables), which skips
`apply_chat_template`'s per-message normalisation; the probe checks it agrees. A session whose
call has no template kwargs renders a whole conversation (its first call, an edited history)
the same way: the messages the dialects build are plain dicts (strings, lists, None; no
reasoning fields), for which `apply_chat_template`'s normalisation changes nothing.

Measured (benchmarks/proxy_overhead.py, RESULTS.md): the render of a 16-call conversation cost
~0.23 ms in `apply_chat_template` at its last call; the long window costs two short renders,
the short one one (the head's are kept while the head and tools stay).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from atropos.proxy.skeleton import Message, Skeleton, per_template, shape_of, traced_template

__all__ = ["IncrementalRender", "template_is_stable", "window_kind"]

Render = Callable[[list[Message], "list[dict[str, Any]] | None", dict[str, Any]], str]

_SHAPES, _BRANCHES = 8, 4  # skeletons kept per head and tools: shapes, branches of one shape
_HEADS = 64  # heads (system message and tools) whose skeletons a template's book keeps
_KEPT = 4  # previous prompts remembered per session (an agent and a few sub-agents); a prompt
# a later call continued is dropped then (its text is the start of the later one's)
_STABLE: weakref.WeakKeyDictionary[Any, tuple[str, Any]] = weakref.WeakKeyDictionary()
_BOOKS: weakref.WeakKeyDictionary[Any, tuple[str, Any]] = weakref.WeakKeyDictionary()
#: shape -> the skeletons tried for it with one head and tools: one per branch its tests took,
#: None for a try refused (the template used the strings in a way no skeleton stands for)
Shapes = dict[tuple[Any, ...], list[Skeleton | None]]
_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}


def _compiled(tokenizer: Any) -> Any:
    """The tokenizer's chat template, compiled (transformers caches it by its source)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(tokenizer.chat_template)


def _direct(tokenizer: Any, template: Any) -> Callable[..., str]:
    """Render `messages` with the compiled template as `apply_chat_template` does for plain
    dict messages and tools (the special tokens are the template's variables).

    The context is built as `Template.render` builds it, less its per-call costs: the
    template's globals (a `ChainMap` of the template's and the environment's, walked key by
    key on every render) are flattened once, and the root render function is called directly
    (about two thirds of `Template.render`'s time for a window of one to three messages). A
    template error propagates as raised (`Template.render` only rewrites its traceback)."""
    tokens = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
    flat = dict(template.globals)
    env, root, blocks, name = (
        template.environment,
        template.root_render_func,
        template.blocks,
        template.name,
    )
    context = env.context_class
    if env.is_async:  # never so for transformers' templates; the plain render handles it

        def plain(messages: list[Message], tools: Any, generation: bool) -> str:
            return str(
                template.render(
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=generation,
                    **tokens,
                )
            )

        return plain

    def render(messages: list[Message], tools: Any, generation: bool) -> str:
        values = {**flat, "documents": None, **tokens}
        values["messages"], values["tools"] = messages, tools
        values["add_generation_prompt"] = generation
        return str(env.concat(root(context(env, values, name, blocks, globals=flat))))

    return render


def _probes() -> list[tuple[list[Message], Any]]:
    """Conversations (and tools) the probe renders at every cut."""
    think = "<think>\nadd them\n</think>\n\nIt is 5."
    turns: list[Message] = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": think, "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": think},
        {"role": "user", "content": "Use the tool twice."},
        {"role": "assistant", "content": "", "tool_calls": [_CALL, _CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "Done: 5."},
        {"role": "user", "content": "Thanks."},
    ]
    system: list[Message] = [{"role": "system", "content": "Be brief."}]
    return [(system + turns, None), (turns, None), (system + turns, [_TOOL]), (turns, [_TOOL])]


def template_is_stable(tokenizer: Any) -> bool:
    """Whether a window gives the full render's text for this tokenizer's template (probed
    once per tokenizer and template: see the module docstring)."""
    return window_kind(tokenizer) is not None


def window_kind(tokenizer: Any) -> str | None:
    """The window the probe found to give the full render's text for this tokenizer's
    template: "short" (one render per call), "long" (two), or None (render whole)."""
    kind: str | None = per_template(_STABLE, tokenizer, lambda source: _probe(tokenizer))
    return kind


def _probe(tokenizer: Any) -> str | None:
    """The long window is required (every cut gives the full render's text); the short one
    is used where it too gives it at every cut and applied at some (it falls back to the
    long one where its checks fail, as the probe ran it)."""
    try:
        direct = _direct(tokenizer, _compiled(tokenizer))
    except Exception:  # no template, or one this Jinja cannot compile
        return None

    def whole(messages: list[Message], tools: Any, kw: dict[str, Any]) -> str:
        generation = messages[-1]["role"] != "assistant"
        return str(
            tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation
            )
        )

    cases = []
    for conversation, tools in _probes():
        try:
            texts = [
                whole(conversation[:end], tools, {}) for end in range(1, len(conversation) + 1)
            ]
        except Exception:  # the template refuses this shape (no system role, no tools): skip it
            continue
        cases.append((conversation, tools, texts))
    if not cases or not _agrees(cases, IncrementalRender(whole, direct)):
        return None
    short = IncrementalRender(whole, direct, short=True)
    return "short" if _agrees(cases, short) and short.counts["short"] else "long"


def _agrees(cases: list[tuple[list[Message], Any, list[str]]], window: IncrementalRender) -> bool:
    """Whether `window`, continuing each probe conversation at every cut, gives the full
    render's text wherever it applies (and the direct render gives it everywhere)."""
    direct = window._direct
    assert direct is not None
    for conversation, tools, texts in cases:
        window._prompts, window._head = [], None
        for end, text in enumerate(texts, start=1):
            messages = conversation[:end]
            if direct(messages, tools, messages[-1]["role"] != "assistant") != text:
                return False
            found = window.extend(messages, tools)
            if found is not None and found != text:
                return False
            window.remember(messages, tools, text)
    return True


class IncrementalRender:
    """One session's renders: the window when it applies, else the whole conversation.

    Args:
        whole: renders a whole conversation (`ManagedServer.render_whole(msgs, tools, kw)`).
        direct: renders a short window (`_direct`), or None to always render whole.
        short: try the one-render window first (`window_kind` found it gives the full text).
        traced: the template's traced render (`_direct` of `skeleton.traced_template`): the
            one-render window's text comes from a skeleton of the call's shape where one was
            proved; None: it is rendered every call.
        book: where the skeletons are kept, shared by the sessions of one tokenizer and
            template (`SkeletonBook`); None: this session's own.
    """

    def __init__(
        self,
        whole: Render,
        direct: Callable[..., str] | None,
        *,
        short: bool = False,
        traced: Callable[..., str] | None = None,
        book: SkeletonBook | None = None,
    ) -> None:
        self._whole = whole
        self._direct = direct
        self._short = short
        self._traced = traced
        self._book = book if book is not None else SkeletonBook()
        self._shapes: Shapes = {}  # the book's page for the head and tools (`_opening`)
        self._prompts: list[tuple[list[Message], Any, str]] = []  # most recent last
        #: (system message or None, tools, head's text alone, head's text + generation prompt)
        self._head: tuple[Message | None, Any, str, str] | None = None
        self._continued: tuple[list[Message], Any, str] | None = None  # by the last `extend`
        #: How many renders used a window (of them, how many the one-render window, and of
        #: those how many a skeleton filled), how many rendered the whole conversation, and
        #: how many skeletons this session proved (into the book).
        self.counts = {"window": 0, "short": 0, "skeleton": 0, "whole": 0, "built": 0}

    @classmethod
    def attach(cls, managed: Any) -> IncrementalRender | None:
        """Render `managed`'s (a `ManagedServer`) chat prompts through a new instance (its
        `renderer`); None (nothing changed) when its template failed the probe or it has no
        `render_whole`."""
        whole = getattr(managed, "render_whole", None)
        tokenizer = getattr(managed, "tokenizer", None)
        if whole is None or tokenizer is None:
            return None
        kind = window_kind(tokenizer)
        if kind is None:
            return None
        template = _compiled(tokenizer)
        traced = traced_template(tokenizer, template) if kind == "short" else None
        window = cls(
            whole,
            _direct(tokenizer, template),
            short=kind == "short",
            traced=None if traced is None else _direct(tokenizer, traced),
            book=per_template(_BOOKS, tokenizer, lambda source: SkeletonBook()),
        )
        plan = getattr(managed, "reasoning", None)
        window.plain = not getattr(plan, "kwargs", None)
        managed.renderer = window
        return window

    plain = True  # the session's reasoning plan adds no template kwargs

    def render(self, msgs: list[Message], tools: Any, kw: dict[str, Any]) -> str:
        """`ManagedServer.render_whole`'s text for `msgs`: by the window when it applies."""
        text = None
        plain = self.plain and "chat_template_kwargs" not in kw and not kw.get("skip_reasoning")
        if plain:
            text = self.extend(msgs, tools)
        if text is not None:
            self.counts["window"] += 1
        else:
            self.counts["whole"] += 1
            direct = self._direct
            if plain and direct is not None:  # the probed direct render: no kwargs to apply
                text = direct(msgs, tools or None, msgs[-1].get("role") != "assistant")
            else:
                text = self._whole(msgs, tools, kw)
        self.remember(msgs, tools, text)
        return text

    def remember(self, msgs: list[Message], tools: Any, text: str) -> None:
        """Keep a prompt (not a copy of its messages) that a later call may continue; the
        prompt this one continued (`extend`) is dropped, its text being this one's start."""
        continued, self._continued = self._continued, None
        if msgs[-1].get("role") == "assistant":
            return  # a prefilled answer: its continuation is not a new call's prompt
        kept = [p for p in self._prompts if p[0] is not msgs and p is not continued]
        kept.append((msgs, tools, text))
        self._prompts = kept[-_KEPT:]

    def extend(self, msgs: list[Message], tools: Any) -> str | None:
        """The text of `msgs` by the window over a remembered prompt they continue, or None."""
        if self._direct is None:
            return None
        for entry in reversed(self._prompts):
            held, held_tools, text = entry
            cut = len(held)
            if (
                len(msgs) > cut + 1
                and msgs[cut].get("role") == "assistant"
                and msgs[:cut] == held
                and held_tools == tools
            ):
                self._continued = entry  # whether the window or the whole render gives it
                head = msgs[:1] if msgs[0].get("role") == "system" else []
                if self._short:
                    found = self._short_window(msgs, head, cut, tools, text)
                    if found is not None:
                        self.counts["short"] += 1
                        return found
                return self._window(msgs, head, cut, tools, text)
        return None

    def _short_window(
        self, msgs: list[Message], head: list[Message], cut: int, tools: Any, text: str
    ) -> str | None:
        """One render, of the head and what the call adds (its assistant message first):
        `Y = render(head + msgs[cut:])` must start with the head's text plus the generation
        prompt `X` (cached), and the previous prompt's text end with that generation prompt;
        the text is then `text + Y[len(X):]`."""
        if cut <= len(head):
            return None  # the previous prompt was the head alone
        generation = msgs[-1].get("role") != "assistant"
        try:
            opening, prompt = self._opening(head, tools)
            if not text.endswith(prompt[len(opening) :]):
                return None
            added = self._after(head, msgs[cut:], tools, generation, prompt)
        except Exception:  # a shape the template refuses: the long window, or whole
            return None
        return None if added is None else text + added

    def _after(
        self, head: list[Message], new: list[Message], tools: Any, generation: bool, prompt: str
    ) -> str | None:
        """What the render of `head + new` writes after `prompt` (the head's text and the
        generation prompt), or None when it does not start with it: filled in from a skeleton
        of the shape of `new` when one was proved for it and its recorded tests answer the same
        (`skeleton.Skeleton`, which starts after `prompt`), else by the template (and a
        skeleton is then tried for the shape, up to a few per shape)."""
        direct = self._direct
        assert direct is not None
        shape = None if self._traced is None else shape_of(new, generation)
        known = None if shape is None else self._shapes.get(shape)
        if known is not None:
            for skeleton in known:
                added = None if skeleton is None else skeleton.fill(new)
                if added is not None:
                    self.counts["skeleton"] += 1
                    return added
        after = direct(head + new, tools, generation)
        if not after.startswith(prompt):
            return None
        if shape is not None and (known is not None or len(self._shapes) < _SHAPES):
            known = self._shapes.setdefault(shape, [])
            if len(known) < _BRANCHES:  # else enough branches tried
                assert self._traced is not None
                found = Skeleton.build(
                    self._traced, head, new, tools, generation, after, skip=len(prompt)
                )
                # a shape refused at its first try is not tried again with this head and tools
                known.extend([found] if found is not None or known else [None] * _BRANCHES)
                self.counts["built"] += found is not None
        return after[len(prompt) :]

    def _window(
        self, msgs: list[Message], head: list[Message], cut: int, tools: Any, text: str
    ) -> str | None:
        if cut <= len(head) + 1:
            return None  # the window would be the whole prompt: nothing to save
        base = head + msgs[cut - 1 : cut]
        direct = self._direct
        assert direct is not None
        try:
            before = direct(base, tools, True)
            after = direct(base + msgs[cut:], tools, msgs[-1].get("role") != "assistant")
            opening = self._opening(head, tools)[0]
        except Exception:  # the window is a shape the template refuses: render it whole
            return None
        if not (after.startswith(before) and before.startswith(opening)):
            return None
        if not text.endswith(before[len(opening) :]):
            return None
        return text + after[len(before) :]

    def _opening(self, head: list[Message], tools: Any) -> tuple[str, str]:
        """The template's text for the head alone, without and with the generation prompt
        (cached while head and tools stay; the second checked to start with the first)."""
        first = head[0] if head else None
        held = self._head
        if held is not None and held[0] == first and held[1] == tools:
            return held[2], held[3]
        assert self._direct is not None
        opening = self._direct(head, tools, False)
        prompt = self._direct(head, tools, True)
        if not prompt.startswith(opening):
            raise ValueError("the generation prompt does not follow the head's text")
        self._head = (first, tools, opening, prompt)
        self._shapes = self._book.page(first, tools)  # those proved with this head and tools
        return opening, prompt


class SkeletonBook:
    """The skeletons proved for one template, by head (system message) and tools, shared by
    every session of the template: a thousand agents with one system prompt and tool list
    build each shape's skeleton once, not once each.

    A skeleton depends on nothing but the template, the head, the tools and the shape (its
    build checks it byte for byte against the real render), so sessions share a page when their
    head and tools are equal to the last type, key order and value. The key is their `repr`,
    taken only for JSON's types (what the dialects parse; `repr` tells `1` from `1.0` and
    `True`, a tuple from a list, and keeps key order, which a template iterating a dict
    shows); a head or tools holding anything else get a page of their own, not shared. The
    least recently used of more than `_HEADS` heads is dropped."""

    def __init__(self) -> None:
        self._pages: OrderedDict[str, Shapes] = OrderedDict()

    def page(self, head: Message | None, tools: Any) -> Shapes:
        """The shapes proved with `head` and `tools` (a new page at their first use)."""
        if not (_plain(head) and _plain(tools)):
            return {}
        key = repr((head, tools))
        pages = self._pages
        found = pages.get(key)
        if found is None:
            found = pages[key] = {}
            if len(pages) > _HEADS:
                pages.popitem(last=False)
        else:
            pages.move_to_end(key)
        return found


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` holds only JSON's types (dict keys strings), to a depth of 32."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if depth > 32:
        return False
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False
