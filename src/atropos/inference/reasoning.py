"""Reasoning controls (`thinking_mode`, `reasoning_effort`, `max_reasoning_tokens`) on every
backend, each sent the way that server takes it.

An environment's three settings become one `Reasoning` (`Reasoning.of(config)`, None when none is
set), which `ServerManager` holds. For chat requests, `ChatPlan.for_server(reasoning, server)`
says what one server's requests get (`ChatPlan.apply`: fields merged under the caller's own, which
always win); for token-level requests (`ManagedServer`, which renders the chat template itself),
`TemplatePlan.for_tokenizer(reasoning, tokenizer)` gives the template's kwargs and the thinking
budget we enforce ourselves (`thinking_budget.py`). What a server cannot take is logged once, when
the plan is made (at setup), never dropped in silence. Text completions (`completion`,
`tokens_and_logprobs_completion` with a raw prompt) get nothing: there is no template to steer.

The mapping, with the documentation it follows, is the table in docs/inference.md.

>>> r = Reasoning(thinking=True, effort="low", max_tokens=2048)
>>> ChatPlan.from_fields(r, "vllm", "http://gpu:8000/v1").fields
{'reasoning_effort': 'low', 'chat_template_kwargs': {'enable_thinking': True, 'thinking': True}, \
'thinking_token_budget': 2048}
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from atropos.inference.thinking_budget import ThinkMarkers

log = logging.getLogger(__name__)

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
Dialect = Literal["openai", "openrouter", "compatible", "vllm", "sglang", "trl"]
Warn = Callable[[str], None]

TEMPLATE_SWITCHES = ("enable_thinking", "thinking")
"""Chat-template variables that turn thinking on or off: Qwen3 and its kin read
`enable_thinking`, DeepSeek-V3.1, Granite and Holo2 read `thinking` (vLLM's reasoning docs)."""

OPENAI_DEFAULT_ONLY = {"temperature": 1, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0}
"""Sampling fields OpenAI's reasoning models refuse at any value but their default while they
reason (any effort but "none")."""


@dataclass(frozen=True)
class Reasoning:
    """What an environment asks of the policy's reasoning.

    Attributes:
        thinking: turn the model's thinking on (True) or off (False); None leaves its default.
        effort: the reasoning effort, as OpenAI names the levels.
        max_tokens: the most tokens the reasoning block may take.
    """

    thinking: bool | None = None
    effort: Effort | None = None
    max_tokens: int | None = None

    @classmethod
    def of(cls, config: Any) -> Reasoning | None:
        """The reasoning an env config asks for (its `thinking_mode`, `reasoning_effort` and
        `max_reasoning_tokens`), or None when it asks for nothing.

        Any effort but "none", or a budget, implies thinking (as upstream's `thinking_mode`
        "set automatically"); effort "none" turns it off, whatever `thinking_mode` says.

        >>> Reasoning.of(object()) is None
        True
        >>> class Config:
        ...     thinking_mode, reasoning_effort, max_reasoning_tokens = False, "none", None
        >>> Reasoning.of(Config())
        Reasoning(thinking=False, effort='none', max_tokens=None)
        """
        mode = bool(getattr(config, "thinking_mode", False))
        effort = getattr(config, "reasoning_effort", None)
        budget = getattr(config, "max_reasoning_tokens", None)
        if effort == "none":
            thinking: bool | None = False
        elif mode or effort is not None or budget is not None:
            thinking = True
        else:
            return None
        reasoning = cls(thinking, effort, budget)
        for note in reasoning.conflicts(mode):
            log.warning("%s", note)
        return reasoning

    def conflicts(self, thinking_mode: bool) -> list[str]:
        """What in these settings contradicts itself (effort "none" wins)."""
        notes = []
        if self.effort == "none" and thinking_mode:
            notes.append("thinking_mode is on but reasoning_effort 'none' turns reasoning off")
        if self.effort == "none" and self.max_tokens is not None:
            notes.append(
                f"max_reasoning_tokens {self.max_tokens} is ignored: reasoning_effort 'none'"
                " turns reasoning off"
            )
        return notes

    def template_kwargs(self) -> dict[str, Any]:
        """Every chat-template kwarg these settings set (`TemplatePlan` keeps those a template
        reads)."""
        kwargs: dict[str, Any] = {}
        if self.thinking is not None:
            kwargs.update(dict.fromkeys(TEMPLATE_SWITCHES, self.thinking))
        if self.effort is not None:
            kwargs["reasoning_effort"] = self.effort
        return kwargs

    @property
    def budget(self) -> int | None:
        """The reasoning budget that applies (None when reasoning is off)."""
        return None if self.thinking is False else self.max_tokens


def dialect_of(server_type: str, base_url: str) -> Dialect:
    """How a server takes reasoning controls: by `server_type`, and for "openai" by host.

    >>> dialect_of("openai", "https://api.openai.com/v1"), dialect_of("vllm", "http://h/v1")
    ('openai', 'vllm')
    >>> dialect_of("openai", "https://openrouter.ai/api/v1")
    'openrouter'
    >>> dialect_of("openai", "http://127.0.0.1:9001/v1")
    'compatible'
    """
    if server_type in ("vllm", "sglang", "trl"):
        return server_type  # type: ignore[return-value]
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "api.openai.com" or host.endswith(".openai.azure.com"):
        return "openai"
    if host == "openrouter.ai" or host.endswith(".openrouter.ai"):
        return "openrouter"
    return "compatible"


def merge_under(kwargs: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
    """`kwargs` with `fields` added to its `extra_body`: a field the caller already gave (at the
    top level or in `extra_body`) is kept as the caller gave it, and for an object field (such
    as `chat_template_kwargs`) only the caller's keys are kept over ours.

    >>> merge_under({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ...             {"chat_template_kwargs": {"enable_thinking": True, "thinking": True}})
    {'extra_body': {'chat_template_kwargs': {'enable_thinking': False, 'thinking': True}}}
    """
    out = dict(kwargs)
    extra = dict(out.get("extra_body") or {})
    for key, ours in fields.items():
        where = out if key in out else extra if key in extra else None
        if where is None:
            extra[key] = ours
        elif isinstance(ours, dict) and isinstance(where[key], dict):
            where[key] = {**ours, **where[key]}
    out["extra_body"] = extra
    return out


def _openrouter(reasoning: Reasoning) -> dict[str, Any]:
    """OpenRouter's `reasoning` object: a budget, or else an effort, or else on/off."""
    if reasoning.budget is not None:
        return {"max_tokens": reasoning.budget}
    if reasoning.effort is not None:
        return {"effort": reasoning.effort}
    return {"enabled": bool(reasoning.thinking)}


def _fields(reasoning: Reasoning, dialect: Dialect) -> dict[str, Any]:
    """The body fields a chat request to a server of `dialect` gets (see docs/inference.md)."""
    if dialect == "openrouter":
        return {"reasoning": _openrouter(reasoning)}
    fields: dict[str, Any] = {}
    if dialect == "trl":  # TRL's backend renders the template here: everything goes in it
        kwargs = reasoning.template_kwargs()
        return {"chat_template_kwargs": kwargs} if kwargs else {}
    if reasoning.effort is not None:
        fields["reasoning_effort"] = reasoning.effort
    if dialect in ("vllm", "sglang") and reasoning.thinking is not None:
        fields["chat_template_kwargs"] = dict.fromkeys(TEMPLATE_SWITCHES, reasoning.thinking)
    if dialect == "vllm" and reasoning.budget is not None:
        fields["thinking_token_budget"] = reasoning.budget
    if dialect == "sglang" and reasoning.budget is not None:
        fields["custom_params"] = {"thinking_budget": reasoning.budget}
    if dialect == "sglang" and reasoning.thinking:
        fields["separate_reasoning"] = False  # keep the block in `content`, as other servers do
    return fields


def _chat_warnings(reasoning: Reasoning, dialect: Dialect, where: str) -> list[str]:
    """What chat requests to this server cannot carry, to log once at setup."""
    budget = reasoning.budget
    notes = []
    if budget is not None and dialect in ("openai", "compatible", "trl"):
        why = {
            "openai": "OpenAI's chat completions take no reasoning budget (max_completion_tokens"
            " bounds reasoning and answer together)",
            "compatible": "an OpenAI-compatible server has no standard reasoning budget (use"
            " server_type vllm or sglang for servers that enforce one)",
            "trl": "TRL's vllm-serve takes no reasoning budget",
        }[dialect]
        notes.append(
            f"max_reasoning_tokens {budget} is not applied to chat requests to {where}: {why};"
            " token-level generation (managed_server) enforces it itself"
        )
    if budget is not None and dialect == "sglang":
        notes.append(
            f"max_reasoning_tokens {budget} is sent to {where} as custom_params.thinking_budget,"
            " which SGLang enforces only when started with --enable-strict-thinking and a"
            " --reasoning-parser (else it is ignored)"
        )
    if budget is not None and dialect == "openrouter" and reasoning.effort is not None:
        notes.append(
            f"reasoning_effort {reasoning.effort!r} is not sent to {where}: OpenRouter takes"
            f" one of reasoning.effort and reasoning.max_tokens, and gets max_tokens {budget}"
        )
    return notes


class WarnOnce:
    """Log each distinct warning once (per holder: one per `ServerManager`)."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self.logger = logger
        self.seen: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.seen:
            self.seen.add(message)
            self.logger.warning("%s", message)


@dataclass
class ChatPlan:
    """What chat requests to one server get, made once per server.

    Attributes:
        fields: body fields merged under the caller's (`merge_under`).
        effort: the effort sent to OpenAI itself, whose reasoning models also change which
            sampling fields they take (`apply`); None for every other server.
        warn: where `apply` reports a field it had to drop.
    """

    fields: dict[str, Any]
    effort: str | None = None
    warn: Warn = field(default_factory=WarnOnce)

    @classmethod
    def from_fields(
        cls, reasoning: Reasoning, dialect: Dialect, where: str, warn: Warn | None = None
    ) -> ChatPlan:
        """The plan of one server; what it cannot carry is reported through `warn` now."""
        warn = warn or WarnOnce()
        for note in _chat_warnings(reasoning, dialect, where):
            warn(note)
        effort = reasoning.effort if dialect == "openai" else None
        return cls(_fields(reasoning, dialect), effort, warn)

    @classmethod
    def for_server(cls, reasoning: Reasoning, config: Any, warn: Warn | None = None) -> ChatPlan:
        """The plan of the server `config` (an `APIServerConfig`) describes."""
        dialect = dialect_of(config.server_type, config.base_url)
        return cls.from_fields(reasoning, dialect, config.base_url, warn)

    def apply(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`chat_completion` kwargs with this server's reasoning fields (none when the caller
        passes `skip_reasoning=True`, as upstream's flag did)."""
        if kwargs.get("skip_reasoning") or not (self.fields or self.effort):
            return kwargs
        out = merge_under(kwargs, self.fields)
        if self.effort is not None:
            out = self._openai_rules(out)
        return out

    def _openai_rules(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """OpenAI's reasoning models refuse `max_tokens` (`max_completion_tokens` is taken by
        every current model) and, while reasoning, non-default sampling values: those are
        dropped, and the drop is reported once."""
        if "max_tokens" in kwargs:
            limit = kwargs.pop("max_tokens")
            kwargs.setdefault("max_completion_tokens", limit)
        if self.effort == "none":
            return kwargs
        for key, default in OPENAI_DEFAULT_ONLY.items():
            value = kwargs.get(key)
            if value is not None and value != default:
                del kwargs[key]
                self.warn(
                    f"{key}={value} is not sent to OpenAI: its reasoning models take only the"
                    f" default ({default}) while reasoning_effort is {self.effort!r}"
                )
        return kwargs


def template_reads(template: Any, name: str) -> bool:
    """Whether a chat template (a string, or a dict of named templates) mentions `name`.

    >>> template_reads("{% if enable_thinking %}<think>{% endif %}", "enable_thinking")
    True
    >>> template_reads({"default": "{{ messages }}"}, "thinking")
    False
    """
    texts: Iterable[Any] = template.values() if isinstance(template, dict) else [template]
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(isinstance(t, str) and pattern.search(t) for t in texts)


@dataclass(frozen=True)
class TemplatePlan:
    """What token-level generation with one tokenizer gets (`ManagedServer`).

    Attributes:
        kwargs: chat-template kwargs, those of `Reasoning.template_kwargs` the template reads.
        budget: the reasoning budget we enforce, when the tokenizer marks reasoning blocks.
        markers: the tokenizer's reasoning-block tokens (None: it has none).
    """

    kwargs: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None
    markers: ThinkMarkers | None = None

    @classmethod
    def for_tokenizer(
        cls, reasoning: Reasoning | None, tokenizer: Any, warn: Warn | None = None
    ) -> TemplatePlan:
        """The plan for `tokenizer`; what it cannot carry is reported through `warn` now."""
        if reasoning is None:
            return cls()
        warn = warn or WarnOnce()
        template = getattr(tokenizer, "chat_template", None) or ""
        wanted = reasoning.template_kwargs()
        kwargs = {k: v for k, v in wanted.items() if template_reads(template, k)}
        name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
        for note in _template_warnings(reasoning, kwargs, name):
            warn(note)
        budget, markers = reasoning.budget, None
        if budget is not None:
            markers = ThinkMarkers.of(tokenizer)
            if markers is None:
                warn(
                    f"max_reasoning_tokens {budget} is not enforced on token-level generation:"
                    f" tokenizer {name} has no <think> and </think> tokens to find the"
                    " reasoning block by"
                )
                budget = None
        return cls(kwargs, budget, markers)


def _template_warnings(reasoning: Reasoning, used: Mapping[str, Any], name: str) -> list[str]:
    """What the chat template does not read. `thinking_mode` alone is not reported: the
    environment's own thinking prompt is how it asks a model whose template has no switch."""
    effort = reasoning.effort
    if effort is None or "reasoning_effort" in used:
        return []
    if effort == "none" and not used:
        return [
            f"reasoning_effort 'none' does not change token-level prompts: the chat template of"
            f" {name} reads none of {', '.join(TEMPLATE_SWITCHES)}, reasoning_effort"
        ]
    if effort != "none":
        switched = f" (only {', '.join(used)}=True is passed)" if used else ""
        return [
            f"reasoning_effort {effort!r} does not change token-level prompts: the chat template"
            f" of {name} does not read reasoning_effort{switched}"
        ]
    return []
