"""Importing a script that is not part of a package (a benchmark, a generator), for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_script"]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The module of the Python file at `path`, run once and registered in `sys.modules` under
    `name` (default: `_script_` + the file's stem), where dataclasses and pickling look it up.

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = Path(d, "tool.py").write_text("ANSWER = 42")
    ...     load_script(Path(d, "tool.py")).ANSWER
    42
    """
    path = Path(path)
    name = name or f"_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
