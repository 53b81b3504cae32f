"""Environment registry: names mapped to lazily imported `"module:Class"` targets.

Third-party packages register through the `atropos.environments` entry-point group:
`[project.entry-points."atropos.environments"] my-env-v1 = "my_pkg.env:MyEnv"`
(`atropos env new NAME` writes such a package). Each environment's `origin` says where it comes
from: `built in` (ours), `DIST VERSION` (another installed package), or `registered`. A broken
plugin never breaks the listing: `describe` reports its error in one line, and a distribution
whose entry points cannot be read at all is skipped and named by `unreadable_plugins()`.

`get` also takes what a user points at directly: `package.module:Class` (found from the current
directory too), `path/to/env.py:Class`, or `path/to/env.py` alone when the file defines one
environment class; and a remote environment's spec, `ors:URL#ENV` or `openenv:URL`
(`atropos.interop`, imported by name only then: it sits above this layer).

An environment declares the optional modules it cannot run without, each with the extra of
`atropos-rl` that installs it: `requires = {"math_verify": "envs"}` on the class or a base.
`missing_extras` checks them before a run, so a missing one is named at once, in one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from atropos.install import DISTRIBUTION, install_hint
from atropos.names import did_you_mean

__all__ = [
    "ENTRY_POINT_GROUP",
    "EnvNotFound",
    "EnvSpec",
    "describe",
    "get",
    "missing_extras",
    "names",
    "requirements",
    "register",
    "specs",
    "unreadable_plugins",
]

ENTRY_POINT_GROUP = "atropos.environments"
_PIP_NAMES = {  # importable module -> the package pip installs it from, where they differ
    "math_verify": "math-verify",
    "PIL": "pillow",
    "sentence_transformers": "sentence-transformers",
}
BUILT_IN = "built in"  # the origin of our own environments
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_EXTRAS = re.compile(r"\s*\[[^\]]*\]\s*$")  # an entry point's trailing `[extra, ...]`


class EnvNotFound(LookupError):
    """No environment of that name is registered or installed."""


@dataclass(frozen=True)
class EnvSpec:
    """One registered environment: its name, where it lives, and a one-line description."""

    name: str
    target: str | type  # "module:Class", or the class itself
    description: str | None = None
    origin: str = "registered"  # or BUILT_IN, "DIST VERSION", "entry point", a remote's URL

    @property
    def source(self) -> str:
        """`builtin`, `plugin` (an installed package's entry point), `registered`, or the
        protocol of a remote environment (`ors`, `openenv`)."""
        if isinstance(self.target, str) and _remote(self.target):
            return self.target.partition(":")[0]
        if self.origin == BUILT_IN:
            return "builtin"
        return "registered" if self.origin == "registered" else "plugin"


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
    remote = isinstance(entry_point, str) and _remote(entry_point)
    if isinstance(entry_point, str) and not remote and not _TARGET.fullmatch(entry_point):
        raise ValueError(f"expected an entry point 'package.module:Class', got {entry_point!r}")
    spec = EnvSpec(name, entry_point, description, _registered_origin(entry_point))
    old = _registered.get(name)
    if old is not None and old.target != entry_point:
        raise ValueError(f"environment {name!r} is already registered as {_show(old.target)}")
    _registered[name] = spec


def specs() -> dict[str, EnvSpec]:
    """Every known environment by name: registered ones, then installed entry points.

    An entry point's value is its target (less any `[extras]`), malformed or not: looking it
    up then says what is wrong with it.
    """
    found: dict[str, EnvSpec] = {}
    for ep in _entry_points()[0]:
        target = _EXTRAS.sub("", ep.value).strip()
        found.setdefault(ep.name, EnvSpec(ep.name, target, None, _entry_point_origin(ep)))
    return {**found, **_registered}  # an explicit registration wins


def unreadable_plugins() -> list[str]:
    """One line for each installed distribution that declares environments but whose entry
    points cannot be read (a malformed `entry_points.txt`); they are left out of `specs()`."""
    return _entry_points()[1]


def _entry_points() -> tuple[list[importlib.metadata.EntryPoint], list[str]]:
    """The entry points of our group, and a line for each distribution whose entry points
    cannot be read. One unreadable distribution makes `importlib.metadata.entry_points()`
    raise; then the distributions are read one by one (the first of a name wins, as there)."""
    try:
        return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)), []
    except Exception:
        pass
    found: list[importlib.metadata.EntryPoint] = []
    problems: list[str] = []
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        label = _dist_label(dist)
        if label is None or _canonical(label) in seen:
            continue
        seen.add(_canonical(label))
        try:
            found += dist.entry_points.select(group=ENTRY_POINT_GROUP)
        except Exception as e:
            if f"[{ENTRY_POINT_GROUP}]" in (dist.read_text("entry_points.txt") or ""):
                problems.append(f"{label} {dist.version}: its entry points cannot be read: {e}")
    return found, problems


def _dist_label(dist: importlib.metadata.Distribution) -> str | None:
    """The distribution's name; None when its metadata has none or cannot be read."""
    try:
        name = dist.metadata["Name"]
    except Exception:  # e.g. a .dist-info folder without METADATA
        return None
    return str(name) if name else None


def _canonical(name: str) -> str:
    """A distribution name in its normal form (PEP 503): `Atropos_RL` -> `atropos-rl`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _entry_point_origin(ep: importlib.metadata.EntryPoint) -> str:
    """`built in` for our own distribution's, `DIST VERSION` for another's."""
    dist = getattr(ep, "dist", None)
    label = _dist_label(dist) if dist is not None else None
    if dist is None or label is None:
        return "entry point"
    if _canonical(label) == DISTRIBUTION:
        return BUILT_IN
    return f"{label} {dist.version}"


def _registered_origin(target: str | type) -> str:
    """`built in` for a target in atropos' own package, a remote spec's URL, else
    `registered`."""
    if isinstance(target, str) and _remote(target):
        return target.partition(":")[2].partition("#")[0]
    module = target.partition(":")[0] if isinstance(target, str) else target.__module__
    return BUILT_IN if module.split(".")[0] == "atropos" else "registered"


def names() -> list[str]:
    """The ids of every known environment, sorted."""
    return sorted(specs())


def get(name: str) -> type:
    """The environment class registered as `name` (imported now); `"FAMILY:MEMBER"` where
    `FAMILY` is a registered environment with a `named(MEMBER)` classmethod (`verifiers:NAME`);
    at `"module:Class"` (a module found on `sys.path` or in the current directory), or in a
    file: `"path/env.py"` (its one environment class) or `"path/env.py:Class"`.

    Raises:
        EnvNotFound: unknown name (the message suggests the closest id and lists them all), a
            missing file, or a file with no environment class or several (they are listed).
        ImportError: the target's module or attribute cannot be imported.
        TypeError: the target is not a class.
    """
    if _remote(name):
        return _remote_class(name)
    path, attr = _file_target(name)
    if path is not None:
        return _load_file(name, path, attr)
    known = specs()
    family, sep, member = name.partition(":")
    if sep and family in known:
        return _member(family, get(family), member)
    if ":" in name:
        return _load(name, name, from_cwd=True)
    spec = known.get(name)
    if spec is None:
        raise EnvNotFound(_not_found(name, sorted(known)))
    if isinstance(spec.target, type):
        return spec.target
    if _remote(spec.target):
        return _remote_class(spec.target)
    return _load(name, spec.target)


_REMOTE = "atropos.interop"  # imported by name, when asked: it sits above this layer


def _remote(name: str) -> bool:
    """Whether `name` is a remote environment's spec (`ors:URL#ENV`, `openenv:...`)."""
    return name.partition(":")[0] in ("ors", "openenv")


def _remote_class(spec: str) -> type:
    """The environment class that drives the remote environment `spec` (`atropos.interop`);
    a malformed spec is EnvNotFound, with the forms it takes."""
    interop = importlib.import_module(_REMOTE)
    try:
        made: type = interop.env_class(spec)
    except ValueError as e:
        raise EnvNotFound(str(e)) from None
    return made


def _member(family: str, cls: type, member: str) -> type:
    """`FAMILY:MEMBER`: the environment `FAMILY` for one of the things it runs, e.g.
    `verifiers:NAME` (an installed verifiers taskset), made by its class's `named(MEMBER)`."""
    named = getattr(cls, "named", None)
    if named is None:
        raise EnvNotFound(f"environment {family!r} takes no name after ':' (got {member!r})")
    try:
        made: type = named(member)
    except ValueError as e:
        raise EnvNotFound(str(e)) from None
    return made


def describe(name: str, spec: EnvSpec | None = None) -> str:
    """One line about `name` (found again unless its `spec` is given): its registered
    description, else its class docstring's first line; a failure to import it is described,
    in one line, rather than raised."""
    spec = spec or specs().get(name)
    if spec is not None and spec.description:
        return spec.description
    if spec is not None and isinstance(spec.target, str) and _remote(spec.target):
        return f"remote environment {spec.target}"  # described without asking the server
    try:
        if spec is None:
            cls = get(name)
        else:
            cls = spec.target if isinstance(spec.target, type) else _load(name, spec.target)
    except (Exception, SystemExit) as e:  # `env list` must list broken plugins too
        return " ".join(f"(unavailable: {_failure(name, spec, e)})".split())
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _failure(name: str, spec: EnvSpec | None, error: BaseException) -> str:
    """Why `name` cannot be loaded: our loader's message (it names the environment), or the
    error its module raised on import."""
    if isinstance(error, (ImportError, LookupError, TypeError)) and str(error):
        return str(error)
    target = spec.target if spec is not None and isinstance(spec.target, str) else name
    return f"environment {name!r}: importing {target.partition(':')[0]} raised {error!r}"


def requirements(env_cls: type) -> dict[str, str]:
    """The modules `env_cls` needs, each with its extra: the `requires` mappings of the class
    and its bases, merged (a subclass adds to its bases' and may change an extra).

    >>> class Needs:
    ...     requires = {"math_verify": "envs"}
    >>> class More(Needs):
    ...     requires = {"PIL": "vision"}
    >>> requirements(More)
    {'math_verify': 'envs', 'PIL': 'vision'}
    """
    found: dict[str, str] = {}
    for klass in reversed(env_cls.__mro__):
        found.update(vars(klass).get("requires") or {})
    return found


def missing_extras(env_cls: type, name: str) -> str | None:
    """One line naming what `env_cls` (called `name`) needs and cannot import, and the pip
    command that installs it; None when everything it declares is importable.

    >>> class Needs:
    ...     requires = {"math_verify": "envs", "no_such_module_x": "envs"}
    >>> missing_extras(Needs, "demo").endswith("no-such-module-x: " + install_hint("envs"))
    True
    """
    missing = {m: extra for m, extra in requirements(env_cls).items() if not _importable(m)}
    if not missing:
        return None
    packages = ", ".join(_PIP_NAMES.get(m, m.replace("_", "-")) for m in missing)
    return f"{name} needs {packages}: {install_hint(missing.values())}"


def _importable(module: str) -> bool:
    """Whether `import module` would find it (found, not imported)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _load(name: str, target: str, *, from_cwd: bool = False) -> type:
    if not _TARGET.fullmatch(target):
        raise ImportError(
            f"environment {name!r}: expected 'package.module:Class', got {target!r}"
            f" (an entry point in group {ENTRY_POINT_GROUP!r} must name the environment class)"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = _import(module_name, from_cwd)
    except ImportError as e:
        raise ImportError(f"environment {name!r}: cannot import {module_name}: {e}") from e
    return _attribute(name, module, attr)


def _import(module_name: str, from_cwd: bool) -> ModuleType:
    """`import module_name`; when it is not found and `from_cwd`, again with the current
    directory on `sys.path` (kept there, so the module's own imports of its neighbours work),
    as `python -m` would find it."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.partition(".")[0]
        cwd = os.getcwd()
        if not from_cwd or e.name != top or _on_path(cwd):
            raise
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def _on_path(directory: str) -> bool:
    here = os.path.realpath(directory)
    return any(os.path.realpath(p or os.curdir) == here for p in sys.path)


def _attribute(name: str, module: ModuleType, attr: str) -> type:
    """`module.attr` (dotted), which must be a class."""
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImportError(f"environment {name!r}: {module.__name__} has no attribute {attr!r}")
        obj = getattr(obj, part)
    target = f"{module.__name__}:{attr}"
    if not isinstance(obj, type):
        raise TypeError(
            f"environment {name!r}: {target} is a {type(obj).__name__}, not a class;"
            " export the environment class itself (a BaseEnv subclass)"
        )
    return obj


def _file_target(name: str) -> tuple[Path | None, str | None]:
    """`("path/env.py", "Class")` for `path/env.py:Class`, `(path, None)` for a path alone,
    `(None, None)` for a registered name or `module:Class`."""
    head, sep, attr = name.rpartition(":")
    if sep and head.endswith(".py"):
        return Path(head), attr
    if name.endswith(".py") or "/" in name or os.sep in name:
        return Path(name), None
    return None, None


def _load_file(name: str, path: Path, attr: str | None) -> type:
    """The environment class `attr` of the Python file at `path`, or its only one."""
    if not path.is_file():
        raise EnvNotFound(
            f"environment file {str(path)!r} not found (a path is taken relative to the current"
            f" directory, {os.getcwd()})"
        )
    if path.suffix != ".py":
        raise EnvNotFound(f"environment file {str(path)!r}: expected a .py file")
    module = _import_file(path)
    found = _env_classes(module)
    if attr is not None:
        if not hasattr(module, attr.partition(".")[0]):
            listed = ", ".join(f"{path}:{c.__name__}" for c in found) or "none"
            raise EnvNotFound(
                f"{path} has no {attr!r}{_hint(attr, found)} (its environments: {listed})"
            )
        return _attribute(name, module, attr)
    if len(found) == 1:
        return found[0]
    if not found:
        raise EnvNotFound(
            f"{path} defines no environment class (a subclass of atropos.envs.BaseEnv or Env);"
            f" name one with {path}:CLASS"
        )
    listed = ", ".join(f"{path}:{c.__name__}" for c in found)
    raise EnvNotFound(f"{path} defines {len(found)} environment classes; pick one: {listed}")


def _import_file(path: Path) -> ModuleType:
    """Import `path` as a module named after the file, with its directory on `sys.path` (as
    `python path` would), so `multiprocessing` and the file's own imports find it again."""
    real = path.resolve()
    directory = str(real.parent)
    module_name = real.stem
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == real:
            return loaded
        module_name = f"_atropos_env_file_{abs(hash(str(real))):x}_{real.stem}"  # a name in use
    if not _on_path(directory):
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(module_name, real)
    if spec is None or spec.loader is None:
        raise ImportError(f"environment file {path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[module_name]
        raise ImportError(f"environment file {path}: {_where(e, real)}") from e
    return module


def _where(error: Exception, file: Path) -> str:
    """`"line 3: NameError: name 'x' is not defined"`: an import error in one line."""
    line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
    for frame in traceback.extract_tb(error.__traceback__):
        if Path(frame.filename).resolve() == file:
            line = frame.lineno
    at = f"line {line}: " if line else ""
    return f"{at}{type(error).__name__}: {error}"


def _env_classes(module: ModuleType) -> list[type]:
    """The concrete environment classes defined (not imported) in `module`, in order."""
    from atropos.envs.base import BaseEnv

    defined = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and obj.__module__ == module.__name__ and issubclass(obj, BaseEnv)
    ]
    # an abstract base beside its subclass is not a candidate; an env that misses a hook is
    return [c for c in defined if not inspect.isabstract(c)] or defined


def _hint(attr: str, found: list[type]) -> str:
    return did_you_mean(attr, [c.__name__ for c in found], repr)


def _not_found(name: str, known: list[str]) -> str:
    if not known:
        return (
            f"unknown environment {name!r}: none are installed; register one with"
            f" atropos.envs.registry.register(name, 'module:Class') or an entry point in"
            f" group {ENTRY_POINT_GROUP!r}, or pass 'module:Class' directly"
        )
    hint = did_you_mean(name, known, repr)
    return f"unknown environment {name!r}{hint} (installed: {', '.join(known)})"


def _show(target: str | type) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
