"""Every environment this package declares as an entry point resolves to an environment class,
imports nothing heavy at package import, and is documented in docs/environments.md; the entry
points written in pyproject.toml import from the source, and `environments/` lists them."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path

import pytest

from atropos.envs import registry
from atropos.envs.base import BaseEnv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "environments.md"


def declared() -> list[str]:
    eps = importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP)
    return sorted(ep.name for ep in eps if ep.value.startswith("atropos.environments."))


def test_the_package_declares_its_environments():
    assert len(declared()) >= 25, "run `pip install -e .` to install entry points"


@pytest.mark.parametrize("name", declared())
def test_each_declared_environment_resolves_and_is_documented(name):
    env_cls = registry.get(name)
    assert isinstance(env_cls, type) and issubclass(env_cls, BaseEnv)
    assert f"`{name}`" in DOCS.read_text(), f"{name} is missing from docs/environments.md"


def pyproject_targets() -> dict[str, str]:
    """The `atropos.environments` entry points as written in pyproject.toml (name -> target)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    targets: dict[str, str] = project["entry-points"][registry.ENTRY_POINT_GROUP]
    return targets


@pytest.mark.parametrize("name", sorted(pyproject_targets()))
def test_each_pyproject_entry_point_imports_from_the_source(name):
    """Read from the source tree, not installed metadata, so a moved module fails here even
    before `pip install -e .` refreshes the metadata."""
    module_name, _, attr = pyproject_targets()[name].partition(":")
    env_cls = getattr(importlib.import_module(module_name), attr)
    assert isinstance(env_cls, type) and issubclass(env_cls, BaseEnv), name


def test_the_folder_list_reads_as_the_entry_point_list():
    """Each entry of `environments/` is a registered environment (module or package) or a family
    package of them (`games/`, `evals/`, `multimodal/`); shared helpers are in `common/`, fixtures
    in `data/`."""
    folder = ROOT / "src" / "atropos" / "environments"
    entries = {
        p.stem
        for p in folder.iterdir()
        if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir()) and p.stem != "__init__"
    }
    tops = {
        name: target.split(".")[2].partition(":")[0] for name, target in pyproject_targets().items()
    }
    assert entries - {"common", "data"} == set(tops.values())
    families = {"games", "evals", "multimodal"}
    misnamed = {name: top for name, top in tops.items() if top != name and top not in families}
    assert not misnamed, f"entry points not named as their module or package: {misnamed}"
