"""Environment registry: names mapped to lazily imported `"module:Class"` targets.

Third-party packages register through the `atropos.environments` entry-point group:
`[project.entry-points."atropos.environments"] my-env-v1 = "my_pkg.env:MyEnv"`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import re
from dataclasses import dataclass

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvNotFound",
    "EnvSpec",
    "describe",
    "get",
    "names",
    "register",
    "specs",
]

ENTRY_POINT_GROUP = "atropos.environments"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class EnvNotFound(LookupError):
    """No environment of that name is registered or installed."""


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment: its name, where it lives, and a one-line description."""

    name: str
    target: str | type  # "module:Class", or the class itself
    description: str | None = None
    origin: str = "registered"  # or "entry point (DIST)"


_registered: dict[str, EnvSpec] = {}


def register(name: str, entry_point: str | type, *, description: str | None = None) -> None:
    """Register an environment under `name`; a `"module:Class"` target is imported on lookup.

    Registering the same target again is a no-op; another target under a taken name is an error.

    Args:
        name: the id used on the command line (`atropos env serve NAME`), e.g. `"gsm8k-v1"`.
        entry_point: `"package.module:Class"`, or the class itself.
        description: one line for `atropos env list` (default: the class docstring's first line).

    Raises:
        ValueError: the name or the target is malformed, or the name is taken.

    >>> register("doc-example-v1", "atropos.envs.config:BaseEnvConfig", description="a demo")
    >>> "doc-example-v1" in names()
    True
    >>> _ = _registered.pop("doc-example-v1")  # (tests and doctests only)
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"environment names are letters, digits, '.', '_', '-'; got {name!r}")
    if isinstance(entry_point, str) and not _TARGET.fullmatch(entry_point):
        raise ValueError(f"expected an entry point 'package.module:Class', got {entry_point!r}")
    spec = EnvSpec(name, entry_point, description)
    old = _registered.get(name)
    if old is not None and old.target != entry_point:
        raise ValueError(f"environment {name!r} is already registered as {_show(old.target)}")
    _registered[name] = spec


def specs() -> dict[str, EnvSpec]:
    """Every known environment by name: registered ones, then installed entry points."""
    found: dict[str, EnvSpec] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None)
        origin = f"entry point ({dist})" if dist else "entry point"
        found.setdefault(ep.name, EnvSpec(ep.name, ep.value.split()[0], None, origin))
    return {**found, **_registered}  # an explicit registration wins


def names() -> list[str]:
    """The ids of every known environment, sorted."""
    return sorted(specs())


def get(name: str) -> type:
    """The environment class registered as `name` (imported now), or at `"module:Class"`.

    Raises:
        EnvNotFound: unknown name; the message suggests the closest id and lists them all.
        ImportError: the target's module or attribute cannot be imported.
        TypeError: the target is not a class.
    """
    if ":" in name:
        return _load(name, name)
    known = specs()
    spec = known.get(name)
    if spec is None:
        raise EnvNotFound(_not_found(name, sorted(known)))
    if isinstance(spec.target, type):
        return spec.target
    return _load(name, spec.target)


def describe(name: str) -> str:
    """One line about `name`: its registered description, else its class docstring's first
    line; an import failure is described rather than raised."""
    spec = specs().get(name)
    if spec is not None and spec.description:
        return spec.description
    try:
        cls = get(name)
    except Exception as e:  # `env list` must list broken plugins too
        return f"(unavailable: {e})"
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _load(name: str, target: str) -> type:
    if not _TARGET.fullmatch(target):
        raise ImportError(
            f"environment {name!r}: expected 'package.module:Class', got {target!r}"
            f" (an entry point in group {ENTRY_POINT_GROUP!r} must name the environment class)"
        )
    module_name, _, attr = target.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"environment {name!r}: cannot import {module_name}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"environment {name!r}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(
            f"environment {name!r}: {target} is a {type(obj).__name__}, not a class;"
            " export the environment class itself (a BaseEnv subclass)"
        )
    return obj


def _not_found(name: str, known: list[str]) -> str:
    if not known:
        return (
            f"unknown environment {name!r}: none are installed; register one with"
            f" atropos.envs.registry.register(name, 'module:Class') or an entry point in"
            f" group {ENTRY_POINT_GROUP!r}, or pass 'module:Class' directly"
        )
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown environment {name!r}{hint} (installed: {', '.join(known)})"


def _show(target: str | type) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
