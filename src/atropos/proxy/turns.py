"""One model call through the proxy, in the proxy's own terms, whatever API it arrived by.

Every dialect (OpenAI chat and completions, OpenAI Responses, Anthropic Messages) translates its
request into a `TurnRequest` (OpenAI chat messages and function tools, the lingua franca of chat
templates) and its answer out of a `TurnResult`; the session in between generates through the
inference layer and keeps the tokens. A dialect module therefore holds only translation:
`to_turn(body) -> TurnRequest`, `from_turn(result) -> JSON`, and the stream events of a result.

Messages are OpenAI chat messages: `{"role": "system"|"user"|"assistant"|"tool", "content": str
| None, "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": <JSON
string>}}], "tool_call_id": str}`; tools are `{"type": "function", "function": {"name",
"description", "parameters"}}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProxyError", "TurnChoice", "TurnRequest", "TurnResult"]


class ProxyError(Exception):
    """A request the proxy refuses: an HTTP status, a message naming what is wrong and how to
    fix it, and an error type (`invalid_request_error`, `authentication_error`,
    `not_found_error`, `rate_limit_error`, ...); `param` names the request field at fault
    (`max_tokens`, `messages[2].content`) and `code` is OpenAI's machine-readable code, where
    there is one. Each dialect writes it in its own error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code


@dataclass
class TurnRequest:
    """What to generate: the conversation, its tools and the sampling parameters.

    Attributes:
        messages: OpenAI chat messages (see the module docstring), at least one.
        tools: OpenAI function tools, rendered into the prompt by the chat template.
        tool_choice: "auto" (default), "none", "required" or `{"type": "function", "function":
            {"name": ...}}`; "none" leaves the tools out of the prompt and reads no calls.
        n: completions to sample.
        max_tokens: the most tokens per completion (None: the server's default).
        sampling: other sampling parameters by their OpenAI names (`temperature`, `top_p`,
            `stop`, `seed`, `presence_penalty`, `frequency_penalty`).
        prompt: for the text completions API only: a raw prompt instead of `messages`.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    n: int = 1
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None


@dataclass
class TurnChoice:
    """One completion, read as an assistant message.

    Attributes:
        content: its text without the tool calls that were read ("" when it is only calls).
        tool_calls: OpenAI-shaped calls read from it (`atropos.inference.tool_calls`).
        finish_reason: "stop", "length" or "tool_calls" (calls were read and it stopped).
        raw: the completion exactly as decoded (what the tokens say).
        malformed: call-shaped pieces that could not be read (left in `content`).
        stop_sequence: the request's stop string that ended it (cut from `content`, kept in
            `raw`); None when none did.
    """

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    raw: str = ""
    malformed: int = 0
    stop_sequence: str | None = None

    @property
    def text(self) -> str:
        """The completion as the text completions API answers it: `raw` up to its stop string."""
        return self.raw.split(self.stop_sequence, 1)[0] if self.stop_sequence else self.raw

    def message(self) -> dict[str, Any]:
        """The OpenAI chat assistant message of this choice."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        elif message["content"] is None:
            message["content"] = ""
        return message


@dataclass
class TurnResult:
    """What one call produced: the choices, token counts and the model's name."""

    choices: list[TurnChoice]
    prompt_tokens: int
    completion_tokens: int
    model: str
    policy_version: int | None = None
