"""`common.multiturn`: the token-server check and the room left for a reply.

`continue_alone` is tested through the environments that use it (tool_use_multiturn and
mcp_tools: each rollout's later turns extend its own sequence only).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atropos.environments.common.multiturn import TEMPLATE_SLACK, reply_room, require_token_servers
from atropos.envs.config import ConfigError
from atropos.inference.config import APIServerConfig
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
