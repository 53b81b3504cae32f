"""The incremental render of proxy sessions (`atropos.proxy.incremental`): a continued
conversation is rendered by a window over the previous prompt and gives the ids the full render
gives; an edited conversation falls back to the full render; a template that rewrites earlier
turns is never rendered by the window."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from atropos.inference.managed import ManagedServer
from atropos.inference.tokenizer import load_tokenizer
from atropos.proxy.incremental import template_is_stable, window_kind
from atropos.proxy.session import Session
from atropos.proxy.turns import TurnRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'


class Stub:
    """A token server that records the ids it was sent and answers in turn: a tool call, then
    text (deterministic, so two sessions given the same calls get the same answers)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.sent: list[list[int]] = []

    async def tokens_and_logprobs_completion(self, *, input_ids: list[int], n: int = 1, **kw: Any):
        self.sent.append(list(input_ids))
        text = CALL if len(self.sent) % 3 == 1 else f"step {len(self.sent)} done."
        out = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
        return input_ids, [out] * n, [[-0.5] * len(out)] * n, ["stop"] * n


def session(whole: bool = False) -> tuple[Session, Stub]:
    tok = load_tokenizer("tiny")
    stub = Stub(tok)
    managed = ManagedServer(stub, tok)
    s = Session("s", "k", managed=managed, tokenizer=tok)
    if whole:  # the full render every call, as before the window
        managed.renderer = None
        s.template = None
    return s, stub


async def converse(s: Session, edit_at: int | None = None) -> None:
    """An agent: system prompt, tools, tool results and user turns; with `edit_at`, the
    message at that index is edited before the last call (not an extension)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    for turn in range(6):
        if edit_at is not None and turn == 5:
            messages[edit_at] = {**messages[edit_at], "content": "edited"}
        result = await s.complete(TurnRequest(messages=list(messages), tools=TOOLS))
        answer = result.choices[0].message()
        messages.append(answer)
        if answer.get("tool_calls"):
            for call in answer["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "5"})
        else:
            messages.append({"role": "user", "content": f"and then {turn}?"})


def test_a_continued_conversation_gives_the_full_renders_ids() -> None:
    windowed, sent = session()
    whole, expected = session(whole=True)
    asyncio.run(converse(windowed))
    asyncio.run(converse(whole))
    assert windowed.template is not None and windowed.template.counts["window"] >= 4
    assert sent.sent == expected.sent  # every call's ids, as the full render made them
    a, b = windowed.trajectory(), whole.trajectory()
    assert [q.tokens for q in a.sequences] == [q.tokens for q in b.sequences]
    assert [q.masks for q in a.sequences] == [q.masks for q in b.sequences]
    assert a.breaks == b.breaks and len(a.sequences) == 1


def test_an_edited_conversation_falls_back_to_the_full_render() -> None:
    windowed, sent = session()
    whole, expected = session(whole=True)
    asyncio.run(converse(windowed, edit_at=1))
    asyncio.run(converse(whole, edit_at=1))
    assert windowed.template is not None
    assert windowed.template.counts["whole"] >= 2  # the first call and the edited one
    assert sent.sent == expected.sent
    assert windowed.trajectory().breaks == whole.trajectory().breaks
    breaks = windowed.trajectory().breaks
    assert breaks["fork"] + breaks["new"] == 1 and len(windowed.trajectory().sequences) == 2


def test_a_template_that_rewrites_earlier_turns_is_rendered_whole() -> None:
    tok = copy.deepcopy(load_tokenizer("tiny"))
    assert template_is_stable(tok)
    # drops every assistant turn's reasoning once a later user message comes (as Qwen3 does)
    tok.chat_template = (
        "{%- set ns = namespace(last=0) -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}"
        "{%- endif -%}{%- endfor -%}"
        "{%- for m in messages -%}{%- set c = m.content or '' -%}"
        "{%- if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in c -%}"
        "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
        "{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    assert not template_is_stable(tok)
    s = Session("s", "k", managed=ManagedServer(Stub(tok), tok), tokenizer=tok)
    assert s.template is None


def test_the_window_is_the_sessions_renderer_and_keeps_only_the_latest_prompt() -> None:
    s, _ = session()
    assert s.managed is not None and s.managed.renderer is s.template  # the hook, no patch
    asyncio.run(converse(s))
    assert s.template is not None and s.template.counts["window"] >= 4
    assert len(s.template._prompts) == 1  # each continued prompt was dropped


def test_a_managed_server_with_no_renderer_renders_whole() -> None:
    tok = load_tokenizer("tiny")
    managed = ManagedServer(Stub(tok), tok)
    assert managed.renderer is None
    messages = [{"role": "user", "content": "hi"}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert managed.render_whole(messages, None, {}) == expected


def test_a_template_whose_answer_reads_the_message_before_it_gets_the_long_window() -> None:
    """The one-render window renders an answer without the message before it: a template that
    writes an answer differently after a tool result passes that window's checks but not the
    probe, so the two-render window (which keeps that message) is used, and gives the full
    render's ids."""
    tok = copy.deepcopy(load_tokenizer("tiny"))
    assert window_kind(tok) == "short"
    tok.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
        "{%- if m.role == 'assistant' and not loop.first"
        " and messages[loop.index0 - 1].role == 'tool' -%}{{- '(after a tool) ' -}}{%- endif -%}"
        "{{- (m.content or '') + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    assert window_kind(tok) == "long"
    windowed = Session("s", "k", managed=ManagedServer(Stub(tok), tok), tokenizer=tok)
    whole = Session("w", "k", managed=ManagedServer(Stub(tok), tok), tokenizer=tok)
    assert whole.managed is not None and windowed.managed is not None
    whole.managed.renderer, whole.template = None, None
    asyncio.run(converse(windowed))
    asyncio.run(converse(whole))
    assert windowed.template is not None and windowed.template.counts["window"] >= 4
    assert windowed.template.counts["short"] == 0
    sent = [s.sent for s in (windowed.managed.server, whole.managed.server)]
    assert sent[0] == sent[1]


