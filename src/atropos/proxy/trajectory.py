"""A session's trajectory: the sequences an agent's calls made, ready to become a group.

A sequence is one growing token row: each call whose prompt ids extend the previous call's
prompt and completion ids joins it (the completion's tokens trained, with their logprobs; the
tool results, user turns and template tokens between them masked). A call that does not extend
any held sequence starts a new one, and the break is counted by kind:

- `clean`: the prompt's ids extend a held sequence's ids (the sequence grows);
- `realign`: same text, different tokenization of the held part; the held ids are kept and the
  sequence grows;
- `fork`: the conversation continues a held one by its messages, but the re-rendered prompt
  changed earlier content (an edited or truncated history, a template that drops old reasoning):
  a new sequence starts from the re-rendered prompt;
- `new`: the call continues no held conversation (a sub-agent, a summariser, a fresh task): a
  new sequence starts.

The first call of a session starts the first sequence and counts as none of these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["BREAK_KINDS", "Sequence", "Span", "Trajectory"]

BREAK_KINDS = ("clean", "realign", "fork", "new")


@dataclass
class Span:
    """A generated stretch of a sequence: `tokens[start:end]`, made under `policy_version`
    (None when the server reported none)."""

    start: int
    end: int
    policy_version: int | None = None


@dataclass
class Sequence:
    """One training row of a trajectory.

    Attributes:
        tokens: prompt and completion ids, as the server returned them (or retokenized).
        masks: -100 where the trainer must not learn, the token id where it must.
        logprobs: the server's logprob per token (1.0 on masked positions); None when the
            server gave none (a text-only server: `token_source` "retokenized").
        spans: the generated stretches and the policy version of each.
        messages: the conversation as rendered (the last assistant reply included).
        finish_reason: the last completion's ("stop", "length", "tool_calls").
        token_source: "server" or "retokenized".
    """

    tokens: list[int]
    masks: list[int]
    logprobs: list[float] | None
    spans: list[Span] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    finish_reason: str = ""
    token_source: str = "server"

    @property
    def policy_version(self) -> int | None:
        """The oldest weights that generated any of its tokens (None: unreported)."""
        versions = [s.policy_version for s in self.spans if s.policy_version is not None]
        return min(versions) if versions else None


@dataclass
class Trajectory:
    """Everything a session generated: its sequences, call counts and breaks, and the reward
    posted for it (None until one is)."""

    session_id: str
    sequences: list[Sequence]
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    breaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BREAK_KINDS, 0))
    unparsed_tool_calls: int = 0
    reward: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `GET /sessions/{id}/trajectory`."""
        doc = asdict(self)
        for row, sequence in zip(doc["sequences"], self.sequences, strict=True):
            row["policy_version"] = sequence.policy_version
        return doc
