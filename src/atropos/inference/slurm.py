"""Where the inference servers are when a bare `ServerBaseline` is configured: Slurm or local.

Slurm (`ServerManagerConfig.slurm`): the job's nodes come from `SLURM_JOB_NODELIST`, expanded
here from Slurm's compressed hostlist syntax (no `scontrol` shell call). The first
`NUM_TRAINING_NODES` nodes (default 1) train; every other node serves `8 // INFER_TP` servers
(`INFER_TP` default 1) on ports 9000, 9001, ... at `http://{node}:{port}/v1`. With fewer than
two nodes, or without Slurm, the local default `http://localhost:9004..9007/v1` applies
(atroposlib 0.4.0's rules, without its crashes when `INFER_TP` is set or `NUM_TRAINING_NODES`
is not).

>>> expand_hostlist("node[01-03,07],gpu-a[1-2]")
['node01', 'node02', 'node03', 'node07', 'gpu-a1', 'gpu-a2']
>>> slurm_server_urls({"SLURM_JOB_NODELIST": "n[1-2]", "INFER_TP": "4"})
['http://n2:9000/v1', 'http://n2:9001/v1']
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig

LOCAL_DEFAULT_URLS = tuple(f"http://localhost:{port}/v1" for port in range(9004, 9008))
GPUS_PER_NODE = 8
BASE_PORT = 9000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in hostlist {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str, spec: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise ValueError(f"bad range {item!r} in hostlist {spec!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"descending range {item!r} in hostlist {spec!r}")
        width = len(first)  # Slurm keeps the zero padding of the first number
        values.extend(str(v).zfill(width) for v in range(int(first), int(last) + 1))
    return values


def expand_hostlist(spec: str) -> list[str]:
    """Host names from Slurm's compressed hostlist syntax, in order.

    Handles comma lists, bracketed ranges with zero padding (`node[08-10]`), lists inside the
    brackets (`n[1,3-4]`) and several bracket groups in one name (`r[1-2]n[1-2]`).

    >>> expand_hostlist("r[1-2]n[01-02]")
    ['r1n01', 'r1n02', 'r2n01', 'r2n02']
    >>> expand_hostlist("a1, b2")
    ['a1', 'b2']
    """
    hosts: list[str] = []
    for part in _split_top_level(spec.strip()):
        names = [""]
        for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
            names = [n + literal for n in names]
            if body:
                names = [n + v for n in names for v in _expand_ranges(body, spec)]
        hosts.extend(names)
    return hosts


def _int_env(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")
    return value


def slurm_server_urls(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """Inference server URLs of this Slurm job, or None without Slurm or with one node."""
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST", "").strip()
    if not nodelist:
        return None
    nodes = expand_hostlist(nodelist)
    if len(nodes) < 2:
        return None
    tp = _int_env(env, "INFER_TP", 1, 1, GPUS_PER_NODE)
    training = _int_env(env, "NUM_TRAINING_NODES", 1, 0, len(nodes))
    inference = nodes[training:]
    if not inference:
        raise ValueError(
            f"NUM_TRAINING_NODES={training} leaves no inference node among {len(nodes)} nodes"
        )
    ports = range(BASE_PORT, BASE_PORT + GPUS_PER_NODE // tp)
    return [f"http://{node}:{port}/v1" for node in inference for port in ports]


def _from_template(template: ServerBaseline, url: str) -> APIServerConfig:
    fields = template.model_dump()
    fields["base_url"] = url
    return APIServerConfig(**fields)


def resolve_server_configs(
    configs: Sequence[APIServerConfig] | APIServerConfig | ServerBaseline,
    manager: ServerManagerConfig,
    environ: Mapping[str, str] | None = None,
) -> list[APIServerConfig]:
    """The servers a manager talks to (upstream's rules).

    - one `APIServerConfig`, or a list of them: as given; with `manager.slurm` and two or more
      Slurm nodes, the first entry is the template for every discovered server;
    - a bare `ServerBaseline`: discovered (Slurm when `manager.slurm`), else the local default.
    """
    if isinstance(configs, APIServerConfig):
        configs = [configs]
    if isinstance(configs, ServerBaseline):
        urls = slurm_server_urls(environ) if manager.slurm else None
        return [_from_template(configs, u) for u in urls or LOCAL_DEFAULT_URLS]
    listed = list(configs)
    if not listed:
        raise ValueError("no inference servers configured (an empty list)")
    if manager.slurm and (urls := slurm_server_urls(environ)):
        return [_from_template(listed[0], u) for u in urls]
    return listed
