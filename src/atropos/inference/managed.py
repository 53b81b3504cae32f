"""ManagedServer: token-exact generation sessions over a server's `tokens_and_logprobs_completion`.

It renders chat templates locally, sends token ids, and keeps every sequence as the server
returned it (`SequenceNode`: tokens, trainer masks, logprobs). A later call that continues a held
conversation extends it by token ids, never by re-tokenizing text; disagreements between the
re-rendered template and the held ids are classified (`DriftKind`) and counted (P11). Such a
turn tokenizes only the text it adds where that is exact (`held.HeldTexts`), and a new
conversation's prompt comes from `prompts.PromptCache` when it was rendered before.

`chat_turn` is `chat_completion` without the OpenAI response object (the completions, finish
reasons and nodes): what `atropos.envs.simple.Env` uses on its hot path. Text goes through
`tokenizer.TokenCodec` (the Rust tokenizer directly where that is exact). A node records the
lowest `policy_version` the server reported for the calls that generated it (`SequenceNode`).

Reasoning settings (`reasoning.TemplatePlan`, handed over by `ServerManager.managed_server`)
reach the template as kwargs at render time (`enable_thinking`, `thinking`, `reasoning_effort`,
those the template reads), and a reasoning budget is enforced here by ending the block at the
budget (`thinking_budget.py`); `skip_reasoning=True` on a call renders and samples without them,
and a call's own `chat_template_kwargs` are rendered over them.
"""

from __future__ import annotations

import json
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import eq
from typing import Any, Protocol, cast

from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

from atropos.inference.base import PolicyVersions, normalize_max_tokens
from atropos.inference.held import HeldTexts
from atropos.inference.prompt_json import PROMPT_JSON, PromptJSON
from atropos.inference.prompts import PromptCache
from atropos.inference.reasoning import Reasoning, TemplatePlan
from atropos.inference.sequence import (
    DriftKind,
    SequenceNode,
    build_node,
    build_nodes,
    classify_drift,
    starts_with,
)
from atropos.inference.thinking_budget import sample_within_budget
from atropos.inference.tokenize import as_token_ids, end_of_turn_ids, trailing_end_of_turn
from atropos.inference.tokenizer import TokenCodec

__all__ = ["ChatRenderer", "ChatTurn", "DriftKind", "ManagedServer", "SequenceNode"]

_CHAT_FINISH = {"stop", "length", "tool_calls", "content_filter", "function_call"}
_TEXT_FINISH = {"stop", "length", "content_filter"}
_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
_NO_DRIFT: dict[DriftKind, int] = dict.fromkeys(DriftKind, 0)
_NO_REASONING = TemplatePlan()
_TURN_END: dict[int, tuple[Any, frozenset[int]]] = {}
"""`ManagedServer._turn_end_ids` per tokenizer (by id; the tokenizer is kept, so the id holds)."""
Forced = list["tuple[int, int] | None"] | None
"""Per choice, `(start, count)` of the ids we inserted into its output (None: no budget ran)."""
Generated = tuple[list[int], list[list[int]], list[list[float]], list[str], "int | None", Forced]


