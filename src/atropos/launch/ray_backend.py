"""The Ray backend (being built): each process in an actor that supervises it."""

from __future__ import annotations

import sys

from atropos.launch.config import RunFile
from atropos.launch.plan import Plan


def main(plan: Plan, run_file: RunFile, *, dry_run: bool, live: bool | None) -> int:
    print("atropos launch: error: backend ray is not available yet", file=sys.stderr)
    return 2
