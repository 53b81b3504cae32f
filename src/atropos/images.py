"""Container images without a registry: built here (from a Dockerfile whose bases are present,
or a Debian root from the package mirrors), kept as `docker save` archives under a cache dir,
and loaded from there on a later run or a fresh engine.

A leaf: the standard library only. `atropos sandbox image build` (atropos.cli.sandbox), the
docker sandbox provider and the tests' engine (atropos.testing.docker) share it.

An image that is not present locally is never pulled: `require_image` raises `ImageMissing`,
one line naming the image and the command that builds a stand-in under that name.

>>> stand_in_command("python:3.11-slim")
'atropos sandbox image build python:3.11-slim --debian --include python3,python3-pip'
>>> dockerfile_bases("FROM python:3.11-slim AS base\\nFROM base\\nFROM scratch\\n")
['python:3.11-slim']
>>> archive_name("ghcr.io/a/b:1.0", "abc")
'ghcr.io_a_b_1.0-abc.tar'
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DebianRoot",
    "ImageError",
    "ImageMissing",
    "cache_dir",
    "dockerfile_bases",
    "ensure_image",
    "image_present",
    "require_image",
    "stand_in_command",
]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SUITE = "bookworm"  # what this project's machines' apt sources serve (Debian 12)
# The image's environment: pip installs packages as in the python images (Debian's python3
# is otherwise "externally managed", PEP 668).
DEBIAN_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PIP_BREAK_SYSTEM_PACKAGES=1",
)
INSPECT_TIMEOUT = 30.0


class ImageError(RuntimeError):
    """An image could not be built, saved or loaded; the message says which step and why."""


class ImageMissing(ImageError):
    """An image a task names is not present on the engine, and nothing here pulls it."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"image {name!r} is not present on this Docker engine and is never pulled from a"
            f" registry; build a stand-in under that name: {stand_in_command(name)}"
        )


def stand_in_command(name: str) -> str:
    """The command that builds a Debian stand-in for a registry image called `name`."""
    return f"atropos sandbox image build {name} --debian --include python3,python3-pip"


def docker_program() -> str:
    """The docker client on PATH (ImageError when there is none)."""
    found = shutil.which("docker")
    if found is None:
        raise ImageError("the docker client is not installed (Debian: apt-get install docker.io)")
    return found


