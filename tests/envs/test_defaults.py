"""Defaults that work on a laptop: an env naming no servers uses the local CPU server, one naming
no tokenizer its servers' ("tiny" for the tiny policy), and the run says so first; what an env
sets itself is kept. Environments name a missing extra at once (exit 2, one line)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import pytest

import atropos.envs.runner
from atropos.envs import Env
from atropos.envs.cli import run_mode
from atropos.envs.config import UPSTREAM_TOKENIZER, BaseEnvConfig
from atropos.envs.layering import Layer, resolve_config
from atropos.inference.config import (
    LOCAL_MODEL_NAME,
    LOCAL_SERVER_URL,
    APIServerConfig,
    ServerBaseline,
    local_server_config,
)
from atropos.install import install_hint


class Plain(Env):
    """A new env as docs/environments.md writes it: no config_init."""

    name = "plain"

    def load(self) -> list[dict[str, Any]]:
        return [{"question": "1+1?", "answer": "2"}]

    def score(self, item: dict[str, Any], completion: str) -> float:
        return 1.0 if item["answer"] in completion else -1.0


class OwnSettings(Plain):
    """An upstream-style env that names its tokenizer and servers."""

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        server = APIServerConfig(base_url="http://gpu:9004/v1", model_name="Org/Model")
        return BaseEnvConfig(tokenizer_name="Org/Tokenizer"), [server]


class Discovered(Plain):
    """An upstream-style env that asks for discovered servers (Slurm or ports 9004-9007)."""

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline]:
        return BaseEnvConfig(group_size=2), ServerBaseline()


class NeedsMissing(Plain):
    name = "needs_missing"
    requires: ClassVar[dict[str, str]] = {"atropos_no_such_module_xyz": "envs"}


@pytest.fixture(autouse=True)
def no_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("ATROPOS_")]:
        monkeypatch.delenv(var)


def flags(**openai: str) -> Layer:
    return Layer("flags", openai=dict(openai) or None)


def test_no_servers_and_no_tokenizer_mean_the_local_server_and_tiny():
    resolved = resolve_config(Plain, "process")
    assert resolved.servers == [local_server_config()]
    assert resolved.env.tokenizer_name == "tiny"
    (note,) = resolved.notes
    assert note.startswith(
        f"no inference server given: using the local CPU server at {LOCAL_SERVER_URL}"
    )
    assert f"(model {LOCAL_MODEL_NAME}, tokenizer tiny)" in note
    assert "atropos local serve" in note and "--openai.base_url" in note


def test_what_an_env_sets_itself_is_kept():
    resolved = resolve_config(OwnSettings, "serve")
    assert resolved.env.tokenizer_name == "Org/Tokenizer"
    assert [s.base_url for s in resolved.servers] == ["http://gpu:9004/v1"]  # type: ignore[union-attr]
    assert resolved.notes == []


def test_asked_for_discovery_keeps_upstreams_defaults():
    resolved = resolve_config(Discovered, "serve")
    assert resolved.servers == ServerBaseline()  # discovered: Slurm, else ports 9004-9007
    assert resolved.env.tokenizer_name == UPSTREAM_TOKENIZER
    assert resolved.notes == [
        f"no tokenizer given: using {UPSTREAM_TOKENIZER}, upstream's default: the servers name"
        " no model (set --env.tokenizer_name to change it)"
    ]


def test_a_given_server_brings_its_models_tokenizer():
    given = flags(base_url="http://gpu:8000/v1", model_name="Qwen/Qwen3-1.7B")
    resolved = resolve_config(Plain, "serve", flags=given)
    assert resolved.env.tokenizer_name == "Qwen/Qwen3-1.7B"
    assert resolved.notes[0].startswith("no tokenizer given: using Qwen/Qwen3-1.7B, the servers'")
    named = Layer("flags", env={"tokenizer_name": "Org/Tok"}, openai={"model_name": "M"})
    resolved = resolve_config(Plain, "serve", flags=named)
    assert resolved.env.tokenizer_name == "Org/Tok" and resolved.notes == []


def test_slurm_and_testing_keep_their_own_servers():
    slurm = resolve_config(Plain, "serve", flags=Layer("flags", manager={"slurm": "true"}))
    assert slurm.servers == ServerBaseline()
    testing = resolve_config(Plain, "process", flags=Layer("flags", manager={"testing": "true"}))
    assert testing.notes == []  # the runner's fake server replaces the servers


def test_the_note_is_the_first_line_of_the_run(monkeypatch, capsys):
    monkeypatch.setattr(atropos.envs.runner, "run", lambda c, r: 0)
    assert run_mode(Plain, "process", [], prog="plain process") == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("plain process: no inference server given: using the local CPU server")


def test_a_missing_extra_is_named_at_once_in_one_line(monkeypatch, capsys):
    ran: list[type] = []
    monkeypatch.setattr(atropos.envs.runner, "run", lambda c, r: ran.append(c) or 0)
    assert run_mode(NeedsMissing, "process", [], prog="atropos env process needs_missing") == 2
    err = capsys.readouterr().err
    assert err == (
        "atropos env process needs_missing: error: needs_missing needs"
        f" atropos-no-such-module-xyz: {install_hint('envs')}\n"
    )
    assert ran == []


def test_built_in_environments_declare_their_extras():
    from atropos.envs import registry

    expected = {
        "gsm8k": {"math_verify": "envs"},
        "math": {"math_verify": "envs"},
        "dataset": {"math_verify": "envs"},
        "eval_gsm8k": {"math_verify": "envs"},
        "blackjack": {"gymnasium": "games"},
        "taxi": {"gymnasium": "games"},
        "visual_counting": {"PIL": "vision"},
        "arithmetic": {},
    }
    assert {n: registry.requirements(registry.get(n)) for n in expected} == expected
