"""Sessions: one agent run each, its calls generated through the inference layer, its tokens kept.

A session holds a `ManagedServer` (`atropos.inference.managed`): every call's conversation is
rendered with the policy's chat template (tools included), sent to the server as token ids, and
the answer kept token-exact, a call that continues a held conversation extending its sequence
by ids. The raw completion is read into tool calls (`atropos.inference.tool_calls`); the
assistant message the agent gets back is remembered with the raw text it came from, so when the
agent sends that message back in its history (with the calls in its own JSON spelling, under
new ids) the proxy renders the raw text the model wrote and the tokens line up.

With a text-only server (`server_type: openai`), the call is forwarded as chat (tools
included) and the conversation is tokenized locally at the end (`token_source`
"retokenized", no logprobs), as environments do.

Limits per session (`Limits`): calls, generated tokens, wall time; a call past one is refused
with a 400 that names the limit (never 429, which SDKs retry).

A call that names no limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens` absent
or null) gets what vLLM gives a chat: the rest of the context (the context length minus the
prompt), bounded here by the tokens left in the session's budget. The session asks its server
for the context length once (`context_length`: `max_model_len` in `GET /models`, as vLLM, SGLang
and `atropos local serve` report it) and puts the bound on every request it sends with the
prompt's ids in hand; a server that reports none gets no `max_tokens` (its own default).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atropos.envs.outcome import RolloutLimits
from atropos.inference.errors import InferenceError
from atropos.inference.managed import ManagedServer
from atropos.inference.sequence import DriftKind, SequenceNode, starts_with
from atropos.inference.tool_calls import ParsedOutput, call_key, parse_tool_calls
from atropos.proxy.incremental import IncrementalRender
from atropos.proxy.resend import ChatReader
from atropos.proxy.trajectory import BREAK_KINDS, Sequence, Span, Trajectory
from atropos.proxy.turns import ProxyError, TurnChoice, TurnRequest, TurnResult

__all__ = [
    "Limits",
    "Session",
    "context_length",
    "cut_at_stop",
    "new_capability",
    "new_session_id",
    "new_session_key",
]


@dataclass(frozen=True)
class Limits(RolloutLimits):
    """What one session may use (`atropos.envs.outcome.RolloutLimits`, with a session's
    defaults); a call past any of them is refused (400)."""

    max_turns: int = 256  # model calls
    max_tokens: int = 262_144  # completion tokens, all calls together (a call that names its
    # max_tokens is capped at what is left; one that does not gets the rest of the context,
    # capped the same way)
    max_seconds: float = 3600.0  # from the session's creation


log = logging.getLogger(__name__)
#: A backend -> the context length it reported (None: none); forgotten when a request sized by
#: it is refused (the server restarted with another `--max-model-len`).
_CONTEXT: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


async def context_length(server: Any) -> int | None:
    """The context length of `server` (a backend, or a `PinnedServer` and its current
    backend): the `max_model_len` of its model in `GET {base_url}/models` (vLLM's, SGLang's and
    `atropos local serve`'s model cards), asked once per server; None when it reports none or
    cannot be asked (a test double, a plain OpenAI server)."""
    backend = getattr(server, "backend", server)
    url, ask = getattr(backend, "base_url", None), getattr(backend, "_request", None)
    if not isinstance(url, str) or ask is None:
        return None
    if backend in _CONTEXT:
        return _CONTEXT[backend]
    try:
        answer = await ask("GET", url + "/models", timeout=10.0)
    except Exception as exc:  # asked again on the next call; this one takes the server's default
        log.warning("GET %s/models failed (%s): no context length for the default", url, exc)
        return None
    cards = answer.get("data") if isinstance(answer, Mapping) else None
    cards = [c for c in cards or [] if isinstance(c, Mapping)]
    name = getattr(getattr(backend, "config", None), "model_name", None)
    cards.sort(key=lambda c: c.get("id") != name)  # the configured model's card first
    found = [c["max_model_len"] for c in cards if isinstance(c.get("max_model_len"), int)]
    _CONTEXT[backend] = found[0] if found else None
    if not found:
        log.warning(
            "%s/models reports no max_model_len: a call without max_tokens gets the server's"
            " default (16 tokens on vLLM's /v1/completions); send max_tokens",
            url,
        )
    return _CONTEXT[backend]


class _RestOfContext:
    """The session's server, as its `ManagedServer` sees it: a request sent without
    `max_tokens` gets the rest of the context (`context_length` minus its prompt's ids), at
    most the session's tokens left; everything else is the server's."""

    def __init__(self, server: Any, session: Session) -> None:
        self._server, self._session = server, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids")
        if kwargs.get("max_tokens") is not None or ids is None:
            return await self._server.tokens_and_logprobs_completion(**kwargs)
        backend = getattr(self._server, "backend", self._server)
        context = await context_length(backend)
        if context is not None:
            left = self._session.tokens_left()
            kwargs["max_tokens"] = max(1, min(context - len(ids), left))
        try:
            return await self._server.tokens_and_logprobs_completion(**kwargs)
        except InferenceError as err:
            if err.status_code == 400:  # perhaps sized by a stale length: ask again next time
                _CONTEXT.pop(backend, None)
            raise


def new_session_id() -> str:
    """A session id: 22 URL-safe characters (128 random bits)."""
    return secrets.token_urlsafe(16)


def new_session_key() -> str:
    """A session's bearer key: `sk-atropos-` + 43 URL-safe characters (256 random bits)."""
    return "sk-atropos-" + secrets.token_urlsafe(32)


def new_capability() -> str:
    """An upstream session's `uuid` (`POST /sessions/create`): 43 URL-safe characters (256
    random bits), a secret that addresses the session on upstream's routes (`atropos.proxy.app`)."""
    return secrets.token_urlsafe(32)


def _text(content: Any) -> str:
    """A message's content as text (content parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return str(content)


def assistant_key(message: Mapping[str, Any]) -> str:
    """What identifies an assistant message when the agent sends it back: its text and its
    calls (name and arguments, not their ids or JSON spelling)."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        calls.append(call_key(str(fn.get("name")), fn.get("arguments", {})))
    return json.dumps([_text(message.get("content")).strip(), calls], ensure_ascii=False)


def cut_at_stop(raw: str, finish: str, stops: Any) -> tuple[str, str | None]:
    """The text an API answers with, and the stop string that ended it (None: none did).

    The token ids the server returns keep the tokens that spelled a stop string (they were
    sampled, and are trained on), so the decoded completion holds it; OpenAI's and Anthropic's
    APIs answer without it, as vLLM does. The server stops at the first stop string its text
    shows, so a completion that finished with "stop" is cut where the first one begins.

    >>> cut_at_stop("12 + 3 = 15.", "stop", ["=", "."])
    ('12 + 3 ', '=')
    >>> cut_at_stop("12 + 3 = 15.", "length", "=")
    ('12 + 3 = 15.', None)
    """
    if finish != "stop" or not stops:
        return raw, None
    found = [(raw.find(s), s) for s in ([stops] if isinstance(stops, str) else stops) if s]
    found = [(at, s) for at, s in found if at >= 0]
    if not found:
        return raw, None
    at, stop = min(found)
    return raw[:at], stop


class Session:
    """One agent run: its calls, its sequences, its limits and its reward.

    Args:
        session_id: the id (`new_session_id()`).
        key: the bearer key that addresses it (`new_session_key()`).
        managed: the session's `ManagedServer` (None for a text-only server).
        text_server: with no `managed`: an object with `await chat_completion(messages=...,
            **kwargs)` (a `ServerManager`), whose answers are retokenized.
        tokenizer: the policy's tokenizer (renders templates, retokenizes text answers).
        tool_parser: how calls are read from raw output (`atropos.inference.tool_calls`).
        limits: what the session may use.
        model: the model name answers carry.
    """

    def __init__(
        self,
        session_id: str,
        key: str,
        *,
        managed: ManagedServer | None,
        text_server: Any = None,
        tokenizer: Any,
        tool_parser: str = "hermes",
        limits: Limits | None = None,
        model: str = "atropos-policy",
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if managed is None and text_server is None:
            raise ValueError("a session needs a ManagedServer or a text server")
        self.id = session_id
        self.key = key
        server = getattr(managed, "server", None)
        if server is not None and not isinstance(server, _RestOfContext):
            managed.server = _RestOfContext(server, self)  # type: ignore[union-attr]
        if managed is not None:  # its nodes are read only from `managed.nodes` (no copies)
            managed.reuse_rows = True
        self.managed = managed
        #: Its chat prompts rendered by a window over the previous one (`proxy.incremental`).
        self.template = IncrementalRender.attach(managed) if managed is not None else None
        self.text_server = text_server
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self.limits = limits or Limits()
        self.model = model
        self.metadata = dict(metadata or {})
        self.created = time.monotonic()
        self.last_used = self.created
        self.turns = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.unparsed_tool_calls = 0
        self.breaks = dict.fromkeys(BREAK_KINDS, 0)
        self.reward: float | None = None
        self.finished = False
        self._raw_of: dict[str, str] = {}  # assistant_key -> the raw text the model wrote
        self._raw_plain: dict[str, str] = {}  # the same for answers without calls: text -> raw
        self._by_ids: dict[str, tuple[dict[str, Any], str]] = {}  # call ids -> answer, raw
        #: The last call's messages, as given and as rendered, and which to look up again
        #: (`_render`).
        self._rendered: tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]] = (
            [],
            [],
            [],
        )
        #: Its chat calls, read by what each adds to the previous one (`proxy.resend`).
        self.reader = ChatReader()
        self._spans: dict[int, list[Span]] = {}  # id(node) -> its generated spans
        self._conversations: list[list[dict[str, Any]]] = []  # text-only: finished chats
        self.responses: dict[str, list[dict[str, Any]]] = {}  # Responses API: id -> chat

    # ----- calls ----------------------------------------------------------------------------------

    async def complete(self, request: TurnRequest) -> TurnResult:
        """Generate one call's completions; raises `ProxyError` when a limit is reached."""
        max_tokens = self._admit(request)  # (an admitted call sets `last_used`)
        if self.managed is not None:
            result = await self._complete_tokens(request, max_tokens)
        else:
            result = await self._complete_text(request, max_tokens)
        self.turns += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.last_used = time.monotonic()
        return result

    def _admit(self, request: TurnRequest) -> int | None:
        """The `max_tokens` this call may have, or ProxyError naming the limit it would pass."""
        if self.finished:
            raise ProxyError(410, f"session {self.id} is finished: create a new one", "gone")
        now = time.monotonic()
        limits, seconds = self.limits, now - self.created
        hit = limits.exceeded(turns=self.turns, tokens=self.completion_tokens, seconds=seconds)
        if hit is not None:
            bound = getattr(limits, f"max_{hit}")
            raise ProxyError(400, f"session {self.id} reached max_{hit}={bound:g}")
        self.last_used = now
        left = self.tokens_left()
        if request.max_tokens is None:  # the rest of the context: `_RestOfContext`
            return None
        return min(request.max_tokens, left)

    def tokens_left(self) -> int:
        """Completion tokens the session's budget (`Limits.max_tokens`) has left."""
        return self.limits.max_tokens - self.completion_tokens

    def _render(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages to render: an assistant message the proxy answered becomes the raw
        text the model wrote (so its tokens match the held ones).

        The previous call's are kept: the messages it was given that open this call's (the
        same objects: `resend.ChatReader`) are taken as rendered then, but for assistant
        messages not found by their own key then (looked up again: a later answer may have
        added it); a key whose raw text changes drops them all (`_read`)."""
        given, done, again = self._rendered
        same, most = 0, min(len(messages), len(given))
        while same < most and messages[same] is given[same]:
            same += 1
        out = done[:same]
        looked: list[int] = []
        for i in again:
            if i < same:
                out[i], stable = self._render_one(given[i])
                if not stable:
                    looked.append(i)
        for i in range(same, len(messages)):
            message, stable = self._render_one(messages[i])
            out.append(message)
            if not stable:
                looked.append(i)
        self._rendered = (messages, out, looked)
        return out

    def _render_one(self, message: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """The message to render, and whether it was found by its own key (or is not an
        assistant message): then it stays so while that key's raw text does."""
        if message.get("role") != "assistant":
            return message, True
        if message.get("tool_calls"):
            raw = self._raw_of.get(assistant_key(message))
            stable = bool(raw)
            if not raw:
                raw = self._filled_in(message)
        else:  # `assistant_key` of a message without calls is its stripped text
            raw = self._raw_plain.get(_text(message.get("content")).strip())
            stable = raw is not None
        if raw is None:
            return message, False
        return {"role": "assistant", "content": raw}, stable

    def _tools(self, request: TurnRequest) -> list[dict[str, Any]] | None:
        """The tools to render: none for `tool_choice: "none"`, only the named one when a
        function is forced (a template cannot force a call; the prompt can narrow the menu)."""
        tools, choice = request.tools or None, request.tool_choice
        if not tools or choice == "none":
            return None
        if isinstance(choice, Mapping):
            name = (choice.get("function") or {}).get("name") or choice.get("name")
            chosen = [t for t in tools if (t.get("function") or {}).get("name") == name]
            if not chosen:
                raise ProxyError(400, f"tool_choice names {name!r}, which is not in tools")
            return chosen
        return tools

    def _read(self, raw: str, finish: str, tools: bool, stops: Any = None) -> TurnChoice:
        text, stop = cut_at_stop(raw, finish, stops)
        parsed = parse_tool_calls(text, self.tool_parser) if tools else ParsedOutput(text)
        self.unparsed_tool_calls += parsed.malformed
        reason = "tool_calls" if parsed.tool_calls and finish == "stop" else finish
        choice = TurnChoice(parsed.content, parsed.tool_calls, reason, raw, parsed.malformed, stop)
        held, key = (
            (self._raw_plain, _text(parsed.content).strip())
            if not choice.tool_calls
            else (self._raw_of, assistant_key(choice.message()))
        )
        if held.get(key, raw) != raw:  # messages rendered by the old text: render them again
            self._rendered = ([], [], [])
        held[key] = raw
        if choice.tool_calls:
            self._by_ids[_call_ids(choice.tool_calls)] = (choice.message(), raw)
        return choice

    def _filled_in(self, message: Mapping[str, Any]) -> str | None:
        """The raw text of an answer sent back with its text, call ids and every argument
        kept but arguments added (an agent filling in its tools' schema defaults: Claude
        Code's Edit adds `replace_all: false`); None for anything else."""
        calls = message.get("tool_calls") or []
        held = self._by_ids.get(_call_ids(calls)) if calls else None
        if held is None:
            return None
        answer, raw = held
        if _text(answer["content"]).strip() != _text(message.get("content")).strip():
            return None
        for ours, theirs in zip(answer["tool_calls"], calls, strict=True):
            mine, sent = _arguments(ours), _arguments(theirs)
            if not all(k in sent and sent[k] == v for k, v in mine.items()):
                return None
        return raw

    async def _complete_tokens(self, request: TurnRequest, max_tokens: int | None) -> TurnResult:
        assert self.managed is not None
        tools = self._tools(request)
        held = list(self.managed.nodes)
        extended: SequenceNode | None = None
        if request.prompt is not None:
            reply = await self.managed.completion(
                prompt=request.prompt, n=request.n, max_tokens=max_tokens, **request.sampling
            )
            raws = [c.text for c in reply.choices]
            finishes = [str(c.finish_reason) for c in reply.choices]
            nodes = self.managed.nodes[-len(raws) :]
            usage = reply.usage
            prompt_len = usage.prompt_tokens if usage else 0
            version = min(
                (n.policy_version for n in nodes if n.policy_version is not None), default=None
            )
        else:
            turn = await self.managed.chat_turn(
                messages=self._render(request.messages),
                n=request.n,
                max_tokens=max_tokens,
                tools=tools,
                **request.sampling,
            )
            raws, finishes, nodes = turn.contents, turn.finish_reasons, turn.nodes
            prompt_len, version = len(turn.prompt_tokens), turn.policy_version
            extended = turn.extended  # (set only for a CLEAN or REALIGN continuation)
        self._count_break(held, nodes)
        for node in nodes:
            parent = extended if request.prompt is None else _longest_prefix(held, node)
            spans = list(self._spans.get(id(parent), [])) if parent is not None else []
            generated = len(node.tokens) - prompt_len
            spans.append(Span(prompt_len, prompt_len + generated, version))
            self._spans[id(node)] = spans
        live = {id(n) for n in self.managed.nodes}
        self._spans = {k: v for k, v in self._spans.items() if k in live}
        stops = request.sampling.get("stop")
        choices = [
            self._read(r, f, tools is not None, stops) for r, f in zip(raws, finishes, strict=True)
        ]
        done = sum(len(n.tokens) - prompt_len for n in nodes)
        return TurnResult(choices, prompt_len, done, self.model, version)

    def _count_break(self, held: list[SequenceNode], nodes: list[SequenceNode]) -> None:
        if not held or not nodes:
            return
        drift = nodes[0].drift
        kind = "new" if drift is None else drift.value
        self.breaks[kind] += 1

    async def _complete_text(self, request: TurnRequest, max_tokens: int | None) -> TurnResult:
        if request.prompt is not None:
            raise ProxyError(
                400,
                "the text completions API needs a server with token ids (vllm, sglang, or"
                " `atropos local serve`); this proxy's server is text-only (server_type openai)",
            )
        tools = self._tools(request)
        kwargs: dict[str, Any] = dict(request.sampling)
        if tools:
            kwargs["tools"] = tools
            if request.tool_choice is not None:
                kwargs["tool_choice"] = request.tool_choice
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        reply = await self.text_server.chat_completion(
            messages=request.messages, n=request.n, **kwargs
        )
        choices = []
        for c in reply.choices:
            calls = [t.model_dump(exclude_none=True) for t in c.message.tool_calls or []]
            finish = str(c.finish_reason or "stop")
            choice = TurnChoice(c.message.content or "", calls, finish, c.message.content or "")
            choices.append(choice)
            self._remember(request.messages, choice.message())
        usage = reply.usage
        return TurnResult(
            choices,
            usage.prompt_tokens if usage else 0,
            usage.completion_tokens if usage else 0,
            self.model,
        )

    def _remember(self, messages: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        """Text-only: keep the chat; a chat that continues a kept one replaces it."""
        chat = [*messages, answer]
        keys = [_message_key(m) for m in chat]
        for i, held in enumerate(self._conversations):
            if [_message_key(m) for m in held] == keys[: len(held)]:
                self._conversations[i] = chat
                self.breaks["clean"] += 1
                return
        if self._conversations:
            self.breaks["new"] += 1
        self._conversations.append(chat)

    # ----- results ------------------------------------------------------------------------

    def trajectory(self) -> Trajectory:
        """The sequences so far, with the session's counts and reward."""
        if self.managed is not None:
            sequences = [self._sequence(node) for node in self.managed.nodes]
        else:
            sequences = [self._retokenized(chat) for chat in self._conversations]
        return Trajectory(
            session_id=self.id,
            sequences=sequences,
            turns=self.turns,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            breaks=dict(self.breaks),
            unparsed_tool_calls=self.unparsed_tool_calls,
            reward=self.reward,
        )

    def _sequence(self, node: SequenceNode) -> Sequence:
        return Sequence(
            tokens=list(node.tokens),
            masks=list(node.masked_tokens),
            logprobs=list(node.logprobs),
            spans=list(self._spans.get(id(node), [])),
            messages=node.messages,
            finish_reason=node.finish_reason,
            token_source=node.token_source,
        )

    def _retokenized(self, chat: list[dict[str, Any]]) -> Sequence:
        from atropos.inference.tokenize import tokenize_for_trainer

        out = tokenize_for_trainer(self.tokenizer, chat, train_on_all_assistant_turns=True)
        return Sequence(
            tokens=out["tokens"],
            masks=out["masks"],
            logprobs=None,
            messages=chat,
            token_source="retokenized",
        )

    def close(self) -> None:
        """Finish the session: no more calls; its sequences stay readable."""
        self.finished = True


def _call_ids(calls: Any) -> str:
    return json.dumps([c.get("id") if isinstance(c, Mapping) else None for c in calls])


def _arguments(call: Any) -> dict[str, Any]:
    """A call's arguments as an object ({} when they are not one)."""
    fn = call.get("function", call) if isinstance(call, Mapping) else {}
    arguments = fn.get("arguments") if isinstance(fn, Mapping) else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def _message_key(message: Mapping[str, Any]) -> str:
    if message.get("role") == "assistant":
        return "assistant:" + assistant_key(message)
    return json.dumps([message.get("role"), _text(message.get("content"))], ensure_ascii=False)


_CONTINUED = (DriftKind.CLEAN, DriftKind.REALIGN)  # the drifts of a node that extends a held one


def _longest_prefix(held: list[SequenceNode], node: SequenceNode) -> SequenceNode | None:
    """The held node whose tokens open `node`'s (the sequence it extended), if any."""
    if node.drift not in _CONTINUED:
        return None
    best = None
    for h in held:  # (a node emptied by `reuse_rows` since is no one's prefix)
        if h.tokens and starts_with(node.tokens, h.tokens):
            if best is None or len(h.tokens) > len(best.tokens):
                best = h
    return best