class ChatRenderer(Protocol):
    """What renders a session's chat prompts in place of `ManagedServer.render_whole` (its
    `renderer`): the text of `msgs` with `tools`, `kw` being the call's sampling kwargs
    (`chat_template_kwargs` and `skip_reasoning` among them). It must give the text the whole
    render gives, and may call `render_whole` for it (the proxy's windowed render,
    `atropos.proxy.incremental`, renders only what a call adds to the previous prompt)."""

    def render(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> str: ...


def _messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages of a call as a list of plain dicts: a plain dict is taken as it is (the
    session's nodes keep it: a caller must not change a message after the call), any other
    mapping or pydantic message is copied into one (`_as_message`)."""
    return [m if type(m) is dict else _as_message(m) for m in messages]


def _as_message(message: Any) -> dict[str, Any]:
    """A chat message as a plain dict (accepts mappings and pydantic messages)."""
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump):
        return dict(dump(exclude_none=True))
    raise TypeError(f"expected a chat message mapping, got {type(message).__name__}")


def _key(message: Mapping[str, Any]) -> str:
    """What identifies a message when matching conversations: role, content, tool calls."""
    fields = {k: message.get(k) for k in _MESSAGE_KEYS if message.get(k) is not None}
    return json.dumps(fields, sort_keys=True, default=str)


def _same(held: Mapping[str, Any], message: Mapping[str, Any]) -> bool:
    """Whether two messages match (`_key`): equal dicts do without building the keys."""
    return held == message or _key(held) == _key(message)


@dataclass
class ChatTurn:
    """What one `ManagedServer.chat_turn` produced, without an OpenAI response around it.

    Attributes:
        contents: the decoded completion of each choice.
        finish_reasons: each choice's finish reason, as `chat_completion` reports it.
        nodes: each choice's sequence (the same objects the session holds).
        prompt_tokens: the prompt's ids as the server saw them.
        completion_tokens: output tokens over all choices.
        policy_version: the lowest weight version the server reported for this call (None:
            it reported none).
        extended: the held node whose sequence the nodes continue (their rows open with its
            rows; None: a new sequence). With `reuse_rows` it may have given them its rows:
            then it is empty, and only its identity is of use.
    """

    contents: list[str]
    finish_reasons: list[str]
    nodes: list[SequenceNode]
    prompt_tokens: list[int]
    completion_tokens: int
    policy_version: int | None = None
    extended: SequenceNode | None = None


_LAST_PROMPTS: list[Any] = [None, None]
"""A weak reference to the tokenizer `_prompt_cache` was last asked for, and its cache."""


def _prompt_cache(tokenizer: Any) -> PromptCache | None:
    """`PromptCache.of(tokenizer)`, the last tokenizer's without the weak map's lookup (one per
    call; a weak reference here too, so the cache does not keep a tokenizer alive)."""
    ref, cache = _LAST_PROMPTS
    if ref is not None and ref() is tokenizer:
        return cast(PromptCache, cache)
    cache = PromptCache.of(tokenizer)
    if cache is not None:
        _LAST_PROMPTS[:] = [weakref.ref(tokenizer), cache]
    return cache


def _finish(reason: Any) -> str:
    """A finish reason as a string (SGLang-style `{"type": ...}` dicts included)."""
    if isinstance(reason, Mapping):
        reason = reason.get("type")
    return "" if reason is None else str(reason)


def _ints(row: Any) -> list[int]:
    """`row` as a list of Python ints. A list whose first entry is one is taken as it is: our
    backends build their rows from JSON as ints (a copy here cost more than all the rest)."""
    if type(row) is list and (not row or type(row[0]) is int):
        return row
    return [int(t) for t in row]


class ManagedServer:
    """Token-exact generation sessions: one `SequenceNode` per sequence, extended by token ids.

    Use one instance per rollout (a group of conversations); concurrent calls on different
    conversations are fine, two calls continuing the same sequence at once are not.

    Args:
        server: anything with `await tokens_and_logprobs_completion(prompt=None, input_ids=None,
            n=1, max_tokens=..., **sampling) -> (prompt_ids, [output_ids], [output_logprobs],
            [finish_reasons])`, e.g. a backend or `ServerManager`'s pinned server.
        tokenizer: the model's tokenizer (default: `server.tokenizer`); it renders the chat
            template, so it must be the one the server's model was trained with.
        reasoning: the reasoning settings of every call: a `Reasoning`, or the
            `TemplatePlan` made from it for this tokenizer (what `ServerManager` passes).
        renderer: renders every chat prompt (`ChatRenderer`; also settable as the `renderer`
            attribute). None: `render_whole`, and a new conversation's prompt comes from
            `PromptCache` when it was rendered before; with a renderer, every prompt goes
            through it (so it sees each prompt a later call may continue) and none is cached.
        reuse_rows: a chat turn that continues a held node, which it then replaces in `nodes`,
            gives its last new node that node's rows (tokens, masks, logprobs) extended in
            place, and leaves it empty: no copy of the conversation per call (at 32k tokens
            four list copies and four frees of 32k entries). Only for an owner that reads
            sequences from `nodes` and never keeps a node of an earlier turn (the rollout
            proxy); off by default, where a node once returned stays as it was. Not taken
            while another call continues the same node. Also settable as an attribute.

    Example:
        >>> import asyncio
        >>> from atropos.testing.fake_engine import load_tokenizer
        >>> class Echo:  # a server that answers "ok" + eos
        ...     tok = load_tokenizer()
        ...     async def tokens_and_logprobs_completion(self, *, input_ids, n=1, **kw):
        ...         out = self.tok.encode("ok") + [self.tok.eos_token_id]
        ...         return input_ids, [out] * n, [[-0.5] * len(out)] * n, ["stop"] * n
        >>> m = ManagedServer(Echo(), Echo.tok)
        >>> reply = asyncio.run(m.chat_completion(messages=[{"role": "user", "content": "hi"}]))
        >>> reply.choices[0].message.content, m.get_state()["nodes"][0].masked_tokens[-4:]
        ('ok', [-100, 82, 78, 2])
    """

    def __init__(
        self,
        server: Any,
        tokenizer: Any = None,
        *,
        reasoning: Reasoning | TemplatePlan | None = None,
        renderer: ChatRenderer | None = None,
        reuse_rows: bool = False,
    ) -> None:
        """Bind the server and tokenizer; no sequences are held yet."""
        tokenizer = tokenizer if tokenizer is not None else getattr(server, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("ManagedServer needs a tokenizer: pass one, or a server that has one")
        self.server = server
        self.tokenizer = tokenizer
        if isinstance(reasoning, Reasoning):
            reasoning = TemplatePlan.for_tokenizer(reasoning, tokenizer)
        #: The chat-template kwargs and reasoning budget every call uses.
        self.reasoning: TemplatePlan = reasoning or _NO_REASONING
        #: What renders the chat prompts (None: `render_whole`, with `PromptCache`).
        self.renderer: ChatRenderer | None = renderer
        #: Whether a continued node gives the new one its rows (see the class's docstring).
        self.reuse_rows = reuse_rows
        self.nodes: list[SequenceNode] = []
        #: id(node) -> how many chat turns continuing it are waiting for the server.
        self._continuing: dict[int, int] = {}
        #: id(node) -> (the node, the JSON its prompt was sent as, that prompt's length): the
        #: prefix of the next call's JSON (`prompt_json`).
        self._sent: dict[int, tuple[SequenceNode, bytes, int]] = {}
        self._turn_end: frozenset[int] | None = None
        self._token_codec: TokenCodec | None = None
        #: How many prompts continued a held sequence, by kind of drift.
        self.drift_counts: dict[DriftKind, int] = dict(_NO_DRIFT)
        self._held = HeldTexts(tokenizer)

    # --- public calls ---------------------------------------------------------------------

    async def chat_completion(
        self,
        *,
        messages: Sequence[Any],
        n: int = 1,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        **sampling: Any,
    ) -> ChatCompletion:
        """Complete a chat with the template rendered locally; one node per choice.

        The generation prompt is added unless the last message is the assistant's. Other
        kwargs (`temperature`, `stop`, `split`, ...) go to the server; `tool_choice` is dropped.

        Returns:
            An OpenAI `ChatCompletion` whose choices carry the decoded completions.
        """
        turn = await self.chat_turn(
            messages=messages, n=n, max_tokens=max_tokens, tools=tools, **sampling
        )
        choices = [
            Choice(
                index=i,
                message=ChatCompletionMessage(role="assistant", content=content),
                finish_reason=reason,
            )
            for i, (content, reason) in enumerate(
                zip(turn.contents, turn.finish_reasons, strict=True)
            )
        ]
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            object="chat.completion",
            created=int(time.time()),
            model=self._model(sampling),
            choices=choices,
            usage=CompletionUsage(
                prompt_tokens=len(turn.prompt_tokens),
                completion_tokens=turn.completion_tokens,
                total_tokens=len(turn.prompt_tokens) + turn.completion_tokens,
            ),
        )

    async def chat_turn(
        self,
        *,
        messages: Sequence[Any],
        n: int = 1,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        hold: bool = True,
        **sampling: Any,
    ) -> ChatTurn:
        """`chat_completion` without the OpenAI response object: the completions, their finish
        reasons and their nodes (what an environment reads), for a fraction of the CPU.

        `hold=False`: the nodes are returned and not held (no later call continues them, and
        `nodes` does not grow) and carry no `messages` (the caller has the prompt, and
        `contents` the replies): what `ServerManager.single_turn` uses for a one-call rollout."""
        msgs = _messages(messages)
        if not msgs:
            raise ValueError("expected at least one message")
        sampling.pop("tool_choice", None)
        parent, drift, text, input_ids = self._turn_prompt(msgs, tools, sampling)
        sent = self._prompt_json(parent, input_ids)
        generated = await self._send(parent, sent, n, max_tokens, sampling)
        prompt, outs, lps, finishes, version, forced = generated
        contents = self._codec().decode_all(outs)
        same = prompt is input_ids or prompt == input_ids  # then it extends `parent` (if any)
        if parent is not None and not (same or starts_with(prompt, parent.tokens)):
            parent = None  # (the server changed the prompt: its masks start afresh)
        nodes = build_nodes(
            prompt_tokens=prompt,
            outputs=outs,
            output_logprobs=lps,
            finish_reasons=finishes,
            full_texts=[text + content for content in contents],
            parent=parent,
            prefixed=True,
            end_of_turn=self._ends_of_turn(outs, finishes),
            drift=drift,
            policy_version=version,
            unlearned=forced,
            take_parent=hold and same and self._may_take(parent),
        )
        if hold:  # (a turn nobody continues needs no messages to be found by)
            for node, content in zip(nodes, contents, strict=True):
                node.messages = [*msgs, {"role": "assistant", "content": content}]
            if same:
                self._held.note(nodes, text, prompt, outs, drift)
                if sent.json is not None:
                    for node in nodes:
                        self._sent[id(node)] = (node, sent.json, len(prompt))
            self._store(parent, nodes)
        return ChatTurn(
            contents=contents,
            finish_reasons=[f if f in _CHAT_FINISH else "stop" for f in finishes],
            nodes=nodes,
            prompt_tokens=prompt,
            completion_tokens=sum(map(len, outs)),
            policy_version=version,
            extended=parent,
        )

    def _prompt_json(self, parent: SequenceNode | None, input_ids: list[int]) -> PromptJSON:
        """The call's `PromptJSON`: the prefix is the JSON `parent`'s prompt was sent as (the
        ids of a prompt continuing `parent` open with `parent`'s, which open with its
        prompt's)."""
        known = self._sent.get(id(parent)) if parent is not None else None
        if known is None or known[0] is not parent:
            return PromptJSON(input_ids)
        return PromptJSON(input_ids, known[1], known[2])

    async def _send(
        self,
        parent: SequenceNode | None,
        sent: PromptJSON,
        n: int,
        max_tokens: int | None,
        sampling: dict[str, Any],
    ) -> Generated:
        """`_generate` of the prompt `sent` names, with it in `PROMPT_JSON`; a turn continuing
        `parent` is counted in `_continuing` meanwhile."""
        key, continuing = id(parent), self._continuing
        if parent is not None:
            continuing[key] = continuing.get(key, 0) + 1
        scope = PROMPT_JSON.set(sent)
        try:
            return await self._generate(sent.ids, n, max_tokens, sampling)
        finally:
            PROMPT_JSON.reset(scope)
            if parent is not None and continuing[key] == 1:
                del continuing[key]
            elif parent is not None:
                continuing[key] -= 1

    def _may_take(self, parent: SequenceNode | None) -> bool:
        """Whether a turn's nodes may take `parent`'s rows (`reuse_rows`): on, no other call
        continuing it, and it is held (so the new nodes replace it)."""
        return (
            self.reuse_rows
            and parent is not None
            and id(parent) not in self._continuing
            and any(node is parent for node in self.nodes)
        )

    def _turn_prompt(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> tuple[SequenceNode | None, DriftKind | None, str, list[int]]:
        """A chat turn's parent (the held sequence it extends, None: a new conversation), its
        drift, and its prompt's text and ids."""
        parent, exact = self._chat_parent(msgs)
        if parent is None:  # a new conversation: its prompt may have been rendered before
            return None, None, *self._fresh_prompt(msgs, tools, kw)
        text = self._render(msgs, tools, kw)
        extended = self._held.extend(parent, text) if exact else None
        if extended is None:
            parent, drift, input_ids = self._extend(parent, exact, self._encode(text), text)
            return parent, drift, text, input_ids
        self.drift_counts[extended[0]] += 1
        return parent, extended[0], text, extended[1]

    async def continue_turn(
        self,
        node: SequenceNode,
        inserted: Sequence[int] = (),
        *,
        max_tokens: int | None = None,
        **sampling: Any,
    ) -> SequenceNode:
        """Continue the open assistant turn `node` ends in, by token ids.

        `inserted` (ids the policy did not write: a tool result put inside its reasoning, a
        stop string the server cut) goes after `node`'s ids masked, then the policy writes on,
        trained with the server's logprobs; nothing held is re-tokenized. `chat_turn` cannot do
        this: re-rendering a partial assistant message closes the turn in most chat templates,
        so the model would write after an end-of-turn token. The new node takes `node`'s place
        in the session; a chat node's last (assistant) message gets the inserted and new text.

        A reasoning budget does not apply here (the block began in an earlier call; bound the
        continuation with `max_tokens`).

        Raises:
            ValueError: the server answered for other prompt ids than `node`'s plus `inserted`
                (the sequence would no longer be the one the policy saw).
        """
        input_ids = [*node.tokens, *(int(t) for t in inserted)]
        prompt, outs, lps, finishes, version, _ = await self._generate(
            input_ids, 1, max_tokens, {**sampling, "skip_reasoning": True}
        )
        if prompt != input_ids:
            raise ValueError(
                f"the server answered for a prompt of {len(prompt)} ids, not the"
                f" {len(input_ids)} sent: the turn cannot be continued token-exactly"
            )
        added = self._decode(input_ids[len(node.tokens) :]) + self._decode(outs[0])
        extended = self._node(
            prompt,
            outs[0],
            lps[0],
            finishes[0],
            node,
            node.full_text + added,
            None,
            version,
            prefixed=True,
        )
        if node.messages and node.messages[-1].get("role") == "assistant":
            last = node.messages[-1]
            extended.messages = [
                *node.messages[:-1],
                {**last, "content": (last.get("content") or "") + added},
            ]
        self._store(node, [extended])
        return extended

    async def completion(
        self, *, prompt: str, n: int = 1, max_tokens: int | None = None, **sampling: Any
    ) -> Completion:
        """Complete a raw prompt; a prompt that continues a held sequence's text extends it.

        Returns:
            An OpenAI `Completion` whose choices carry the decoded completions.
        """
        if not isinstance(prompt, str):
            raise TypeError(f"expected prompt to be a string, got {type(prompt).__name__}")
        prompt_ids = as_token_ids(self.tokenizer.encode(prompt, add_special_tokens=True))
        parent = self._text_parent(prompt)
        parent, drift, input_ids = self._extend(parent, True, prompt_ids, prompt)
        tokens, outs, lps, finishes, version, forced = await self._generate(
            input_ids, n, max_tokens, sampling
        )
        nodes, choices = [], []
        for i, (out, lp, finish) in enumerate(zip(outs, lps, finishes, strict=True)):
            text = self._decode(out)
            spliced = forced[i] if forced is not None else None
            full = prompt + text
            nodes.append(self._node(tokens, out, lp, finish, parent, full, drift, version, spliced))
            reason = finish if finish in _TEXT_FINISH else "stop"
            choices.append(CompletionChoice(index=i, text=text, finish_reason=reason))
        self._store(parent, nodes)
        return Completion(
            id=f"cmpl-{uuid.uuid4().hex}",
            object="text_completion",
            created=int(time.time()),
            model=self._model(sampling),
            choices=choices,
            usage=self._usage(tokens, outs),
        )

    async def get_logprobs(
        self,
        *,
        messages: Sequence[Any] | None = None,
        prompt: str | None = None,
        input_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> Any:
        """The server's `get_logprobs` for messages (rendered here), a prompt or token ids."""
        if messages is not None:
            msgs = _messages(messages)
            text = self._render(msgs, None, kwargs) if msgs else ""
            input_ids = self._encode(text)
        if input_ids is not None:
            return await self.server.get_logprobs(input_ids=input_ids, **kwargs)
        return await self.server.get_logprobs(prompt=prompt, **kwargs)

    def get_state(self) -> dict[str, list[SequenceNode]]:
        """`{"nodes": [...]}`: copies of the held sequences (read them before `reset()`)."""
        return {"nodes": [node.copy() for node in self.nodes]}

    def reset(self) -> None:
        """Forget every held sequence and zero `drift_counts`."""
        self.nodes = []
        self._sent.clear()
        self.drift_counts = dict(_NO_DRIFT)
        self._held.clear()

    # --- sequences ------------------------------------------------------------------------

    def _chat_parent(self, msgs: list[dict[str, Any]]) -> tuple[SequenceNode | None, bool]:
        """The held chat this conversation continues, and whether its reply is unchanged.

        A node qualifies when its prompt messages open `msgs` and `msgs` then has an assistant
        turn where the node's reply was; a node whose reply matches exactly wins, then the
        longest.
        """
        if not self.nodes:
            return None, False  # nothing held: a new conversation (the common single-turn case)
        best: tuple[bool, int] | None = None
        found: SequenceNode | None = None
        for node in self.nodes:
            held = node.messages
            if not held or len(held) > len(msgs):
                continue
            depth = len(held)
            if msgs[depth - 1].get("role") != "assistant":
                continue
            # equal dicts (the same objects, often) compare in C; `_same` only where they differ
            if not all(map(eq, islice(held, depth - 1), msgs)) and not all(
                map(_same, islice(held, depth - 1), msgs)
            ):
                continue
            rank = (_same(msgs[depth - 1], held[-1]), depth)
            if best is None or rank > best:
                best, found = rank, node
        return found, bool(best and best[0])

    def _text_parent(self, prompt: str) -> SequenceNode | None:
        """The longest held raw-prompt sequence whose text the prompt continues."""
        held = [n for n in self.nodes if n.messages is None and prompt.startswith(n.full_text)]
        return max(held, key=lambda n: len(n.full_text), default=None)

    def _extend(
        self, parent: SequenceNode | None, exact: bool, prompt_ids: list[int], text: str
    ) -> tuple[SequenceNode | None, DriftKind | None, list[int]]:
        """The ids to send and the parent whose masks carry over (None after a fork)."""
        if parent is None:
            return None, None, prompt_ids
        drift, ids = DriftKind.FORK, prompt_ids
        if exact:
            held_text = self._held.text(parent)
            if held_text is None:
                held_text = str(self.tokenizer.decode(parent.tokens, skip_special_tokens=False))
            drift, ids = classify_drift(parent.tokens, held_text, prompt_ids, text, self._encode)
        self.drift_counts[drift] += 1
        return (None if drift is DriftKind.FORK else parent), drift, ids

    def _node(
        self,
        prompt: list[int],
        out: list[int],
        logprobs: list[float],
        finish: str,
        parent: SequenceNode | None,
        full_text: str,
        drift: DriftKind | None,
        policy_version: int | None = None,
        forced: tuple[int, int] | None = None,
        *,
        prefixed: bool = False,
    ) -> SequenceNode:
        eot = 0
        if finish == "length" and out and out[-1] in self._turn_end_ids():
            eot = trailing_end_of_turn(out, self.tokenizer)
        return build_node(
            prompt_tokens=prompt,
            output=out,
            output_logprobs=logprobs,
            finish_reason=finish,
            parent=parent,
            end_of_turn=eot,
            full_text=full_text,
            drift=drift,
            policy_version=policy_version,
            unlearned=forced,
            prefixed=prefixed,
        )

    def _ends_of_turn(self, outs: list[list[int]], finishes: list[str]) -> list[int] | None:
        """Per choice, how many trailing ids of a "length" completion are an end of turn
        (None: no choice has any; the common case costs one scan of the finish reasons)."""
        if "length" not in finishes:
            return None
        ends, tokenizer = self._turn_end_ids(), self.tokenizer
        counts = [
            trailing_end_of_turn(out, tokenizer) if f == "length" and out and out[-1] in ends else 0
            for out, f in zip(outs, finishes, strict=True)
        ]
        return counts if any(counts) else None

    def _store(self, parent: SequenceNode | None, nodes: list[SequenceNode]) -> None:
        """Put the new nodes where the parent was (it is their prefix), or at the end."""
        at = None
        if parent is not None:  # a new conversation's nodes (the common case) have none
            at = next((i for i, node in enumerate(self.nodes) if node is parent), None)
        if at is None:
            self.nodes.extend(nodes)
        else:
            self._held.forget(self.nodes[at])
            self._sent.pop(id(parent), None)
            self.nodes[at : at + 1] = nodes

    # --- plumbing -------------------------------------------------------------------------

    def _render(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> str:
        """The prompt text of `msgs`: by the `renderer` when there is one, else `render_whole`."""
        renderer = self.renderer
        if renderer is not None:
            return renderer.render(msgs, tools, kw)
        return self.render_whole(msgs, tools, kw)

    def render_whole(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> str:
        """The chat template over all of `msgs`, with the reasoning kwargs (unless `kw` says
        `skip_reasoning`) under the call's own `chat_template_kwargs` (popped from `kw`)."""
        return self._apply(msgs, self._template_kwargs(tools, kw))

    def _template_kwargs(
        self, tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> dict[str, Any]:
        extra = dict(kw.pop("chat_template_kwargs", None) or {})
        if self.reasoning.kwargs and not kw.get("skip_reasoning"):
            extra = {**self.reasoning.kwargs, **extra}
        if tools:
            extra["tools"] = tools
        return extra

    def _apply(self, msgs: list[dict[str, Any]], extra: dict[str, Any]) -> str:
        add_generation_prompt = msgs[-1].get("role") != "assistant"
        return str(
            self.tokenizer.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
            )
        )

    def _fresh_prompt(
        self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]] | None, kw: dict[str, Any]
    ) -> tuple[str, list[int]]:
        """The text and ids of a new conversation's prompt, from `PromptCache` when there.

        A session with a `renderer` renders through it, uncached, so that it sees every prompt
        it may later continue."""
        if self.renderer is not None:
            text = self.renderer.render(msgs, tools, kw)
            return text, self._encode(text)
        extra = self._template_kwargs(tools, kw)
        cache = _prompt_cache(self.tokenizer)
        key = PromptCache.key(self.tokenizer, msgs, extra) if cache is not None else None
        if key is not None and cache is not None:
            found = cache.get(key)
            if found is not None:
                return found
        text = self._apply(msgs, extra)
        ids = self._encode(text)
        if key is not None and cache is not None:
            cache.put(key, text, ids)
        return text, ids

    async def _generate(
        self, input_ids: list[int], n: int, max_tokens: int | None, sampling: dict[str, Any]
    ) -> Generated:
        """The server's answer, rows as plain lists of ints and floats, the lowest policy
        version it reported (None: none), and where ids were inserted (None: no budget ran)."""
        kwargs = dict(sampling)
        budget = None if kwargs.pop("skip_reasoning", False) else self.reasoning.budget
        if "max_completion_tokens" in kwargs:
            limit = kwargs.pop("max_completion_tokens")
            max_tokens = max_tokens if max_tokens is not None else limit
        if budget is not None:
            return await self._generate_within_budget(input_ids, n, max_tokens, kwargs, budget)
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        with PolicyVersions() as seen:
            prompt, outs, lps, finishes = await self.server.tokens_and_logprobs_completion(
                input_ids=input_ids, n=n, **kwargs
            )
        return self._rows(n, prompt, outs, lps, finishes, seen.lowest, None)

    async def _generate_within_budget(
        self,
        input_ids: list[int],
        n: int,
        max_tokens: int | None,
        kwargs: dict[str, Any],
        budget: int,
    ) -> Generated:
        """`_generate` with the reasoning block ended at `budget` (`thinking_budget.py`)."""
        limit = max_tokens if max_tokens is not None else normalize_max_tokens(kwargs)
        markers = self.reasoning.markers
        if markers is None:  # a plan always has markers when it has a budget
            raise ValueError("a reasoning budget needs the tokenizer's <think> markers")

        async def sample(ids: list[int], k: int, most: int | None) -> Any:
            call = kwargs if most is None else {**kwargs, "max_tokens": most}
            return await self.server.tokens_and_logprobs_completion(input_ids=ids, n=k, **call)

        with PolicyVersions() as seen:
            prompt, choices = await sample_within_budget(
                sample, input_ids, n, limit, budget, markers
            )
        forced = [(c.forced_at, c.forced) if c.forced_at is not None else None for c in choices]
        outs = [c.output for c in choices]
        lps = [c.logprobs for c in choices]
        finishes = [c.finish_reason for c in choices]
        return self._rows(n, prompt, outs, lps, finishes, seen.lowest, forced)

    @staticmethod
    def _rows(
        n: int,
        prompt: Any,
        outs: Any,
        lps: Any,
        finishes: Any,
        version: int | None,
        forced: Forced,
    ) -> Generated:
        """The server's rows as plain lists of ints, floats and strings, checked: `n` each."""
        if not len(outs) == len(lps) == len(finishes) == n:
            raise ValueError(
                f"asked for {n} completions, the server returned {len(outs)} outputs, "
                f"{len(lps)} logprob lists and {len(finishes)} finish reasons"
            )
        return (
            _ints(prompt),
            [
                out if type(out) is list and out and type(out[0]) is int else _ints(out)
                for out in outs
            ],
            lps,  # made lists of floats where nodes are built (`build_nodes`)
            [f if type(f) is str else _finish(f) for f in finishes],
            version,
            forced,
        )

    def _codec(self) -> TokenCodec:
        codec = self._token_codec
        if codec is None or codec.tokenizer is not self.tokenizer:
            codec = self._token_codec = TokenCodec.of(self.tokenizer)
        return codec

    def _encode(self, text: str) -> list[int]:
        return self._codec().encode(text)

    def _turn_end_ids(self) -> frozenset[int]:
        """Ids an end of turn can end with (the template's turn suffix and eos): a completion
        ending in none of them has no trailing end of turn, and needs no closer look. Made
        once per tokenizer (a session is made per rollout)."""
        if self._turn_end is None:
            tokenizer = self.tokenizer
            held = _TURN_END.get(id(tokenizer))
            if held is None or held[0] is not tokenizer:
                ids = set(end_of_turn_ids(tokenizer))
                eos = getattr(tokenizer, "eos_token_id", None)
                if isinstance(eos, int):
                    ids.add(eos)
                held = _TURN_END[id(tokenizer)] = (tokenizer, frozenset(ids))
            self._turn_end = held[1]
        return self._turn_end

    def _decode(self, ids: list[int]) -> str:
        return self._codec().decode(ids)

    def _model(self, sampling: Mapping[str, Any]) -> str:
        config = getattr(self.server, "config", None)
        return str(sampling.get("model") or getattr(config, "model_name", None) or "managed")

    @staticmethod
    def _usage(prompt: list[int], outs: list[list[int]]) -> CompletionUsage:
        done = sum(len(o) for o in outs)
        return CompletionUsage(
            prompt_tokens=len(prompt), completion_tokens=done, total_tokens=len(prompt) + done
        )
