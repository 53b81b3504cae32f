"""Harbor task folders read as they are: `task.toml`, `instruction.md`, `environment/`,
`tests/test.sh`, `solution/solve.sh` (the layout and fields of the `harbor` package 0.25,
`harbor.models.task`). What we run and what we refuse is in docs/harbor.md; every refusal and
every malformed field is one `TaskError` naming the file, the field and the fix.

Choices where Harbor leaves room: unknown keys are ignored (Harbor's models ignore them too);
`[environment] network_mode`/`allow_internet` are read but a sandbox never has the network
(the tasks' own builds and tests run offline); `[environment] env` and `[verifier] env`
values expand `${VAR}` and `${VAR:-default}` from this process's environment, as Harbor does
from the host's.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "SHIPPED_TASKS",
    "Artifact",
    "HarborTask",
    "TaskError",
    "VerifierEnvironment",
    "load_tasks",
    "read_task",
]

SHIPPED_TASKS = Path(__file__).resolve().parents[1] / "data" / "harbor"  # our three tasks

DEFAULT_VERIFIER_TIMEOUT = 600.0  # Harbor's [verifier] timeout_sec default
DEFAULT_BUILD_TIMEOUT = 600.0  # Harbor's [environment] build_timeout_sec default
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GMK])\s*$", re.IGNORECASE)
_REFUSED = {  # table -> key -> why it cannot run here
    "": {"steps": "multi-step tasks ([[steps]]) are not supported; split them into tasks"},
    "verifier": {
        "collect": "[[verifier.collect]] hooks are not supported; snapshot the state to a file"
        " the agent's run leaves under /logs/artifacts (or a path listed in `artifacts`)",
    },
    "environment": {
        "mcp_servers": "MCP servers are not supported; remove [[environment.mcp_servers]]",
        "tpu": "TPUs are not available to a sandbox",
    },
}


class TaskError(ValueError):
    """A Harbor task folder that cannot be run: the message names the file, what is wrong
    and how to fix it."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task folder, read and checked; times in seconds, sizes in bytes."""

    path: Path
    name: str
    instruction: str
    agent_timeout: float | None
    verifier_timeout: float
    build_timeout: float
    docker_image: str | None
    workdir: str | None
    cpus: float | None
    memory_bytes: int | None
    disk_bytes: int | None
    env: Mapping[str, str] = field(default_factory=dict)
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)
    agent_user: str | None = None
    verifier_user: str | None = None
    healthcheck: Mapping[str, Any] | None = None
    verifier_mode: str = "shared"  # or "separate": the verifier in a container of its own
    verifier_environment: VerifierEnvironment | None = None  # [verifier.environment]
    artifacts: tuple[Artifact, ...] = ()  # task.toml's `artifacts`, besides /logs/artifacts

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def compose_file(self) -> Path | None:
        found = self.environment_dir / "docker-compose.yaml"
        return found if found.is_file() else None


@dataclass(frozen=True)
class Artifact:
    """A path of the agent's container handed to a separate verifier (`artifacts`): copied
    from `source` in the agent's container to the same path in the verifier's, less the
    `exclude` patterns (tar's)."""

    source: str
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifierEnvironment:
    """`[verifier.environment]`: the separate verifier's own image and resources (Harbor's
    `EnvironmentConfig`, its defaults: a copy of the task's `[environment]` when unset)."""

    docker_image: str | None
    workdir: str | None
    cpus: float | None
    memory_bytes: int | None
    disk_bytes: int | None
    env: Mapping[str, str] = field(default_factory=dict)


def load_tasks(path: Path | str) -> list[HarborTask]:
    """The task at `path` (a folder with `task.toml`), or every task folder directly under it,
    sorted by name."""
    root = Path(path).expanduser()
    if (root / "task.toml").is_file():
        return [read_task(root)]
    if not root.is_dir():
        raise TaskError(f"{root}: no such folder; --env.tasks takes a Harbor task folder or a"
                        " folder of them")  # fmt: skip
    folders = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise TaskError(f"{root}: holds no task folder (a folder with a task.toml); make one"
                        " with `harbor tasks init`")  # fmt: skip
    return [read_task(folder) for folder in folders]


