"""The Weights & Biases side of a `MetricsSink`: `wandb` imported only when a run starts.

`wandb` is an optional extra (`wandb`); without it, asking for W&B
is a `MetricsError` that says which package to install and how to turn W&B off. The mode
(online, offline, disabled) and the directory follow wandb's own variables (`WANDB_MODE`,
`WANDB_DIR`) unless given. Each `WandbRun` is its own run object (`reinit="create_new"` on
wandb 0.19+), so an env and a trainer in one process do not finish each other's runs.
"""

from __future__ import annotations

import logging
import os
import random
import string
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import Any

from atropos.install import install_hint

log = logging.getLogger("atropos.metrics")

WANDB_EXTRA = "wandb"  # the extra of atropos-rl that installs it


class MetricsError(ValueError):
    """W&B was asked for but cannot be used: the package is missing or the run did not start."""


def import_wandb(off_hint: str = "") -> Any:
    """The `wandb` module, or a `MetricsError` naming the extra to install (and, when given,
    `off_hint`: how to turn W&B off)."""
    try:
        import wandb
    except ImportError as err:
        off = f" (or turn W&B off: {off_hint})" if off_hint else ""
        raise MetricsError(
            "W&B logging is on but the wandb package is not installed:"
            f" {install_hint(WANDB_EXTRA)}{off}"
        ) from err
    return wandb


def run_name(base: str, today: date | None = None, rng: random.Random | None = None) -> str:
    """`{base}-{YYYY-MM-DD}-{6 random lowercase letters}`, upstream's env run names.

    >>> run_name("gsm8k", date(2025, 1, 2), random.Random(0))
    'gsm8k-2025-01-02-vtkgnk'
    """
    day = (today or date.today()).isoformat()
    letters = "".join((rng or random).choices(string.ascii_lowercase, k=6))
    return f"{base}-{day}-{letters}"


def _version(module: Any) -> tuple[int, ...]:
    parts = []
    for piece in str(getattr(module, "__version__", "0")).split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class WandbRun:
    """One W&B run: `log(metrics, step)` with keys renamed by `names`, `close()` finishes it."""

    def __init__(self, run: Any, names: Mapping[str, str] | None = None) -> None:
        self.run = run
        self.names = dict(names or {})

    @classmethod
    def start(
        cls,
        *,
        project: str | None,
        group: str | None = None,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        names: Mapping[str, str] | None = None,
        off_hint: str = "",
    ) -> WandbRun:
        """`wandb.init(...)`; a `MetricsError` (with what to do) if wandb is missing or fails."""
        wandb = import_wandb(off_hint)
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {
            "project": project or None,
            "group": group or None,
            "name": name,
            "config": dict(config) if config is not None else None,
            "mode": mode,
            "dir": str(dir) if dir is not None else None,
            "reinit": "create_new" if _version(wandb) >= (0, 19) else True,
        }
        try:
            run = wandb.init(**kwargs)
        except Exception as err:
            off = f", or turn W&B off ({off_hint})" if off_hint else ""
            raise MetricsError(
                f"wandb.init failed: {type(err).__name__}: {err}; log in (`wandb login`),"
                f" or log offline (WANDB_MODE=offline){off}"
            ) from err
        log.info("W&B run %s (project %s, group %s)", name, project, group)
        return cls(run, names)

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log `metrics` (None values left out) at `step` (None: wandb's own counter)."""
        data = {self.names.get(k, k): v for k, v in metrics.items() if v is not None}
        if step is None:
            self.run.log(data)
        else:
            self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()
