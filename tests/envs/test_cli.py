"""`MyEnv.cli()`: flags from the config models, five layers resolved once for every mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

import atropos.envs.runner
from atropos.envs import cli
from atropos.envs.config import BaseEnvConfig, ConfigError, ResolvedConfig
from atropos.inference.config import APIServerConfig, ServerBaseline

MODES = ["serve", "process", "evaluate"]


class Sampling(BaseModel):
    temperature: float = 1.0
    top_p: float = 1.0


class DummyConfig(BaseEnvConfig):
    split: str = "train"
    """dataset split to load"""
    tags: list[str] = []
    sampling: Sampling = Sampling()


class Dummy:
    """A stand-in environment class: what the CLI needs of BaseEnv and nothing more."""

    name = "dummy"
    env_config_cls = DummyConfig

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline | list[APIServerConfig]]:
        return DummyConfig(group_size=5, max_num_workers=4, total_steps=50), ServerBaseline(
            model_name="m", timeout=30
        )


class Nameless:
    """No config_init, no name: class defaults and the class name are used."""


def with_servers(servers):
    return type(
        "WithServers", (Dummy,), {"config_init": classmethod(lambda c: (DummyConfig(), servers))}
    )


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch):
    for var in [v for v in os.environ if v.startswith("ATROPOS_")]:
        monkeypatch.delenv(var)


@pytest.fixture
def runs(monkeypatch) -> list[ResolvedConfig]:
    seen: list[ResolvedConfig] = []

    def fake_run(env_cls: type, resolved: ResolvedConfig) -> int:
        seen.append(resolved)
        return 0

    monkeypatch.setattr(atropos.envs.runner, "run", fake_run)
    return seen


def parse(*argv: str, env_cls: type = Dummy, mode: str = "serve") -> ResolvedConfig:
    return cli.parse(env_cls, mode, list(argv), prog="dummy")


def write(path: Path, data: object) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_each_layer_overrides_the_one_below(tmp_path, monkeypatch):
    # group_size is set by all five layers, each later field by one layer fewer
    config = write(
        tmp_path / "c.yaml",
        {
            "env": {"group_size": 6, "max_num_workers": 6, "total_steps": 6},
            "openai": {"model_name": "yaml", "timeout": 6, "base_url": "http://yaml/v1"},
            "slurm": True,
            "max_n_completions": 6,
        },
    )
    monkeypatch.setenv("ATROPOS_ENV__GROUP_SIZE", "7")
    monkeypatch.setenv("ATROPOS_ENV__MAX_NUM_WORKERS", "7")
    monkeypatch.setenv("ATROPOS_OPENAI__MODEL_NAME", "environ")
    monkeypatch.setenv("ATROPOS_OPENAI__TIMEOUT", "7")
    monkeypatch.setenv("ATROPOS_MAX_N_COMPLETIONS", "7")
    r = parse("--config", config, "--env.group_size", "8", "--openai.model_name", "flag")
    assert r.env.group_size == 8  # flag
    assert r.env.max_num_workers == 7  # environment variable
    assert r.env.total_steps == 6  # YAML file
    assert r.env.max_token_length == 2048 and r.env.split == "train"  # class defaults
    assert parse().env.total_steps == 50  # config_init
    (server,) = r.servers
    assert (server.model_name, server.timeout, server.base_url) == ("flag", 7, "http://yaml/v1")
    assert r.manager.max_n_completions == 7 and r.manager.slurm is True


def test_negative_numbers_are_values_not_flags():
    r = parse(
        "--env.max_num_workers",
        "-1",
        "--env.inference_weight",
        "-1e-3",
        "--env.steps_per_eval=-5",
        "--env.worker_timeout",
        "-0.5",
    )
    assert r.env.max_num_workers == -1  # upstream turned this into True, then 1
    assert r.env.inference_weight == -0.001
    assert r.env.steps_per_eval == -5 and r.env.worker_timeout == -0.5


def test_equals_and_space_forms_and_kebab_case():
    assert parse("--env.group_size=9").env.group_size == 9
    assert parse("--env.group_size", "9").env.group_size == 9
    assert parse("--env.group-size", "9", "--max-n-completions=3").manager.max_n_completions == 3


def test_eval_every_is_also_a_short_flag():
    assert parse("--eval-every", "4").env.eval_every == 4
    assert parse("--eval_every=3").env.eval_every == 3


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--env.use_wandb", "false"], False),
        (["--env.use_wandb=False"], False),
        (["--env.use_wandb", "0"], False),
        (["--env.use_wandb", "--env.group_size", "2"], True),
        (["--env.use_wandb"], True),
    ],
)
def test_booleans(argv, expected):
    assert parse(*argv).env.use_wandb is expected


def test_bare_manager_switches():
    r = parse("--slurm", "--testing", "false")
    assert r.manager.slurm is True and r.manager.testing is False


def test_none_unsets_optional_values_and_lowercase_none_is_a_string(tmp_path):
    config = write(tmp_path / "c.yaml", {"env": {"data_dir_to_save_evals": "evals"}})
    r = parse(
        "--config",
        config,
        "--env.data_dir_to_save_evals",
        "None",
        "--proxy_url=null",
        "--env.reasoning_effort",
        "none",
    )
    assert r.env.data_dir_to_save_evals is None and r.manager.proxy_url is None
    assert r.env.reasoning_effort == "none"


def test_structured_fields_take_yaml_and_merge_deeply(tmp_path, monkeypatch):
    config = write(tmp_path / "c.yaml", {"env": {"sampling": {"top_p": 0.9}}})
    monkeypatch.setenv("ATROPOS_ENV__TAGS", '["x", "y"]')
    r = parse("--config", config, "--env.sampling", "{temperature: 0.5}")
    assert r.env.tags == ["x", "y"]
    assert r.env.sampling == Sampling(temperature=0.5, top_p=0.9)
    assert parse("--env.tags", "[a, b]").env.tags == ["a", "b"]


def test_unknown_flag_exits_2_with_a_suggestion(runs, capsys):
    assert cli.main(Dummy, ["serve", "--env.gropu_size", "8"], prog="dummy") == 2
    err = capsys.readouterr().err
    assert "unknown flag --env.gropu_size; did you mean --env.group_size?" in err
    assert not runs
    assert cli.main(Dummy, ["serve", "--openai.base-ur=http://h"], prog="dummy") == 2
    assert "did you mean --openai.base_url?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.cli_main(Dummy, ["process", "--slurn"])
    assert exc.value.code == 2 and "did you mean --slurm?" in capsys.readouterr().err


def test_unknown_mode_and_stray_arguments_exit_2(capsys):
    assert cli.main(Dummy, ["serv"], prog="dummy") == 2
    assert "unknown mode 'serv'; did you mean serve?" in capsys.readouterr().err
    assert cli.main(Dummy, ["serve", "extra"], prog="dummy") == 2
    assert "unexpected argument 'extra'" in capsys.readouterr().err
    assert cli.main(Dummy, [], prog="dummy") == 2


def test_bad_values_name_the_flag_the_source_and_the_rule(tmp_path):
    with pytest.raises(ConfigError, match=r"--env.group_size: .*greater than or equal to 1"):
        parse("--env.group_size", "0")
    config = write(tmp_path / "c.yaml", {"env": {"max_reasoning_tokens": 10}})
    with pytest.raises(ConfigError) as exc:
        parse("--config", config)
    assert "--env.max_reasoning_tokens (from " in str(exc.value)
    assert "c.yaml: env.max_reasoning_tokens)" in str(exc.value) and "1024" in str(exc.value)
    with pytest.raises(ConfigError, match=r"--env.max_num_workers: .*must be -1 or at least 1"):
        parse("--env.max_num_workers", "0")


def test_bad_variable_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("ATROPOS_OPENAI__TIMEOUT", "soon")
    with pytest.raises(ConfigError, match=r"--openai.timeout \(from ATROPOS_OPENAI__TIMEOUT\)"):
        parse()


def test_unknown_keys_in_files_and_variables_suggest_the_right_one(tmp_path, monkeypatch):
    bad = write(tmp_path / "c.yaml", {"env": {"gruop_size": 2}})
    with pytest.raises(
        ConfigError, match=r"c.yaml: env.gruop_size: .*did you mean .*env.group_size"
    ):
        parse("--config", bad)
    bad = write(tmp_path / "d.yaml", {"opnai": {}})
    with pytest.raises(ConfigError, match=r"unknown setting; did you mean .*openai\?"):
        parse("--config", bad)
    monkeypatch.setenv("ATROPOS_ENV__GROUPSIZE", "2")
    with pytest.raises(ConfigError, match="did you mean ATROPOS_ENV__GROUP_SIZE"):
        parse()


def test_a_missing_or_malformed_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        parse("--config", str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("env: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse("--config", str(tmp_path / "bad.yaml"))


def test_yaml_list_of_servers(tmp_path):
    servers = [{"base_url": f"http://h{i}/v1", "model_name": "m", "api_key": "k"} for i in (1, 2)]
    config = write(tmp_path / "c.yaml", {"openai": servers})
    r = parse("--config", config)
    assert [s.base_url for s in r.servers] == ["http://h1/v1", "http://h2/v1"]
    assert all(isinstance(s, APIServerConfig) for s in r.servers)
    assert r.servers[0].api_key.get_secret_value() == "k"


def test_yaml_list_plus_any_openai_override_is_an_error(tmp_path, monkeypatch):
    config = write(tmp_path / "c.yaml", {"openai": [{"base_url": "http://a"}, {"base_url": "b"}]})
    with pytest.raises(ConfigError, match=r"--openai.model_name: .*lists 2 servers"):
        parse("--config", config, "--openai.model_name", "m")
    monkeypatch.setenv("ATROPOS_OPENAI__TIMEOUT", "3")
    with pytest.raises(ConfigError, match=r"ATROPOS_OPENAI__TIMEOUT: .*lists 2 servers"):
        parse("--config", config)


def test_yaml_server_entries_are_validated_with_their_position(tmp_path):
    config = write(tmp_path / "c.yaml", {"openai": [{"base_url": "a"}, {"timeout": "x"}]})
    with pytest.raises(ConfigError, match=r"openai\[1\].timeout"):
        parse("--config", config)
    config = write(tmp_path / "d.yaml", {"openai": [{"base_url": "a"}, {"base_ulr": "b"}]})
    with pytest.raises(ConfigError, match=r"openai\[1\].base_ulr: unknown setting; did you mean"):
        parse("--config", config)


def test_a_single_server_list_is_merged_like_a_mapping(tmp_path):
    config = write(tmp_path / "c.yaml", {"openai": [{"base_url": "http://a/v1"}]})
    (server,) = parse("--config", config, "--openai.model_name", "x").servers
    assert (server.base_url, server.model_name, server.timeout) == ("http://a/v1", "x", 30)


@pytest.mark.parametrize("mode", MODES)
def test_openai_settings_promote_a_baseline_in_every_mode(mode, monkeypatch, tmp_path):
    # upstream dropped them silently in process and evaluate
    (server,) = parse("--openai.base_url", "http://h/v1", mode=mode).servers
    assert isinstance(server, APIServerConfig)
    assert (server.base_url, server.model_name, server.timeout) == ("http://h/v1", "m", 30)
    config = write(tmp_path / "c.yaml", {"openai": {"base_url": "http://y/v1"}})
    assert parse("--config", config, mode=mode).servers[0].base_url == "http://y/v1"
    monkeypatch.setenv("ATROPOS_OPENAI__BASE_URL", "http://e/v1")
    assert parse(mode=mode).servers[0].base_url == "http://e/v1"


@pytest.mark.parametrize("mode", MODES)
def test_without_openai_settings_the_baseline_stays(mode):
    assert parse(mode=mode).servers == ServerBaseline(model_name="m", timeout=30)


def test_config_init_servers_are_kept_or_overridden():
    one = with_servers(APIServerConfig(base_url="http://a/v1", api_key="k"))
    (server,) = parse("--openai.timeout", "5", env_cls=one).servers
    assert server.base_url == "http://a/v1" and server.timeout == 5
    assert server.api_key.get_secret_value() == "k"
    two = with_servers([APIServerConfig(base_url="http://a/v1"), APIServerConfig(base_url="b")])
    assert len(parse(env_cls=two).servers) == 2
    with pytest.raises(ConfigError, match="configures 2 servers"):
        parse("--openai.timeout", "5", env_cls=two)


def test_wandb_name_defaults_to_the_env_name():
    assert parse().env.wandb_name == "dummy"
    assert parse(env_cls=Nameless).env.wandb_name == "Nameless"
    assert parse("--env.wandb_name", "mine").env.wandb_name == "mine"
    assert parse("--env.wandb_name", "None").env.wandb_name == "dummy"


def test_process_mode_defaults_and_their_overrides(tmp_path):
    r = parse(mode="process")
    assert r.env.ensure_scores_are_not_same is False and r.env.include_messages is True
    assert r.env.data_path_to_save_groups == "data/dummy.jsonl"
    assert parse(env_cls=Nameless, mode="process").env.data_path_to_save_groups == (
        "data/Nameless.jsonl"
    )
    r = parse(
        "--env.include_messages", "false", "--env.data_path_to_save_groups=o.jsonl", mode="process"
    )
    assert r.env.include_messages is False and r.env.data_path_to_save_groups == "o.jsonl"
    with pytest.raises(ConfigError, match="process mode writes groups to a file"):
        parse("--env.data_path_to_save_groups", "None", mode="process")
    for mode in ("serve", "evaluate"):
        r = parse(mode=mode)
        assert r.env.ensure_scores_are_not_same is True and r.env.include_messages is False
        assert r.env.data_path_to_save_groups is None and r.mode == mode


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("ATROPOS_ENV__GROUP_SIZE", "8")
    monkeypatch.setenv("atropos_env__split", "test")  # names are case-insensitive
    monkeypatch.setenv("ATROPOS_SLURM", "true")
    monkeypatch.setenv("ATROPOS_PROXY_URL", "http://proxy")
    monkeypatch.setenv("ATROPOS_API_KEY", "api-key")
    monkeypatch.setenv("ATROPOS_ENV__WANDB_NAME", "None")
    r = parse()
    assert r.env.group_size == 8 and r.env.split == "test" and r.env.wandb_name == "dummy"
    assert r.manager.slurm is True and r.manager.proxy_url == "http://proxy"
    assert r.env.rollout_server_api_key.get_secret_value() == "api-key"
    assert parse("--env.group_size", "3").env.group_size == 3


def test_secrets_never_reach_the_printout_or_the_saved_file(runs, capsys, tmp_path):
    argv = ["serve", "-v", "--openai.api_key", "sk-cli", "--env.rollout_server_api_key", "rk-cli"]
    assert cli.main(Dummy, [*argv, "--openai.base_url", "http://h/v1"], prog="dummy") == 0
    (r,) = runs
    assert r.servers[0].api_key.get_secret_value() == "sk-cli"
    assert r.env.rollout_server_api_key.get_secret_value() == "rk-cli"
    out = capsys.readouterr()
    assert "http://h/v1" in out.err and "-cli" not in out.err + out.out
    assert "-cli" not in repr(r.redacted())
    assert "-cli" not in r.save(tmp_path / "resolved.yaml").read_text()


def test_an_invalid_secret_is_not_echoed(tmp_path):
    config = write(tmp_path / "c.yaml", {"openai": {"api_key": 12345678}})
    with pytest.raises(ConfigError) as exc:
        parse("--config", config)
    assert "openai.api_key" in str(exc.value) and "12345678" not in str(exc.value)


def test_main_passes_the_runner_exit_code(monkeypatch):
    monkeypatch.setattr(atropos.envs.runner, "run", lambda env_cls, resolved: 3)
    assert cli.main(Dummy, ["evaluate"], prog="dummy") == 3
    with pytest.raises(SystemExit) as exc:
        cli.cli_main(Dummy, ["evaluate"])
    assert exc.value.code == 3


def test_help_lists_generated_flags_with_descriptions_and_defaults(capsys, runs):
    assert cli.main(Dummy, ["process", "--help"], prog="dummy") == 0
    out = capsys.readouterr().out
    assert "--env.split TEXT" in out and "dataset split to load (default: train)" in out
    assert "--env.group_size INT" in out and "(default: 5)" in out
    assert "--openai.base_url" in out and "--slurm [BOOL]" in out and "--config FILE" in out
    assert "(default: data/dummy.jsonl)" in out  # the process mode's default
    assert cli.main(Dummy, ["--help"], prog="dummy") == 0
    assert "evaluate" in capsys.readouterr().out and not runs


def test_a_config_init_returning_the_base_config_is_upgraded():
    base = type(
        "Base",
        (Dummy,),
        {"config_init": classmethod(lambda c: (BaseEnvConfig(group_size=3), ServerBaseline()))},
    )
    r = parse("--env.split", "dev", env_cls=base)
    assert isinstance(r.env, DummyConfig) and r.env.group_size == 3 and r.env.split == "dev"


def test_a_bad_config_init_is_a_type_error():
    bad = type("Bad", (Dummy,), {"config_init": classmethod(lambda c: DummyConfig())})
    with pytest.raises(TypeError, match=r"Bad.config_init\(\) must return"):
        parse(env_cls=bad)
    bad = with_servers("http://h")
    with pytest.raises(TypeError, match="servers must be"):
        parse(env_cls=bad)


def test_saved_file_of_a_run_replays_through_config(tmp_path):
    r = parse("--env.group_size", "7", "--openai.base_url", "http://h/v1", "--slurm")
    data = r.redacted()
    del data["mode"]
    replay = parse("--config", write(tmp_path / "c.yaml", data))
    assert replay.env == r.env and replay.servers == r.servers and replay.manager == r.manager


def test_unparsable_structured_values_name_the_flag():
    with pytest.raises(ConfigError, match=r"--env.tags: cannot parse '\[unclosed'"):
        parse("--env.tags", "[unclosed")
