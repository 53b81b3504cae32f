"""Checks before anything starts: every process's arguments, and whether the run is done already.

Launch starts components through their own command lines and never imports their internals
(DESIGN), so it does not parse their flags itself: it asks each command. Every command launch
starts of ours takes `--check-args` (`atropos api serve`, `atropos local serve`, `atropos env
serve NAME`, `atropos train`, and the torchrun form of the trainer, checked as `atropos train`):
it parses and validates its flags exactly as a start would, then exits 0, or 2 with its usage
errors, starting nothing. `check` runs one such subprocess per distinct component (the replicas of
one run-file entry share one), all at once, with the process's own environment, its template
fields filled with stand-ins (ports, the run's key) and its files written to a scratch run
directory, by this machine's Python (a Slurm run's `run.slurm.python` when this machine has
it; when it has not, nothing is checked, with a note). A failure becomes one line naming the run
file, the key path the flag came from and the process: ``run.yaml: trainer.args.batch-size:
Input should be a valid integer ... (got 'abc') [trainer: atropos train]``; `atropos launch`
then exits 2, before the API or a server has started. On 2 cores the four checks of the
shipped example take about 1 s (2 s when the trainer has checkpoints: its check then loads
torch to find the newest).

Not checked: vLLM and SGLang servers and a trainer `command:` of your own, which have no check
mode (their mistakes show when they start, in their logs).

The trainer's check also says where it would start (its newest checkpoint's step, read as the
trainer resumes: `atropos.cli.train.start_point`). A run whose trainer is already at its last
step is complete: `complete` says so in one line, and launch exits 0 starting nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atropos.launch.config import EnvEntry, Placement, RunFile
from atropos.launch.keys import needs_key
from atropos.launch.plan import Plan, Process, fill
from atropos.launch.supervise import KEY_VARIABLES, LISTENS

CHECK_FLAG = "--check-args"
COMPONENTS = ("api", "local", "env", "train")  # `atropos NOUN` commands with --check-args
TIMEOUT = 60.0  # seconds a check may take; past it launch goes on without its answer
STAND_IN_KEY = "launch-check"  # the run's key, as the checks see it (nothing listens)
_SEE_HELP = re.compile(r" \(see: [^()]*--help\)$")
_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class Check:
    """One component's check: the processes it stands for and the command that checks them."""

    names: list[str]
    section: str
    argv: list[str]
    environ: dict[str, str]
    role: str

    @property
    def component(self) -> str:
        """`atropos train`, `atropos env serve`, ... (from the check's command line)."""
        words = [w for w in self.argv[3:6] if not w.startswith("-")]
        return " ".join(["atropos", *words[: 1 if words[:1] == ["train"] else 2]])


