"""An atroposlib-style environment, ported by its imports, passes check_env and runs."""

from __future__ import annotations

from atropos.envs import check_env
from atropos.envs.config import ResolvedConfig
from atropos.envs.layering import resolve_config
from atropos.testing import FakeInferenceServer

from .ported_env import PortedEnv


def test_a_ported_upstream_style_env_passes_the_checks():
    with FakeInferenceServer() as fake:
        config, servers = PortedEnv.config_init()
        servers[0].base_url = fake.base_url
        report = check_env(PortedEnv(config, servers), items=3)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_its_config_init_is_the_base_layer_of_the_cli():
    resolved: ResolvedConfig = resolve_config(PortedEnv, "process")
    assert resolved.env.group_size == 4 and resolved.env.tokenizer_name == "tiny"
    assert resolved.env.include_messages is True  # process mode's default
    assert [s.server_type for s in resolved.servers] == ["vllm"]  # type: ignore[union-attr]