def test_the_one_render_window_gives_the_full_renders_text() -> None:
    s, _ = session()
    asyncio.run(converse(s))
    assert s.template is not None and s.template.counts["short"] >= 4
    # an answer then a user message, again: the second time a skeleton fills it (the ids are
    # the full render's: test_a_continued_conversation_gives_the_full_renders_ids)
    assert s.template.counts["skeleton"] >= 1


def _renderers(book: Any) -> tuple[Any, Any]:
    """A maker of one-render windows over the tiny template keeping skeletons in `book`, and
    the full render to check them against."""
    from atropos.proxy.incremental import IncrementalRender, _compiled, _direct
    from atropos.proxy.skeleton import traced_template

    tok = load_tokenizer("tiny")
    template = _compiled(tok)
    traced = traced_template(tok, template)
    assert traced is not None

    def whole(msgs: list[dict[str, Any]], tools: Any, kw: dict[str, Any]) -> str:
        generation = msgs[-1]["role"] != "assistant"
        return str(
            tok.apply_chat_template(
                msgs, tools=tools, tokenize=False, add_generation_prompt=generation
            )
        )

    def make() -> IncrementalRender:
        return IncrementalRender(
            whole, _direct(tok, template), short=True, traced=_direct(tok, traced), book=book
        )

    return make, whole


def _chat(window: Any, whole: Any, system: str, tools: Any, turns: int = 5) -> None:
    """A conversation of answer-then-user calls through `window`, each render checked against
    the full render."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Hi."},
    ]
    for turn in range(turns):
        assert window.render(messages, tools, {}) == whole(messages, tools, {})
        messages = [
            *messages,
            {"role": "assistant", "content": f"answer {turn} with <b>'odd'</b> text"},
            {"role": "user", "content": f"and then {turn}?"},
        ]


def test_sessions_with_one_head_and_tools_share_their_skeletons(monkeypatch: Any) -> None:
    from atropos.proxy import incremental
    from atropos.proxy.incremental import SkeletonBook

    book = SkeletonBook()
    make, whole = _renderers(book)
    first, second = make(), make()
    _chat(first, whole, "Be brief.", TOOLS)
    _chat(second, whole, "Be brief.", copy.deepcopy(TOOLS))  # equal, not the same objects
    assert first.counts["built"] == 1 and first.counts["skeleton"] >= 2
    assert second.counts["built"] == 0 and second.counts["skeleton"] >= 3  # the first's
    other = make()  # another system message: a page of its own
    _chat(other, whole, "Be long.", TOOLS)
    assert other.counts["built"] == 1
    # tools in another key order: a page of their own, shared by the sessions that use it
    reordered = [{"function": TOOLS[0]["function"], "type": "function"}]
    built = []
    for _ in range(2):
        window = make()
        _chat(window, whole, "Be brief.", reordered)
        built.append(window.counts["built"])
    assert built == [1, 0]
    # tools holding a type JSON does not have (a tuple): never shared
    odd = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "parameters": ("a",)}}]
    for _ in range(2):
        window = make()
        _chat(window, whole, "Be brief.", odd)
        assert window.counts["built"] == 1
    monkeypatch.setattr(incremental, "_HEADS", 2)
    small = SkeletonBook()
    make, whole = _renderers(small)
    for system in ("a", "b", "c", "a"):
        window = make()
        _chat(window, whole, system, None)
        assert window.counts["built"] == 1  # "a" was dropped when "c" came
