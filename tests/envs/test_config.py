"""BaseEnvConfig keeps upstream's fields and defaults; ResolvedConfig never writes a secret."""

from __future__ import annotations

import pytest
import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from atropos.envs.config import UPSTREAM_TOKENIZER, BaseEnvConfig, ResolvedConfig, TeacherConfig
from atropos.envs.types import EvalHandlingEnum
from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig

UPSTREAM_DEFAULTS = {  # atroposlib 0.4.0's BaseEnvConfig defaults
    "group_size": 4,
    "max_num_workers": -1,
    "max_eval_workers": 16,
    "max_num_workers_per_node": 8,
    "steps_per_eval": 100,
    "max_token_length": 2048,
    "eval_handling": EvalHandlingEnum.STOP_TRAIN,
    "eval_limit_ratio": 0.5,
    "inference_weight": 1.0,
    "batch_size": -1,
    "max_batches_offpolicy": 3,
    "tokenizer_name": "NousResearch/DeepHermes-3-Llama-3-3B-Preview",
    "use_wandb": True,
    "rollout_server_url": "http://localhost:8000",
    "total_steps": 1000,
    "wandb_name": None,
    "num_rollouts_to_keep": 32,
    "num_rollouts_per_group_for_logging": 1,
    "ensure_scores_are_not_same": True,
    "data_path_to_save_groups": None,
    "data_dir_to_save_evals": None,
    "min_items_sent_before_logging": 2,
    "include_messages": False,
    "min_batch_allocation": None,
    "worker_timeout": 600,
    "thinking_mode": False,
    "reasoning_effort": None,
    "max_reasoning_tokens": None,
    "custom_thinking_prompt": None,
}
CHANGED = {  # our defaults that differ, on purpose: a new env runs offline (docs/environments.md)
    "tokenizer_name": "tiny",
}
ADDITIONS = {
    "rollout_server_api_key": None,
    "env_key": None,
    "spool_dir": None,
    "register_timeout": 600,
    "eval_temperature": 0.0,  # the default `Env.evaluate`'s sampling temperature
    "teacher": TeacherConfig(),  # --teacher.*: off without a base_url
    "pace_staleness": True,  # with an API run with --max-staleness (envs/runner/pacing.py)
    "eval_every": 0,  # serve: evaluate each N-th published policy version (off)
}


def test_every_upstream_field_with_its_default_plus_our_optional_additions():
    config = BaseEnvConfig()
    assert set(BaseEnvConfig.model_fields) == set(UPSTREAM_DEFAULTS) | set(ADDITIONS)
    for name, default in {**UPSTREAM_DEFAULTS, **CHANGED, **ADDITIONS}.items():
        assert getattr(config, name) == default, name
    assert UPSTREAM_DEFAULTS["tokenizer_name"] == UPSTREAM_TOKENIZER  # kept, used when asked for


def test_every_field_has_a_description_for_the_help():
    missing = [n for n, f in BaseEnvConfig.model_fields.items() if not f.description]
    assert not missing


@pytest.mark.parametrize(
    "field, value",
    [
        ("group_size", 0),
        ("max_num_workers", 0),
        ("max_num_workers", -2),
        ("batch_size", 0),
        ("eval_limit_ratio", 1.5),
        ("reasoning_effort", "extreme"),
        ("max_reasoning_tokens", 1023),
        ("max_reasoning_tokens", 32001),
        ("min_batch_allocation", -0.1),
        ("eval_handling", "PAUSE"),
        ("no_such_field", 1),
    ],
)
def test_rules_are_validated(field, value):
    with pytest.raises(ValidationError):
        BaseEnvConfig(**{field: value})


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh"])
def test_every_reasoning_effort_of_upstream_is_accepted(effort):
    assert BaseEnvConfig(reasoning_effort=effort).reasoning_effort == effort


def test_upstream_spellings_of_values_still_validate():
    config = BaseEnvConfig(
        eval_handling="LIMIT_TRAIN", max_num_workers=-1, batch_size=64, max_reasoning_tokens=1024
    )
    assert config.eval_handling is EvalHandlingEnum.LIMIT_TRAIN


class Sampling(BaseModel):
    temperature: float = 1.0
    judge_key: SecretStr | None = None


class SubConfig(BaseEnvConfig):
    split: str = "train"
    """dataset split"""
    sampling: Sampling = Sampling()


def test_subclasses_inherit_the_rules_and_document_fields_by_docstring():
    assert SubConfig.model_fields["split"].description == "dataset split"
    assert SubConfig(group_size=2).split == "train"
    with pytest.raises(ValidationError):
        SubConfig(group_size=0)


def _resolved(servers) -> ResolvedConfig:
    env = SubConfig(
        rollout_server_api_key="rk-secret",
        sampling=Sampling(judge_key="jk-secret"),
        eval_handling="NONE",
    )
    return ResolvedConfig(env, servers, ServerManagerConfig(slurm=True), "serve")


def test_redacted_drops_every_secret_at_any_depth():
    servers = [APIServerConfig(api_key=f"sk-{i}", base_url=f"http://h{i}/v1") for i in range(2)]
    data = _resolved(servers).redacted()
    assert "rollout_server_api_key" not in data["env"]
    assert "judge_key" not in data["env"]["sampling"]
    assert all("api_key" not in s for s in data["openai"])
    assert "secret" not in repr(data) and "sk-" not in repr(data)
    assert data["env"]["eval_handling"] == "NONE"
    assert data["openai"][1]["base_url"] == "http://h1/v1"
    assert data["mode"] == "serve" and data["slurm"] is True and data["max_n_completions"] == 8


def test_redacted_baseline_is_one_mapping():
    data = _resolved(ServerBaseline(model_name="m")).redacted()
    assert data["openai"]["model_name"] == "m" and "base_url" not in data["openai"]


def test_save_writes_yaml_without_secrets(tmp_path):
    servers = [APIServerConfig(api_key="sk-abc", base_url="http://h/v1")]
    path = _resolved(servers).save(tmp_path / "run" / "config.yaml")
    text = path.read_text()
    assert text.startswith("# atropos env serve")
    assert "sk-abc" not in text and "rk-secret" not in text and "jk-secret" not in text
    assert "api_key" not in text
    loaded = yaml.safe_load(text)
    assert loaded["env"]["sampling"] == {"temperature": 1.0}
    assert loaded["openai"][0]["base_url"] == "http://h/v1"
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]  # no temp file left
