"""The image a Harbor task's sandbox runs, made present on the Docker engine
(`DOCKER_HOST`) through `atropos.images`: `[environment] docker_image` when the task names
one (never pulled), else the compose file's `main` image, else `docker build` of the main
service's context (`environment/` by default) with `--pull=false`, every `FROM` base checked
present first (an absent one is `ImageMissing`, naming the stand-in command).

A built image is tagged `harbor-<task>:<hash of every file of its context and the build
arguments>`, so an edited task rebuilds and an unchanged one is found present; Docker's layer
cache serves rebuilds. Task images are not saved to the image cache (their bases are).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from atropos.environments.harbor.compose import MainService, main_service
from atropos.environments.harbor.task import HarborTask
from atropos.images import (
    INSPECT_TIMEOUT,
    Dockerfile,
    ImageError,
    docker_program,
    image_present,
    require_image,
)

__all__ = ["TaskImage", "task_image"]


@dataclass(frozen=True)
class TaskImage:
    """An image ready to run, and what the main service adds to the task's environment."""

    name: str
    how: str  # "present" or "built"
    environment: Mapping[str, str]
    working_dir: str | None


def task_image(task: HarborTask, env: Mapping[str, str] | None = None) -> TaskImage:
    """Make the task's image present and name it (`ImageMissing`, `ImageError` when it
    cannot be; `TaskError` for a compose file we do not run)."""
    if task.docker_image is not None:
        require_image(task.docker_image, env)
        return TaskImage(task.docker_image, "present", {}, image_workdir(task.docker_image, env))
    service = main_service(task, built_name(task, None))
    name, how = service.image or built_name(task, service), "present"
    if service.context is None:
        require_image(name, env)
    elif not image_present(name, env):
        recipe = Dockerfile(service.context, service.dockerfile, service.build_args)
        recipe.build(name, env, task.build_timeout)
        how = "built"
    workdir = service.working_dir or image_workdir(name, env)
    return TaskImage(name, how, service.environment, workdir)


def image_workdir(name: str, env: Mapping[str, str] | None) -> str | None:
    """The image's `WORKDIR` (None when it sets none)."""
    done = subprocess.run(
        [docker_program(), "image", "inspect", "--format", "{{.Config.WorkingDir}}", name],
        env=dict(env) if env is not None else None, capture_output=True, text=True,
        timeout=INSPECT_TIMEOUT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ImageError(f"docker image inspect {name}: {done.stderr.strip()}")
    return done.stdout.strip() or None


def built_name(task: HarborTask, service: MainService | None) -> str:
    """`harbor-<task>:<hash>` of the service's build context, Dockerfile and arguments."""
    slug = re.sub(r"[^a-z0-9_.-]+", "-", task.name.lower()).strip("-.") or "task"
    if service is None or service.context is None:
        return f"harbor-{slug}"
    digest = hashlib.sha256()
    for path in sorted(service.context.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(service.context)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    if service.dockerfile is not None:
        digest.update(service.dockerfile.read_bytes())
    digest.update("\0".join(service.build_args).encode())
    return f"harbor-{slug}:{digest.hexdigest()[:12]}"
