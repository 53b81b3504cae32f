"""`check_env` on every evaluation-only environment: it checks them through `evaluate()` (they
refuse training items), against a fake server that answers "A" to everything (judges too)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from atropos.envs import registry
from atropos.envs.check import check_env
from atropos.inference.config import local_server_config
from atropos.testing import FakeInferenceServer

EVALS = sorted(
    ep.name
    for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)
    if ep.value.startswith("atropos.environments.evals")
)


def test_every_suite_is_listed():
    assert len(EVALS) >= 23


@pytest.mark.parametrize("name", EVALS)
def test_check_env_passes_on_each_evaluation_suite(name: str, tmp_path: Path):
    env_cls = registry.get(name)
    config, _ = env_cls.config_init()
    config = config.model_copy(update={"data_dir_to_save_evals": str(tmp_path)})
    with FakeInferenceServer(responder=lambda prompt: "A") as fake:
        server = local_server_config("openai").model_copy(update={"base_url": fake.base_url})
        report = check_env(env_cls(config, [server]))
    assert "evaluation only" in report.warnings[0]
