"""What the token-exact multi-turn environments share: their server check, room and groups.

An episode of `deep_research`, `mt_grpo`, `mcp_tools`, `tool_use_multiturn`, `textworld` or a
game is a conversation whose every turn extends the held token ids (`ManagedServer.chat_turn`),
so only a server that gives token ids can play it (`require_token_servers`). Before each reply
the env asks how many tokens it may take (`reply_room`). A group whose first reply is sampled
`n` times in one session goes on with each rollout alone (`continue_alone`). The finished
sequences become one group (`node_group`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.config import ConfigError
from atropos.envs.types import ScoredDataGroup
from atropos.inference.managed import ChatTurn, ManagedServer
from atropos.inference.sequence import SequenceNode
from atropos.inference.tokenize import template_ids

__all__ = [
    "TEMPLATE_SLACK",
    "continue_alone",
    "node_group",
    "reply_room",
    "require_token_servers",
]

TEMPLATE_SLACK = 16  # tokens a template's reasoning switches may add to a rendered prompt


def require_token_servers(env: BaseEnv[Any]) -> None:
    """For `setup`: a ConfigError naming `env` when one of its servers is an `openai` one,
    which gives text, not the token ids an episode is continued by."""
    for config in env.server_configs if isinstance(env.server_configs, list) else []:
        if config.server_type == "openai":
            raise ConfigError(
                f"{env.name} continues each episode by token ids: it needs a token server"
                " (--openai.server_type vllm, sglang or trl), not an openai one"
            )


def reply_room(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    max_token_length: int,
    slack: int = 0,
    tools: list[dict[str, Any]] | None = None,
) -> int:
    """Tokens left for the next reply after `messages` (rendered with `tools` when given, and
    `slack` tokens kept free); below 1: no room."""
    extra = {"tools": tools} if tools else {}
    used = template_ids(tokenizer, messages, add_generation_prompt=True, **extra)
    return max_token_length - len(used) - slack


async def continue_alone(
    session: Any, node: SequenceNode, messages: list[dict[str, Any]], **sampling: Any
) -> ChatTurn:
    """One rollout's next reply after `messages`, extending its sequence `node` on a
    `ManagedServer` of its own over `session`'s pinned server: it holds this node only, so two
    rollouts with the same text never share ids."""
    own = ManagedServer(session.server, session.tokenizer, reasoning=session.reasoning)
    own.nodes = [node]
    return await own.chat_turn(messages=messages, n=1, **sampling)


def node_group(
    nodes: Sequence[SequenceNode],
    scores: Sequence[float],
    messages: Sequence[list[dict[str, Any]] | None],
    advantages: list[list[float]] | None = None,
) -> ScoredDataGroup:
    """The group of token-exact sequences: each node's tokens, masks (the policy's replies
    trained, the rest masked) and the server's logprobs, its conversation in `messages`, the
    `advantages` when given, and the lowest policy version reported."""
    group: dict[str, Any] = {
        "tokens": [n.tokens for n in nodes],
        "masks": [n.masked_tokens for n in nodes],
        "scores": [float(s) for s in scores],
        "inference_logprobs": [n.logprobs for n in nodes],
        "messages": list(messages),
        "token_source": nodes[0].token_source,
    }
    if advantages is not None:
        group["advantages"] = advantages
    versions = [n.policy_version for n in nodes if n.policy_version is not None]
    if versions:
        group["policy_version"] = min(versions)
    return group  # type: ignore[return-value]
