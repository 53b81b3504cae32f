"""The part of a task's `environment/docker-compose.yaml` we run: its `main` service.

Harbor merges the task's compose file over its own base, where `main` is built from the
`environment/` folder and kept alive with `sleep infinity`; the agent and the verifier run in
`main`. We read the same: `main` may set `build` (a context string, or `context`,
`dockerfile`, `args`), `image`, `environment` (a list of `K=V` or a mapping) and
`working_dir`; `${VAR}`/`${VAR:-default}` expand from `CONTEXT_DIR`, `MAIN_IMAGE_NAME`,
`CPUS`, `MEMORY` and this process's environment, as Harbor's infra variables do.

Refused with one error each: services besides `main`, `volumes` (host folders), a build
context outside the task folder. Sidecars would need main on a private `--internal` network
with them; the tests' engine can make one, but main is the docker provider's sandbox,
created with `--network none`, to which Docker adds no network (docs/harbor.md).
Keys that only shape how Docker Compose starts the container
(`command`, `entrypoint`, `init`, `tty`, `network_mode`, `healthcheck`, `restart`,
`platform`, `pull_policy`, `container_name`, resource limits) are ignored: the sandbox starts
it, with the task.toml's limits and no network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from atropos.environments.harbor.task import HarborTask, TaskError, expand, load_tasks

__all__ = ["MainService", "main_service"]

MAIN = "main"  # Harbor's MAIN_SERVICE_NAME


@dataclass(frozen=True)
class MainService:
    """What the compose file says about the `main` service."""

    context: Path | None = None  # build from here (None: `image`)
    dockerfile: Path | None = None
    build_args: tuple[str, ...] = ()
    image: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None


def main_service(task: HarborTask, image_name: str) -> MainService:
    """The task's `main` service: its compose file's, else Harbor's base (built from the
    `environment/` folder)."""
    base = MainService(context=task.environment_dir)
    if task.compose_file is None:
        return base
    where = task.compose_file
    try:
        document = yaml.safe_load(where.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise TaskError(f"{where}: cannot be read as YAML ({error})") from error
    services = document.get("services") if isinstance(document, dict) else None
    if not isinstance(services, dict):
        raise TaskError(f"{where}: needs a `services:` mapping")
    others = sorted(str(name) for name in services if name != MAIN)
    if others:
        raise TaskError(
            f"{where}: services besides `main` ({', '.join(others)}) are not supported: the"
            " task's sandbox is created with no network, so no sidecar can be reached from it;"
            " fold them into main's image (started from the tests or the instruction) or drop"
            " them"
        )
    main = services.get(MAIN) or {}
    if not isinstance(main, dict):
        raise TaskError(f"{where}: services.main must be a mapping")
    if main.get("volumes"):
        raise TaskError(f"{where}: services.main.volumes is not supported (no host folders in"
                        " a sandbox); COPY the files in the Dockerfile instead")  # fmt: skip
    infra = {"CONTEXT_DIR": str(task.environment_dir), "MAIN_IMAGE_NAME": image_name}
    if task.cpus:
        infra["CPUS"] = f"{task.cpus:g}"
    if task.memory_bytes:
        infra["MEMORY"] = f"{task.memory_bytes >> 20}M"
    values = _expanded(main, {**os.environ, **infra}, where)
    return MainService(
        **_build(values, task, where),
        environment=_environment(values.get("environment"), where),
        working_dir=values.get("working_dir"),
    )


def _expanded(value: Any, environ: dict[str, str], where: Path) -> Any:
    if isinstance(value, str):
        try:
            return expand(value, environ)
        except TaskError as error:
            raise TaskError(f"{where}: {error}") from None
    if isinstance(value, dict):
        return {k: _expanded(v, environ, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_expanded(v, environ, where) for v in value]
    return value


def _build(main: dict[str, Any], task: HarborTask, where: Path) -> dict[str, Any]:
    build = main.get("build")
    if build is None:
        if main.get("image"):
            return {"image": str(main["image"])}
        return {"context": task.environment_dir}
    spec = {"context": build} if isinstance(build, str) else build
    if not isinstance(spec, dict):
        raise TaskError(f"{where}: services.main.build must be a path or a mapping")
    context = (task.environment_dir / str(spec.get("context", "."))).resolve()
    if not context.is_relative_to(task.path):
        raise TaskError(f"{where}: services.main.build.context {context} is outside the task"
                        " folder; keep the build context inside it")  # fmt: skip
    dockerfile = context / str(spec.get("dockerfile", "Dockerfile"))
    if not dockerfile.is_file():
        raise TaskError(f"{where}: the main service's Dockerfile {dockerfile} is missing")
    args = spec.get("args") or {}
    listed = [f"{k}={v}" for k, v in args.items()] if isinstance(args, dict) else args
    return {"context": context, "dockerfile": dockerfile,
            "build_args": tuple(str(a) for a in listed)}  # fmt: skip


def _environment(value: Any, where: Path) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        pairs = [str(entry).partition("=") for entry in value]
        return {k: v for k, _, v in pairs}
    raise TaskError(f"{where}: services.main.environment must be a list or a mapping")


def runnable_tasks(path: Path | str) -> list[HarborTask]:
    """The tasks at `path` (`load_tasks`), each compose file checked: one we cannot run fails
    here, at once, not at its first trial."""
    tasks = load_tasks(path)
    for task in tasks:
        main_service(task, "check")
    return tasks
