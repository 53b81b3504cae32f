"""The Slurm backend (being built): one sbatch script, one srun step per process."""

from __future__ import annotations

import sys
from pathlib import Path

from atropos.launch.config import RunFile
from atropos.launch.plan import Plan


def main(plan: Plan, run_file: RunFile, *, dry_run: bool) -> int:
    print("atropos launch: error: backend slurm is not available yet", file=sys.stderr)
    return 2


def cancel(run_dir: Path) -> int:
    print("atropos launch: error: backend slurm is not available yet", file=sys.stderr)
    return 2
