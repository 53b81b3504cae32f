"""`atropos launch RUN.yaml`: a whole run from one file (docs/launch.md).

    atropos launch RUN.yaml [--set KEY.PATH=VALUE ...] [--dry-run] [--address RAY_ADDRESS]
    atropos launch --cancel RUN_DIR          # a Slurm run: scancel its job

Inside a Slurm job the run's script calls `atropos launch --step NAME RUN_DIR` (one process's
supervisor, one srun step), `--await RUN_DIR NAME...` (until they are ready) and `--record
RUN_DIR [--exit-code N]` (launch.json); docs/launch.md, section Slurm.

Exit status: the trainer's when the run ends with it; 1 when a process fails (never became
ready, or failed past its restarts); 2 for a run file or flags that cannot be used; 130/143
after SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from atropos.cli.argtypes import Parser

if TYPE_CHECKING:
    from atropos.launch.config import RunFile
    from atropos.launch.plan import Plan

PROG = "atropos launch"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Start a whole run (API, inference servers, environments, trainer) from one"
        " YAML file, on this machine, on a Ray cluster or as a Slurm job. docs/launch.md.",
    )
    p.add_argument("run_file", nargs="?", metavar="RUN.yaml", help="the run file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a field (VALUE is YAML), e.g. --set envs.0.replicas=2; repeatable",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved plan (slurm: the sbatch script) and exit",
    )
    p.add_argument(
        "--address", default=None, help="ray: the cluster to join (default: $RAY_ADDRESS)"
    )
    p.add_argument(
        "--no-live", action="store_true", help="print state changes as lines, not a live table"
    )
    p.add_argument(
        "--cancel", metavar="RUN_DIR", default=None, help="cancel the Slurm job of a run"
    )
    # inside a Slurm job of a run (its job.sbatch calls them); see the module docstring
    p.add_argument("--step", nargs=2, metavar=("NAME", "RUN_DIR"), help=argparse.SUPPRESS)
    p.add_argument("--await", dest="await_", nargs="+", metavar="ARG", help=argparse.SUPPRESS)
    p.add_argument("--record", metavar="RUN_DIR", help=argparse.SUPPRESS)
    p.add_argument("--exit-code", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.cancel is not None:
        from atropos.launch import slurm

        return slurm.cancel(Path(args.cancel))
    if args.step or args.await_ or args.record:
        from atropos.launch import slurm_job

        if args.step:
            return slurm_job.main("step", Path(args.step[1]), [args.step[0]])
        if args.await_:
            if len(args.await_) < 2:
                print(f"{PROG}: error: --await RUN_DIR NAME...", file=sys.stderr)
                return 2
            return slurm_job.main("await", Path(args.await_[0]), args.await_[1:])
        return slurm_job.main("record", Path(args.record), [], args.exit_code)
    if args.run_file is None:
        print(f"{PROG}: error: give the run file: {PROG} RUN.yaml", file=sys.stderr)
        return 2
    from atropos.launch import config
    from atropos.launch.plan import build

    try:
        run_file = config.load(args.run_file, args.overrides)
        if args.address is not None:
            run_file.run.ray.address = args.address
        plan = build(run_file)
    except config.LaunchConfigError as err:
        for line in err.lines:
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return 2
    started = _preflight(plan, run_file, args)
    if started is not None:
        return started
    backend = run_file.run.backend
    if backend == "local":
        return _local(plan, args)
    if backend == "ray":
        from atropos.launch import ray_backend

        return ray_backend.main(plan, run_file, dry_run=args.dry_run, live=_live(args))
    from atropos.launch import slurm

    return slurm.main(plan, run_file, dry_run=args.dry_run)


def _preflight(plan: Plan, run_file: RunFile, args: argparse.Namespace) -> int | None:
    """Check every process's arguments through its own command (`atropos.launch.preflight`)
    and whether the run is complete already; an exit status when the launch ends here."""
    from atropos.launch import preflight

    outcome = preflight.check(plan, run_file, str(args.run_file))
    for line in outcome.notes:
        print(f"{PROG}: note: {line}", file=sys.stderr)
    if outcome.errors:
        for line in outcome.errors:
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return 2
    done = preflight.complete(plan, outcome.trainer, dry_run=args.dry_run)
    if done is not None:
        print(f"{PROG}: {'note: ' if args.dry_run else ''}{done}", file=sys.stderr)
        if not args.dry_run:
            return 0
    preflight.resumed(plan, outcome.trainer)
    return None


def _live(args: argparse.Namespace) -> bool | None:
    return False if args.no_live else None


def _local(plan: object, args: argparse.Namespace) -> int:
    from atropos.launch import local
    from atropos.launch.keys import needs_key
    from atropos.launch.plan import Plan
    from atropos.launch.show import describe

    assert isinstance(plan, Plan)
    shortage: str | None = None
    try:
        placed = local.place(plan)
    except local.PlacementError as err:
        if not args.dry_run:
            print(f"{PROG}: error: {err}", file=sys.stderr)
            return 2
        try:
            placed, shortage = local.place(plan, strict=False), f"note: {err}"
        except local.PlacementError as again:  # not a shortage: a host it cannot bind
            print(f"{PROG}: error: {again}", file=sys.stderr)
            return 2
    if args.dry_run:
        notes = [shortage] if shortage else []
        if needs_key(placed):
            notes.append(
                f"a key is made for this run in {plan.run_dir / 'api.key'} and given to every"
                " process in its environment"
            )
        book = local.book_of(placed)
        print(
            describe(
                placed,
                book,
                python=sys.executable,
                key_note="\n".join(notes) or None,
                keyed=needs_key(placed),
            )
        )
        return 0
    local.write_plan(placed)
    return local.run(placed, live=_live(args))
