"""`atropos env new NAME`: an installable package holding a new environment.

`write_package("my-env", Path("."))` writes `./my-env/`: a setuptools project named `my-env`
whose entry point in group `atropos.environments` names the class `MyEnv` in `my_env/env.py`
(so `atropos env list` shows it once installed), a small fixture dataset, tests that check the
environment against the shipped fake inference server, and a README. The files' text is in
`atropos.envs.scaffold_files`.

>>> names = package_names("my-env")
>>> names.module, names.cls, names.config_cls
('my_env', 'MyEnv', 'MyEnvConfig')
>>> package_names("gsm8k-ru").cls
'Gsm8kRuEnv'
"""

from __future__ import annotations

import keyword
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from atropos.envs import scaffold_files as files

__all__ = ["PackageNames", "ScaffoldError", "package_files", "package_names", "write_package"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_TAKEN = frozenset({"atropos", "test", "tests"})  # import names the package must not shadow


class ScaffoldError(ValueError):
    """The name or the target folder cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class PackageNames:
    """The names in a new package: the environment (and distribution), its import name, its
    class and its config class."""

    name: str
    module: str
    cls: str
    config_cls: str


def package_names(name: str) -> PackageNames:
    """The names of the package for environment `name` (letters, digits, '-' and '_',
    starting with a letter); the module is `name` with '-' made '_'.

    Raises:
        ScaffoldError: `name` breaks that rule, or its module would be a Python keyword or
            shadow a standard or Atropos module.
    """
    if not _NAME.fullmatch(name):
        raise ScaffoldError(
            f"environment name {name!r}: use letters, digits, '-' and '_', starting with a"
            " letter (e.g. my-env)"
        )
    module = name.replace("-", "_")
    if keyword.iskeyword(module) or module in sys.stdlib_module_names or module in _TAKEN:
        raise ScaffoldError(
            f"environment name {name!r}: its module {module!r} would shadow a Python keyword or"
            " module; pick another name (e.g. my-env)"
        )
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[-_]+", name) if part)
    cls = camel if camel.endswith("Env") and camel != "Env" else f"{camel}Env"
    return PackageNames(name, module, cls, f"{cls}Config")


def package_files(names: PackageNames) -> dict[str, str]:
    """The files of the package, by path relative to its folder, with their text."""
    fill = asdict(names)
    m = names.module
    return {
        "pyproject.toml": files.PYPROJECT.substitute(fill),
        "README.md": files.README.substitute(fill, **files.setup_commands()),
        f"{m}/__init__.py": files.INIT.substitute(fill),
        f"{m}/env.py": files.ENV.substitute(fill),
        f"{m}/data/train.jsonl": files.DATA.substitute(fill),
        "tests/test_env.py": files.TEST.substitute(fill),
    }


def write_package(name: str, directory: Path, *, force: bool = False) -> list[Path]:
    """Write the package of environment `name` into `directory/name`; the paths written.

    Files of that folder that are not the package's are left alone.

    Raises:
        ScaffoldError: a bad name (see `package_names`), a folder that exists and holds
            anything (unless `force`: then its package files are overwritten), or a path that
            is a file.
    """
    names = package_names(name)
    root = directory / name
    if root.exists() and not root.is_dir():
        raise ScaffoldError(f"{root} exists and is not a folder; pick another name or --dir")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise ScaffoldError(
            f"{root} exists and is not empty; pick another name or --dir, or pass --force to"
            " overwrite the package's files in it"
        )
    written = []
    for relative, text in package_files(names).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
