"""The run's resolved configuration, written beside its outputs and named in one line.

The command line prints the configuration itself only with `--verbose`; every run writes it
(secrets removed) where its outputs go: `runs/<name>/config.yaml` (serve),
`<path>.config.yaml` beside the JSONL (process), `<folder>/evaluate_config.yaml` (evaluate).
"""

from __future__ import annotations

import logging
from pathlib import Path

from atropos.envs.config import ResolvedConfig

log = logging.getLogger("atropos.env")


def save_config(resolved: ResolvedConfig, path: Path) -> Path:
    """Write the resolved configuration (secrets removed) to `path` and, unless `--verbose`
    printed it already, say where in one line."""
    saved = resolved.save(path)
    if not resolved.verbose:
        log.warning("configuration: %s (--verbose prints it)", saved)
    return saved
