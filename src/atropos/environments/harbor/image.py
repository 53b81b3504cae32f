"""The image a Harbor task's sandbox runs, made present on the Docker engine
(`DOCKER_HOST`) through `atropos.images`: `[environment] docker_image` when the task names
one (never pulled), else the compose file's `main` image, else `docker build` of the main
service's context (`environment/` by default) with `--pull=false`, every `FROM` base checked
present first (an absent one is `ImageMissing`, naming the stand-in command).

A built image is tagged `harbor-<task>:<hash of every file of its context and the build
arguments>`, so an edited task rebuilds and an unchanged one is found present. Built images
are saved to the image cache (`atropos.images.ensure_image`, keyed by that same hash), so a
fresh engine loads them instead of building again, as it does the bases.

A separate verifier (`environment_mode = "separate"`) gets its own image, as in Harbor
(`harbor.models.task.verifier_mode.resolve_verifier_environment_definition`):
`[verifier.environment] docker_image`, else `tests/Dockerfile` built with `tests/` as the
context (`harbor-<task>-verifier:<hash>`); both carry the tests (Harbor uploads none), else
the task's own image, into which the tests are copied.

The engine builds offline: a `FROM` base that is absent is `ImageMissing` (the stand-in
command); a `COPY --from=` image that is absent, or a build that fails or runs past
`build_timeout_sec`, is an `ImageError` whose message says the build may need the network
and how to provide the image instead (build it where there is network and `docker load` it
under its name, or build a stand-in under that name).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field

from atropos.environments.harbor.compose import MainService, main_service
from atropos.environments.harbor.task import HarborTask
from atropos.images import (
    INSPECT_TIMEOUT,
    Dockerfile,
    ImageError,
    ImageMissing,
    docker_program,
    ensure_image,
    image_present,
    require_image,
    stand_in_command,
)

__all__ = ["ImageFailure", "TaskImage", "TaskImages", "task_image", "verifier_image"]

_COPY_FROM = re.compile(r"^\s*COPY\s+(?:--\S+\s+)*?--from=(\S+)", re.IGNORECASE | re.M)
_STAGE = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*\S+\s+AS\s+(\S+)", re.IGNORECASE | re.M)


@dataclass(frozen=True)
class TaskImage:
    """An image ready to run, and what the main service adds to the task's environment."""

    name: str
    how: str  # "present" or "built"
    environment: Mapping[str, str]
    working_dir: str | None
    bundles_tests: bool = False  # a verifier image that holds /tests already


@dataclass(frozen=True)
class ImageFailure:
    """A task whose image (or separate verifier's) could not be made: `image_missing` (a
    base not on the engine) or `image_build`, with the message saying how to provide it."""

    reason: str
    detail: str


Images = tuple[TaskImage, TaskImage | None]


@dataclass
class TaskImages:
    """Each task's image and its separate verifier's, made once per run (at most one build
    per task at a time; a failure is kept, so it is not retried every rollout)."""

    made: dict[str, Images | ImageFailure] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    async def of(self, task: HarborTask) -> Images | ImageFailure:
        """`task`'s images (the verifier's None unless it runs separate), or why not."""
        async with self.locks.setdefault(task.name, asyncio.Lock()):
            if task.name not in self.made:
                self.made[task.name] = await asyncio.to_thread(_make, task)
        return self.made[task.name]


def _make(task: HarborTask) -> Images | ImageFailure:
    env = dict(os.environ)
    try:
        main = task_image(task, env)
        return main, verifier_image(task, env) if task.verifier_mode == "separate" else None
    except ImageMissing as error:
        return ImageFailure("image_missing", str(error))
    except ImageError as error:
        return ImageFailure("image_build", str(error))


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
    else:
        recipe = TaskBuild(service.context, service.dockerfile, service.build_args)
        how = build(name, recipe, env, task.build_timeout)
    workdir = service.working_dir or image_workdir(name, env)
    return TaskImage(name, how, service.environment, workdir)


def verifier_image(task: HarborTask, env: Mapping[str, str] | None = None) -> TaskImage | None:
    """A separate verifier's own image (None: the task's image, the tests copied in)."""
    own = task.verifier_environment
    if own is not None and own.docker_image is not None:
        require_image(own.docker_image, env)
        workdir = own.workdir or image_workdir(own.docker_image, env)
        return TaskImage(own.docker_image, "present", {}, workdir, bundles_tests=True)
    if not (task.tests_dir / "Dockerfile").is_file():
        return None
    recipe = TaskBuild(task.tests_dir)
    name = f"{built_name(task, None)}-verifier:{recipe.key()}"
    how = build(name, recipe, env, task.build_timeout)
    workdir = (own.workdir if own else None) or image_workdir(name, env)
    return TaskImage(name, how, {}, workdir, bundles_tests=True)


@dataclass(frozen=True)
class TaskBuild(Dockerfile):
    """A task's Dockerfile build, keyed by every file of its context (not only the
    Dockerfile), so the cached archive is that of this exact folder."""

    def key(self) -> str:
        digest = hashlib.sha256()
        for path in sorted(self.context.rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(self.context)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
        if self.dockerfile is not None:
            digest.update(self.dockerfile.read_bytes())
        digest.update("\0".join(self.build_args).encode())
        return digest.hexdigest()[:12]


def build(name: str, recipe: TaskBuild, env: Mapping[str, str] | None, timeout: float) -> str:
    """`ensure_image` of a task's build (present, loaded from the cache, or built and saved),
    offline: an absent `COPY --from` image is refused before docker would pull it, and a
    failed or overlong build says how to provide the image instead."""
    if image_present(name, env):  # built or provided (`docker load`) under its name
        return "present"
    text = recipe.path().read_text()
    stages = {m.lower() for m in _STAGE.findall(text)}
    for source in _COPY_FROM.findall(text):
        if source.lower() in stages or source.isdigit() or "$" in source:
            continue
        if not image_present(source, env):
            raise ImageError(needs_network(name, recipe, f"COPY --from={source} names an"
                                           " image that is not on this engine"))  # fmt: skip
    try:
        return ensure_image(name, recipe, env=env, timeout=timeout)
    except ImageMissing:
        raise
    except subprocess.TimeoutExpired:
        raise ImageError(needs_network(name, recipe, f"the build ran past {timeout:g} s"
                                       " (build_timeout_sec)")) from None  # fmt: skip
    except ImageError as error:
        raise ImageError(needs_network(name, recipe, str(error))) from None


def needs_network(name: str, recipe: TaskBuild, why: str) -> str:
    """The `image_build` message: what failed, and the two ways to provide the image."""
    where = recipe.path()
    return (
        f"{where}: {why}. This engine builds without network, so a step that fetches"
        " (RUN pip/uv/apt-get/curl, COPY --from a registry image) cannot run here; provide"
        f" {name} instead: build it where there is network and `docker load` it here under"
        f" that name, or build a stand-in: {stand_in_command(name)}"
    )


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
    recipe = TaskBuild(service.context, service.dockerfile, service.build_args)
    return f"harbor-{slug}:{recipe.key()}"
