"""Slurm discovery: hostlist expansion without shell calls, and which servers a manager uses."""

from __future__ import annotations

import pytest

from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig
from atropos.inference.slurm import (
    LOCAL_DEFAULT_URLS,
    expand_hostlist,
    resolve_server_configs,
    slurm_server_urls,
)


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("node01", ["node01"]),
        ("a,b,c", ["a", "b", "c"]),
        (
            "node[01-04,07],gpu-a[1-2]",
            [f"node0{i}" for i in (1, 2, 3, 4, 7)] + ["gpu-a1", "gpu-a2"],
        ),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-node[1,3]", ["rack1-node1", "rack1-node3", "rack2-node1", "rack2-node3"]),
        ("gpu[3]-ib", ["gpu3-ib"]),
        (" x1 , y[2-3] ", ["x1", "y2", "y3"]),
    ],
)
def test_expand_hostlist(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[[1]]", "n[1-]"])
def test_malformed_hostlists_raise(spec: str) -> None:
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(spec)


def test_slurm_urls_skip_training_nodes_and_follow_tp() -> None:
    env = {"SLURM_JOB_NODELIST": "node[1-3]"}
    default = slurm_server_urls(env)  # NUM_TRAINING_NODES and INFER_TP unset: 1 and 1
    assert default == [f"http://node{n}:{9000 + p}/v1" for n in (2, 3) for p in range(8)]
    env |= {"NUM_TRAINING_NODES": "2", "INFER_TP": "2"}
    assert slurm_server_urls(env) == [f"http://node3:{p}/v1" for p in (9000, 9001, 9002, 9003)]
    assert slurm_server_urls(env | {"INFER_TP": "8", "NUM_TRAINING_NODES": "0"}) == [
        "http://node1:9000/v1",
        "http://node2:9000/v1",
        "http://node3:9000/v1",
    ]


def test_slurm_urls_without_slurm_or_with_one_node() -> None:
    assert slurm_server_urls({}) is None
    assert slurm_server_urls({"SLURM_JOB_NODELIST": "solo"}) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"INFER_TP": "two"}, "INFER_TP must be an integer"),
        ({"INFER_TP": "0"}, "INFER_TP must be in 1..8"),
        ({"INFER_TP": "16"}, "INFER_TP must be in 1..8"),
        ({"NUM_TRAINING_NODES": "-1"}, "NUM_TRAINING_NODES must be in 0..2"),
        ({"NUM_TRAINING_NODES": "2"}, "leaves no inference node"),
    ],
)
def test_bad_slurm_settings_raise_clear_errors(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slurm_server_urls({"SLURM_JOB_NODELIST": "n[1-2]", **extra})


def test_resolve_server_configs() -> None:
    slurm_env = {"SLURM_JOB_NODELIST": "g[1-2]", "INFER_TP": "4"}
    base = ServerBaseline(model_name="M", timeout=7, server_type="vllm")
    local = resolve_server_configs(base, ServerManagerConfig(), slurm_env)
    assert [c.base_url for c in local] == list(LOCAL_DEFAULT_URLS)  # slurm is off
    assert {(c.model_name, c.timeout, c.server_type) for c in local} == {("M", 7, "vllm")}

    found = resolve_server_configs(base, ServerManagerConfig(slurm=True), slurm_env)
    assert [c.base_url for c in found] == ["http://g2:9000/v1", "http://g2:9001/v1"]
    single = resolve_server_configs(base, ServerManagerConfig(slurm=True), {})
    assert [c.base_url for c in single] == list(LOCAL_DEFAULT_URLS)

    given = [APIServerConfig(base_url="http://a/v1", api_key="k", server_type="sglang")]
    assert resolve_server_configs(given, ServerManagerConfig(), slurm_env) == given
    assert resolve_server_configs(given[0], ServerManagerConfig(), slurm_env) == given
    templated = resolve_server_configs(given, ServerManagerConfig(slurm=True), slurm_env)
    assert [c.base_url for c in templated] == ["http://g2:9000/v1", "http://g2:9001/v1"]
    assert {c.api_key.get_secret_value() for c in templated} == {"k"}
    assert {c.server_type for c in templated} == {"sglang"}
    with pytest.raises(ValueError, match="empty"):
        resolve_server_configs([], ServerManagerConfig())
