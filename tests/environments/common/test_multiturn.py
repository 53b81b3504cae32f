"""`common.multiturn`: the token-server check, the room left for a reply, the group of nodes.

`continue_alone` is tested through the environments that use it (tool_use_multiturn and
mcp_tools: each rollout's later turns extend its own sequence only).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atropos import wire
from atropos.environments.common.multiturn import (
    TEMPLATE_SLACK,
    node_group,
    reply_room,
    require_token_servers,
)
from atropos.envs.config import ConfigError
from atropos.inference.config import APIServerConfig
from atropos.inference.sequence import MASKED, PROMPT_LOGPROB, SequenceNode
from atropos.inference.tokenize import template_ids
from atropos.inference.tokenizer import load_tokenizer


def env_with(*kinds: str) -> SimpleNamespace:
    configs = [APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type=k) for k in kinds]
    return SimpleNamespace(name="episodes", server_configs=configs)


def test_an_openai_server_is_refused_by_name():
    require_token_servers(env_with("vllm", "sglang", "trl"))  # token servers: fine
    with pytest.raises(ConfigError, match=r"^episodes continues .* not an openai one$"):
        require_token_servers(env_with("vllm", "openai"))


def test_the_room_is_what_the_rendered_prompt_leaves():
    tokenizer = load_tokenizer("tiny")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "How far?"}]
    used = len(template_ids(tokenizer, messages, add_generation_prompt=True))
    assert reply_room(tokenizer, messages, 500) == 500 - used
    assert reply_room(tokenizer, messages, 500, TEMPLATE_SLACK) == 500 - used - TEMPLATE_SLACK
    assert reply_room(tokenizer, messages, used) == 0  # no room: the caller stops


def node(reply: list[int], version: int | None) -> SequenceNode:
    prompt = [1, 2, 3]
    return SequenceNode(
        prompt + reply,
        [MASKED] * 3 + reply,
        [PROMPT_LOGPROB] * 3 + [-0.5] * len(reply),
        messages=[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        policy_version=version,
    )


def test_a_group_of_nodes_keeps_their_ids_masks_logprobs_and_the_oldest_version():
    nodes = [node([7, 8], 4), node([9], 2), node([5, 6, 7], None)]
    chats = [n.messages for n in nodes]
    group = node_group(nodes, [1, 0.5, 0], chats)
    assert group["tokens"] == [n.tokens for n in nodes]
    assert group["masks"] == [n.masked_tokens for n in nodes]
    assert group["inference_logprobs"] == [n.logprobs for n in nodes]
    assert group["scores"] == [1.0, 0.5, 0.0] and group["messages"] == chats
    assert group["token_source"] == "server" and group["policy_version"] == 2
    assert "advantages" not in group
    advantages = [[0.0] * len(n.tokens) for n in nodes]
    with_advantages = node_group(nodes, [1, 0.5, 0], chats, advantages)
    assert with_advantages["advantages"] == advantages
    assert wire.check_group(wire.decode_group(wire.encode(with_advantages))) == []
    assert "policy_version" not in node_group(nodes[2:], [0], chats[2:])
