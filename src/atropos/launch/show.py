"""`atropos launch --dry-run`: the resolved plan as text, every process with its command line,
node, GPUs, start order and the URLs it was given, and the files it gets."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from atropos.launch.plan import Plan, Process, fill

SECRET_SHOWN = "***"  # a secret environment value, wherever launch shows one


def describe(
    plan: Plan,
    book: Mapping[str, tuple[str, Any]],
    *,
    python: str,
    where: Mapping[str, str] | None = None,
    key_note: str | None = None,
    keyed: bool = False,
) -> str:
    """The plan, one block a process. `book` gives the addresses known so far; `where` says
    where each process runs (default: this machine)."""
    lines = [f"run {plan.name!r}: backend {plan.backend}, run directory {plan.run_dir}"]
    if key_note:
        lines.append(key_note)
    for i, tier in enumerate(plan.tiers()):
        lines.append("")
        lines.append(f"step {i + 1}: start {', '.join(p.name for p in tier)} and wait until ready")
        for proc in tier:
            at = (where or {}).get(proc.name, "this machine")
            lines += _block(plan, proc, book, python, at, "<run key>" if keyed else None)
    lines.append("")
    lines.append("stop order: trainer, then environments, inference servers, API")
    return "\n".join(lines)


def _block(
    plan: Plan,
    proc: Process,
    book: Mapping[str, tuple[str, Any]],
    python: str,
    where: str,
    key: str | None,
) -> list[str]:
    def render(text: str) -> str:
        return fill(text, proc, book, python=python, run_dir=plan.run_dir, key=key)

    gpus = (
        f", GPUs {proc.gpu_ids}" if proc.gpu_ids else (f", {proc.gpus} GPUs" if proc.gpus else "")
    )
    out = [
        f"  {proc.headline(f'on {where}', gpus)}",
        f"    $ {shlex.join(render(a) for a in proc.argv)}",
    ]
    if proc.name in book:
        host, port = book[proc.name]
        bind = proc.host or "the node's address"
        out.append(f"    listens on {bind}:{port}, reached at http://{host}:{port}")
    for name, value in proc.environ.items():
        out.append(f"    env {name}={render(value)}")
    out += [f"    env {name}={SECRET_SHOWN}" for name in proc.secret_environ]
    for rel, content in proc.files.items():
        out.append(f"    file {plan.run_dir / rel}:")
        out += [f"      {line}" for line in render(content).splitlines()]
    return out