@dataclass
class Outcome:
    """What the checks found: one line per problem, the trainer's start point, notes."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    trainer: dict[str, Any] | None = None
    seconds: float = 0.0


def check_argv(proc: Process) -> list[str] | None:
    """The command line that checks `proc`'s arguments; None for a command with no check mode
    (vLLM, SGLang, your own)."""
    argv = proc.argv
    if proc.python or len(argv) < 4 or argv[0] != "{python}" or argv[1] != "-m":
        return None
    if argv[2] == "atropos" and argv[3] in COMPONENTS:
        return [*argv, CHECK_FLAG]
    if argv[2] == "torch.distributed.run" and "atropos.trainer" in argv:
        at = argv.index("atropos.trainer")
        if argv[at - 1] == "-m":
            return ["{python}", "-m", "atropos", "train", *argv[at + 1 :], CHECK_FLAG]
    return None


def checks(plan: Plan, scratch: Path, python: str = sys.executable) -> list[Check]:
    """One `Check` per distinct component of `plan`, its templates filled for `scratch` (a
    directory standing in for the run directory; the processes' files are written there)."""
    keyed = needs_key(plan) or plan.backend != "local"
    book = {
        p.name: (p.host if p.host not in ("", "0.0.0.0", "::") else "127.0.0.1", p.port or 1)
        for p in plan.processes
        if p.role in LISTENS
    }
    found: dict[tuple[str, ...], Check] = {}
    for proc in plan.processes:
        argv = check_argv(proc)
        if argv is None:
            continue
        shape = (proc.section, *(a.replace(proc.name, "\0") for a in argv))
        if shape in found:
            found[shape].names.append(proc.name)
            continue
        stand_in = proc.model_copy(update={"host": book.get(proc.name, ("127.0.0.1", 1))[0]})
        secrets = plan.secrets(proc.name)

        def render(
            text: str, stand_in: Process = stand_in, secrets: dict[str, str] = secrets
        ) -> str:
            return fill(
                text, stand_in, book, python=python, run_dir=scratch,
                key=STAND_IN_KEY if keyed else None, secrets=secrets,
            )  # fmt: skip

        for rel, content in proc.files.items():
            path = scratch / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(content))
        environ = {name: render(value) for name, value in {**proc.environ, **secrets}.items()}
        if keyed:
            environ.update(dict.fromkeys(KEY_VARIABLES, STAND_IN_KEY))
        found[shape] = Check(
            [proc.name], proc.section, [render(a) for a in argv], environ, proc.role
        )
    return list(found.values())


def check_python(run_file: RunFile) -> str | None:
    """The Python the checks run with: the one a Slurm job's nodes use (`run.slurm.python`) when
    this machine has it too, else this one; None when the nodes' Python is not here (their
    packages, an environment's extras, may differ from this machine's: nothing is checked)."""
    nodes = run_file.run.slurm.python if run_file.run.backend == "slurm" else None
    if not nodes:
        return sys.executable
    return nodes if os.path.isfile(nodes) and os.access(nodes, os.X_OK) else None