def _docker(
    args: Sequence[str], env: Mapping[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker_program(), *args],
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def image_present(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the engine (`DOCKER_HOST` of `env`, else this process's) has image `name`."""
    done = _docker(["image", "inspect", "--format", "{{.Id}}", name], env, INSPECT_TIMEOUT)
    if done.returncode == 0:
        return True
    if "no such image" in done.stderr.lower():
        return False
    raise ImageError(f"docker image inspect {name}: {done.stderr.strip() or done.returncode}")


def require_image(name: str, env: Mapping[str, str] | None = None) -> None:
    """Return if image `name` is present; `ImageMissing` (never a pull) otherwise."""
    if not image_present(name, env):
        raise ImageMissing(name)


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", re.IGNORECASE | re.M)


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile's FROM lines name, less `scratch` and earlier stages."""
    stages: set[str] = set()
    bases: list[str] = []
    for match in _FROM.finditer(text):
        image, stage = match.group(1), match.group(2)
        if image.lower() != "scratch" and image.lower() not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage.lower())
    return bases


def cache_dir() -> Path:
    """Where saved images are kept: `$ATROPOS_IMAGE_CACHE`, else
    `$XDG_CACHE_HOME/atropos/images` (`~/.cache/atropos/images`)."""
    if os.environ.get("ATROPOS_IMAGE_CACHE"):
        return Path(os.environ["ATROPOS_IMAGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "atropos" / "images"


def archive_name(name: str, key: str) -> str:
    """The cache file of image `name` built from the recipe with hash `key`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) + f"-{key}.tar"


@dataclass(frozen=True)
class DebianRoot:
    """A Debian root made by mmdebstrap from the package mirrors, imported as an image."""

    suite: str = DEFAULT_SUITE
    include: tuple[str, ...] = ("python3",)
    mirror: str = DEFAULT_MIRROR
    variant: str = "apt"

    def key(self) -> str:
        recipe = f"debian {self.variant} {self.suite} {','.join(self.include)} {self.mirror}"
        recipe += " " + " ".join(DEBIAN_ENV)
        return hashlib.sha256(recipe.encode()).hexdigest()[:12]

    def build(self, name: str, env: Mapping[str, str] | None, timeout: float) -> None:
        mmdebstrap = shutil.which("mmdebstrap")
        if mmdebstrap is None:
            raise ImageError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
        root = [mmdebstrap, f"--variant={self.variant}", "--format=tar", "--quiet"]
        if self.include:
            root.append("--include=" + ",".join(self.include))
        root += [self.suite, "-", self.mirror]
        load = [docker_program(), "import"]
        for change in DEBIAN_ENV:
            load += ["--change", f"ENV {change}"]
        load += ["--change", 'CMD ["bash"]', "-", name]
        _pipe(root, load, env, timeout)


@dataclass(frozen=True)
class Dockerfile:
    """`docker build` of a context whose Dockerfile's bases are all present locally."""

    context: Path
    dockerfile: Path | None = None
    build_args: tuple[str, ...] = field(default=())

    def path(self) -> Path:
        return self.dockerfile if self.dockerfile is not None else self.context / "Dockerfile"

    def key(self) -> str:
        recipe = self.path().read_bytes() + "\0".join(self.build_args).encode()
        return hashlib.sha256(recipe).hexdigest()[:12]

    def build(self, name: str, env: Mapping[str, str] | None, timeout: float) -> None:
        for base in dockerfile_bases(self.path().read_text()):
            if "$" not in base:  # a build argument: resolved by docker, checked by it
                require_image(base, env)
        args = ["build", "--pull=false", "-q", "-t", name, "-f", str(self.path())]
        for arg in self.build_args:
            args += ["--build-arg", arg]
        done = _docker([*args, str(self.context)], env, timeout)
        if done.returncode != 0:
            raise ImageError(f"docker build {name}: {_tail(done.stderr or done.stdout)}")


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _pipe(
    first: list[str], second: list[str], env: Mapping[str, str] | None, timeout: float
) -> None:
    """`first | second`, both within `timeout`; ImageError quoting the failing one's stderr."""
    env_dict = dict(env) if env is not None else None
    with tempfile.TemporaryFile() as err1, tempfile.TemporaryFile() as err2:
        producer = subprocess.Popen(
            first, stdout=subprocess.PIPE, stderr=err1, stdin=subprocess.DEVNULL, env=env_dict
        )
        assert producer.stdout is not None
        try:
            consumer = subprocess.run(
                second, stdin=producer.stdout, stdout=subprocess.DEVNULL, stderr=err2,
                env=env_dict, timeout=timeout, check=False,
            )  # fmt: skip
        finally:
            producer.stdout.close()
            try:
                producer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                producer.kill()
                producer.wait()
        for process, err, argv in ((producer, err1, first), (consumer, err2, second)):
            if process.returncode != 0:
                err.seek(0)
                said = _tail(err.read().decode(errors="replace"))
                raise ImageError(f"{Path(argv[0]).name} failed ({process.returncode}): {said}")


Recipe = DebianRoot | Dockerfile


def ensure_image(
    name: str,
    recipe: Recipe,
    *,
    env: Mapping[str, str] | None = None,
    cache: Path | None = None,
    rebuild: bool = False,
    timeout: float = 900.0,
) -> str:
    """Make image `name` present: already there (unless `rebuild`), else loaded from the cache's
    archive of this recipe, else built and saved there. Returns how: "present", "loaded" or
    "built"."""
    archive = (cache or cache_dir()) / archive_name(name, recipe.key())
    if not rebuild and image_present(name, env):
        return "present"
    if not rebuild and archive.is_file():
        done = _docker(["load", "-q", "-i", str(archive)], env, timeout)
        if done.returncode == 0 and image_present(name, env):
            return "loaded"
    recipe.build(name, env, timeout)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}")  # renamed when whole
    done = _docker(["save", "-o", str(partial), name], env, timeout)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ImageError(f"docker save {name}: {_tail(done.stderr)}")
    os.replace(partial, archive)
    for other in archive.parent.iterdir():  # this name's archives of older recipes
        stale = re.escape(archive_name(name, "").removesuffix(".tar")) + r"[0-9a-f]{12}\.tar"
        if other != archive and re.fullmatch(stale, other.name):
            other.unlink(missing_ok=True)
    return "built"