def read_task(folder: Path) -> HarborTask:
    """The task in `folder`, checked (`TaskError` for anything we cannot run)."""
    config_file = folder / "task.toml"
    try:
        config = tomllib.loads(config_file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise TaskError(f"{config_file}: cannot be read as TOML ({error})") from error
    where = _Where(config_file)
    _refuse(config, where)
    agent, verifier = where.table(config, "agent"), where.table(config, "verifier")
    environment, solution = where.table(config, "environment"), where.table(config, "solution")
    _check_files(folder, environment)
    package = config.get("task") if isinstance(config.get("task"), dict) else {}
    agent_timeout = where.number(agent, "agent", "timeout_sec", None)
    return HarborTask(
        path=folder.resolve(),
        name=str(package.get("name") or folder.name),
        instruction=(folder / "instruction.md").read_text(),
        agent_timeout=agent_timeout,
        verifier_timeout=where.number(verifier, "verifier", "timeout_sec",
                                      DEFAULT_VERIFIER_TIMEOUT) or DEFAULT_VERIFIER_TIMEOUT,
        build_timeout=where.number(environment, "environment", "build_timeout_sec",
                                   DEFAULT_BUILD_TIMEOUT) or DEFAULT_BUILD_TIMEOUT,
        docker_image=where.text(environment, "environment", "docker_image"),
        workdir=where.text(environment, "environment", "workdir"),
        cpus=where.number(environment, "environment", "cpus", None),
        memory_bytes=where.size(environment, "memory_mb", "memory"),
        disk_bytes=where.size(environment, "storage_mb", "storage"),
        env=where.env(environment, "environment"),
        verifier_env=where.env(verifier, "verifier"),
        solution_env=where.env(solution, "solution"),
        agent_user=where.user(agent, "agent"),
        verifier_user=where.user(verifier, "verifier"),
        healthcheck=where.healthcheck(environment),
        verifier_mode=_mode(verifier),
        verifier_environment=where.verifier_environment(verifier),
        artifacts=where.artifacts(config.get("artifacts", [])),
    )  # fmt: skip


def _mode(verifier: dict[str, Any]) -> str:
    """Harbor's resolution: the explicit mode, else separate when [verifier.environment] is
    set, else shared."""
    mode = verifier.get("environment_mode")
    return str(mode) if mode is not None else "separate" if "environment" in verifier else "shared"


def _refuse(config: dict[str, Any], where: _Where) -> None:
    for table, keys in _REFUSED.items():
        values = config if not table else config.get(table) or {}
        for key, why in keys.items():
            if values.get(key):
                raise TaskError(f"{where.file}: {why}")
    verifier = config.get("verifier") or {}
    mode = verifier.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        raise TaskError(f"{where.file}: [verifier] environment_mode must be 'shared' or"
                        f" 'separate', not {mode!r}")  # fmt: skip
    if mode == "shared" and "environment" in verifier:
        raise TaskError(f"{where.file}: [verifier.environment] is set with environment_mode ="
                        " 'shared' (Harbor refuses it too); drop one of them")  # fmt: skip
    tests = where.file.parent / "tests"
    if _mode(verifier) == "separate" and (tests / "docker-compose.yaml").is_file():
        raise TaskError(f"{tests / 'docker-compose.yaml'}: a compose verifier environment is"
                        " not supported; use tests/Dockerfile")  # fmt: skip
    environment = config.get("environment") or {}
    if str(environment.get("os", "linux")).lower() != "linux":
        raise TaskError(f"{where.file}: [environment] os = {environment['os']!r}: only linux"
                        " tasks run here")  # fmt: skip
    if environment.get("gpus"):
        raise TaskError(f"{where.file}: [environment] gpus = {environment['gpus']}: sandboxes"
                        " get no GPU; remove it or set gpus = 0")  # fmt: skip


def _check_files(folder: Path, environment: dict[str, Any]) -> None:
    for name, why in (
        ("instruction.md", "the agent's instruction"),
        ("tests/test.sh", "the verifier, which writes /logs/verifier/reward.txt or reward.json"),
    ):
        if not (folder / name).is_file():
            raise TaskError(f"{folder}: {name} is missing ({why})")
    env_dir = folder / "environment"
    has_build = (env_dir / "Dockerfile").is_file() or (env_dir / "docker-compose.yaml").is_file()
    if not has_build and not environment.get("docker_image"):
        raise TaskError(
            f"{folder}: environment/Dockerfile is missing (or environment/docker-compose.yaml,"
            " or [environment] docker_image in task.toml): nothing says what the sandbox runs"
        )


def expand(value: str, environ: Mapping[str, str] | None = None) -> str:
    """`${VAR}` and `${VAR:-default}` replaced from `environ` (this process's by default).

    >>> expand("a-${X:-b}-${Y}", {"Y": "c"})
    'a-b-c'
    """
    source = os.environ if environ is None else environ

    def one(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in source and (source[name] or default is None):
            return source[name]
        if default is not None:
            return default
        raise TaskError(f"${{{name}}} is not set in the environment and has no default")

    return _ENV_REF.sub(one, value)


@dataclass(frozen=True)
class _Where:
    """Reads typed fields of one task.toml, each error naming the file and the field."""

    file: Path

    def table(self, config: dict[str, Any], name: str) -> dict[str, Any]:
        value = config.get(name, {})
        if not isinstance(value, dict):
            raise TaskError(f"{self.file}: [{name}] must be a table, not {value!r}")
        return value

    def number(
        self, table: dict[str, Any], name: str, key: str, default: float | None
    ) -> float | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise TaskError(f"{self.file}: [{name}] {key} must be a positive number, not {value!r}")
        return float(value)

    def text(self, table: dict[str, Any], name: str, key: str) -> str | None:
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise TaskError(f"{self.file}: [{name}] {key} must be a non-empty string")
        return value

    def size(self, table: dict[str, Any], key: str, legacy: str) -> int | None:
        """`key` in MB, or the deprecated `legacy` ("2G", "512M") Harbor still reads."""
        megabytes = self.number(table, "environment", key, None)
        if megabytes is None and table.get(legacy) is not None:
            match = _SIZE.match(str(table[legacy]))
            if match is None:
                raise TaskError(f"{self.file}: [environment] {legacy} = {table[legacy]!r}: write"
                                f" it like '2G' or '512M', or use {key}")  # fmt: skip
            scale = {"G": 1024, "M": 1, "K": 1 / 1024}[match.group(2).upper()]
            megabytes = float(match.group(1)) * scale
        return None if megabytes is None else int(megabytes * (1 << 20))

    def env(self, table: dict[str, Any], name: str) -> dict[str, str]:
        values = table.get("env", {})
        if not isinstance(values, dict):
            raise TaskError(f"{self.file}: [{name}] env must be a table of strings")
        try:
            return {str(k): expand(str(v)) for k, v in values.items()}
        except TaskError as error:
            raise TaskError(f"{self.file}: [{name}] env: {error}") from None

    def user(self, table: dict[str, Any], name: str) -> str | None:
        value = table.get("user")
        return None if value is None else str(value)

    def verifier_environment(self, verifier: dict[str, Any]) -> VerifierEnvironment | None:
        table = verifier.get("environment")
        if table is None:
            return None
        if not isinstance(table, dict):
            raise TaskError(f"{self.file}: [verifier.environment] must be a table")
        name = "verifier.environment"
        return VerifierEnvironment(
            docker_image=self.text(table, name, "docker_image"),
            workdir=self.text(table, name, "workdir"),
            cpus=self.number(table, name, "cpus", None),
            memory_bytes=self.size(table, "memory_mb", "memory"),
            disk_bytes=self.size(table, "storage_mb", "storage"),
            env=self.env(table, name),
        )

    def artifacts(self, entries: Any) -> tuple[Artifact, ...]:
        if not isinstance(entries, list):
            raise TaskError(f"{self.file}: `artifacts` must be a list of paths or tables")
        found = []
        for entry in entries:
            spec = {"source": entry} if isinstance(entry, str) else entry
            source = spec.get("source") if isinstance(spec, dict) else None
            if not isinstance(source, str) or not source.startswith("/") or ".." in source:
                raise TaskError(f"{self.file}: artifact {entry!r} needs an absolute `source`"
                                " path without '..'")  # fmt: skip
            if spec.get("service") not in (None, "main"):
                service = spec["service"]
                raise TaskError(f"{self.file}: artifact {source} names service {service!r};"
                                " only main's paths are collected")  # fmt: skip
            found.append(Artifact(source, tuple(str(p) for p in spec.get("exclude") or ())))
        return tuple(found)

    def healthcheck(self, environment: dict[str, Any]) -> dict[str, Any] | None:
        check = environment.get("healthcheck")
        if check is None:
            return None
        if not isinstance(check, dict) or not isinstance(check.get("command"), str):
            raise TaskError(f"{self.file}: [environment.healthcheck] needs a command string")
        return check