def check(plan: Plan, run_file: RunFile, origin: str) -> Outcome:
    """Run every component's check at once (module docstring); what they found."""
    began = time.monotonic()
    outcome = Outcome()
    python = check_python(run_file)
    if python is None:
        outcome.notes.append(
            f"run.slurm.python {run_file.run.slurm.python} is not on this machine: the"
            " processes' arguments are checked when they start on the nodes"
        )
        return outcome
    with tempfile.TemporaryDirectory(prefix="atropos-launch-check-") as scratch:
        todo = checks(plan, Path(scratch), python)
        running = [(c, _start(c)) for c in todo]
        for item, proc in running:
            try:
                out, err = proc.communicate(timeout=max(1.0, began + TIMEOUT - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                outcome.notes.append(
                    f"{item.component} did not check its arguments within {TIMEOUT:g} s; going"
                    " on without its answer"
                )
                continue
            if proc.returncode != 0:
                outcome.errors += problem_lines(item, err, proc.returncode, run_file, origin)
            elif item.role == "trainer":
                outcome.trainer = _start_point(out)
    outcome.seconds = time.monotonic() - began
    return outcome


def _start(item: Check) -> subprocess.Popen[str]:
    return subprocess.Popen(
        item.argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **item.environ},
    )


def _start_point(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        return doc if isinstance(doc, dict) else None
    return None


def problem_lines(item: Check, stderr: str, code: int, run_file: RunFile, origin: str) -> list[str]:
    """The check's errors as launch's: `ORIGIN: KEY.PATH: message [NAMES: COMPONENT]`."""
    said = [line.split(": error: ", 1)[1] for line in stderr.splitlines() if ": error: " in line]
    if not said:  # no usage error: a crash; its last line says most
        last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
        said = [f"its check failed with exit status {code}: {last.strip() or 'no output'}"]
    lines = []
    for message in said:
        message = _SEE_HELP.sub("", message).removeprefix("argument ")
        flag = _FLAG.search(message)
        path = key_path(run_file, item.section, flag.group(0)) if flag else None
        if path is not None and flag is not None and message.startswith(flag.group(0) + ": "):
            message = message[len(flag.group(0)) + 2 :]
        lines.append(
            f"{origin}: {path or item.section}: {message} [{', '.join(item.names)}:"
            f" {item.component}]"
        )
    return lines


def section_of(run_file: RunFile, path: str) -> Placement | None:
    """The run file's section at `path` (`api`, `trainer`, `inference[0]`, `envs[1]`)."""
    match = re.fullmatch(r"(inference|envs)\[(\d+)\]", path)
    if match is None:
        return {"api": run_file.api, "trainer": run_file.trainer}.get(path)
    entries: list[Any] = list(getattr(run_file, match.group(1)))
    index = int(match.group(2))
    return entries[index] if index < len(entries) else None


def key_path(run_file: RunFile, section: str, flag: str) -> str | None:
    """The run-file key that became `flag` of the process of `section`; None when launch
    wrote the flag itself.

    An `args:` key `batch_size` is `--batch-size`; an environment's `env: {group_size: 8}` is
    `--env.group_size`, its `weight` `--env.inference_weight`.
    """
    entry = section_of(run_file, section)
    if entry is None:
        return None
    for key in getattr(entry, "args", {}) or {}:
        if "--" + str(key).removeprefix("--").replace("_", "-") == flag:
            return f"{section}.args.{key}"
    if isinstance(entry, EnvEntry) and flag.startswith("--env."):
        name = flag.removeprefix("--env.")
        if name in entry.env:
            return f"{section}.env.{name}"
        if name == "inference_weight" and entry.weight is not None:
            return f"{section}.weight"
        if name == "min_batch_allocation" and entry.min_batch_allocation is not None:
            return f"{section}.min_batch_allocation"
    if section == "trainer" and flag == "--model":
        return "trainer.model"
    return None


# what `atropos train` logs once it registered with the API (atropos.trainer.session)
TRAINER_REGISTERED = "registered with "


def resumed(plan: Plan, start: dict[str, Any] | None) -> bool:
    """Adjust `plan` for a trainer that resumes from a checkpoint (`start`: its check's start
    point); whether it does.

    The API's store still holds the last run's registration (its steps, reached), so an
    environment registering before the trainer registers anew would read "the trainer reached
    its last step" and end. On a resume the environments therefore start once the trainer has
    registered anew: its gate waits for that line in its log, not only for `/stats`'
    `registered`, which the old registration already says.
    """
    step = (start or {}).get("start_step")
    if not isinstance(step, int) or step <= 0:
        return False
    trainer = next((p for p in plan.processes if p.role == "trainer"), None)
    if trainer is None:
        return False
    trainer.gate.log = TRAINER_REGISTERED
    for proc in plan.processes:
        if proc.role == "env" and trainer.name not in proc.after:
            proc.after.append(trainer.name)
    return True


def complete(plan: Plan, start: dict[str, Any] | None, dry_run: bool = False) -> str | None:
    """One line saying the run is complete, when its trainer is at its last step already
    (`start`: the trainer's check's start point); None otherwise."""
    if not start:
        return None
    step, steps = start.get("start_step"), start.get("steps")
    if not isinstance(step, int) or not isinstance(steps, int) or step < steps:
        return None
    out_dir = Path(str(start.get("out_dir") or plan.run_dir / "trainer"))
    run_dir = _shown(plan.run_dir)
    inside = out_dir.resolve().is_relative_to(plan.run_dir)
    remove = run_dir if inside else f"{run_dir} and {_shown(out_dir)}"
    return (
        f"run {plan.name!r} is complete: its trainer is at step {step} of {steps}"
        f" ({_shown(Path(str(start.get('checkpoint'))))});"
        f" {'a launch would start nothing' if dry_run else 'nothing was started'}. To train"
        f" further: --set trainer.args.steps=N with N above {step}; to start afresh:"
        f" --set run.directory=NEW_DIR, or remove {remove}"
    )


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
