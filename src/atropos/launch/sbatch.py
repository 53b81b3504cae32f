"""The Slurm backend's job: where each process runs, and the sbatch script that runs it.

`place(plan, run)` fixes what the script needs before the job exists:

- a node index for every process: its `node:` if given, else the API and the trainer on node
  0 and the inference servers and environments spread round-robin over the other nodes (over
  node 0 when the job has one); a server that asks for GPUs goes to the next node with enough
  of them left;
- its GPUs: positions among the job's GPUs on its node, handed out in plan order, checked
  against `run.slurm.gpus_per_node`;
- a port for every listening process (API, inference): the run file's, else one free on the
  submitting machine now (the job's nodes cannot be asked before the job runs);
- its bind address: the run file's host, else all addresses (`0.0.0.0`). Others reach it at
  its node's name from the job's node list, or at the run file's host when one is given.

`script(plan, run, python=..., cwd=...)` writes the sbatch script (`RUN_DIR/job.sbatch`):
`#SBATCH` lines, the run file's setup lines, the node list (`scontrol show hostnames`), one
`ATROPOS_ADDR_<NAME>` variable per listening process, then one `srun` step per process, tier
by tier with `atropos launch --await` between tiers, a watch loop, and the ordered stop (after
a trainer that finished, the environments get `driver.ENVS_END` seconds to end first). Each
step runs `atropos launch --step NAME RUN_DIR` (`slurm_job`), the supervisor of every backend.

Nothing from the run file reaches the shell unquoted: the run file's models refuse control
characters (and, for #SBATCH values, spaces and quotes) in every value written here; values in
shell words are `shlex.quote`d; comments show values with control characters escaped
(`comment`); secret environment values are never written (`***`): the steps read them from
`RUN_DIR/secrets.json`. The setup lines (`run.slurm.setup`) are the user's own shell code.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from atropos.launch.config import RunFile, one_line
from atropos.launch.driver import ENVS_END
from atropos.launch.plan import Plan, Process, fill
from atropos.launch.show import SECRET_SHOWN
from atropos.launch.supervise import LISTENS, WILDCARD, free_port
from atropos.names import is_loopback

ADDR_PREFIX = "ATROPOS_ADDR_"
NODES_VARIABLE = "ATROPOS_NODES"
STOP_SLACK = 15  # seconds a step may take beyond the grace period to stop before it is ended


class SlurmPlanError(ValueError):
    """The run cannot be laid out as a Slurm job; `lines` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("\n".join(lines))


def address_variable(name: str) -> str:
    """The environment variable that holds where process `name` is reached (`HOST:PORT`).

    >>> address_variable("policy-0")
    'ATROPOS_ADDR_policy_0'
    """
    return ADDR_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", name)


# ----- placement ---------------------------------------------------------------------------------


def place(plan: Plan, run: RunFile) -> Plan:
    """`plan` with nodes, GPUs, ports and bind addresses fixed for a job of `run.run.slurm`;
    `SlurmPlanError` when the processes do not fit (module docstring)."""
    settings = run.run.slurm
    nodes = settings.nodes
    problems = [
        f"{key}: {node} is not a node of the job (run.slurm.nodes is {nodes}: nodes 0 to"
        f" {nodes - 1}); raise run.slurm.nodes or give a lower node"
        for key, node in _node_keys(run)
        if node is not None and node >= nodes
    ]
    if problems:
        raise SlurmPlanError(problems)
    plan = plan.model_copy(deep=True)
    free = dict.fromkeys(range(nodes), settings.gpus_per_node)
    for proc in plan.processes:
        if proc.node is None and proc.role in ("api", "trainer"):
            proc.node = 0
        if proc.node is not None:
            free[proc.node] -= proc.gpus
    others = list(range(1, nodes)) or [0]
    for role in ("inference", "env"):
        turn = 0
        for proc in plan.processes:
            if proc.role != role or proc.node is not None:
                continue
            order = others[turn:] + others[:turn]
            fits = [n for n in order if free[n] >= proc.gpus] or order
            proc.node = fits[0]
            free[proc.node] -= proc.gpus
            turn = (others.index(proc.node) + 1) % len(others)
    _assign_gpus(plan, settings.gpus_per_node)
    _assign_ports(plan)
    _check_hosts(plan)
    return plan


def _node_keys(run: RunFile) -> list[tuple[str, int | None]]:
    keys: list[tuple[str, int | None]] = [("api.node", run.api.node)]
    keys += [(f"inference[{i}].node", s.node) for i, s in enumerate(run.inference)]
    keys += [(f"envs[{i}].node", e.node) for i, e in enumerate(run.envs)]
    keys.append(("trainer.node", run.trainer.node))
    return keys


def _assign_gpus(plan: Plan, per_node: int) -> None:
    used: dict[int, int] = {}
    asks: dict[int, list[str]] = {}
    for proc in plan.processes:
        assert proc.node is not None
        if not proc.gpus:
            proc.gpu_ids = None
            continue
        first = used.get(proc.node, 0)
        proc.gpu_ids = list(range(first, first + proc.gpus))
        used[proc.node] = first + proc.gpus
        asks.setdefault(proc.node, []).append(f"{proc.name} {proc.gpus}")
    problems = [
        f"node {node} of the job gets {wanted} GPU(s) ({', '.join(asks[node])}) and"
        f" run.slurm.gpus_per_node is {per_node}: raise run.slurm.gpus_per_node or"
        " run.slurm.nodes, or place processes on other nodes with node:"
        for node, wanted in sorted(used.items())
        if wanted > per_node
    ]
    if problems:
        raise SlurmPlanError(problems)


def _assign_ports(plan: Plan) -> None:
    taken: dict[tuple[int | None, int], str] = {}
    picked: set[int] = set()
    problems = []
    for proc in plan.processes:
        if proc.role not in LISTENS:
            continue
        if not proc.host:
            proc.host = "0.0.0.0"
        if not proc.port:
            port = _free_port(proc.host)
            while port in picked or (proc.node, port) in taken:
                port = _free_port(proc.host)
            picked.add(port)
            proc.port = port
        other = taken.setdefault((proc.node, proc.port), proc.name)
        if other != proc.name:
            problems.append(
                f"{other} and {proc.name} both listen on port {proc.port} of node {proc.node}:"
                " give one of them another port"
            )
    if problems:
        raise SlurmPlanError(problems)


def _free_port(host: str) -> int:
    """A port free here on `host`, or on all addresses when `host` is not this machine's (a
    node's name or address)."""
    try:
        return free_port(host)
    except OSError:
        return free_port("0.0.0.0")


def _check_hosts(plan: Plan) -> None:
    used = sorted({p.node for p in plan.processes if p.node is not None})
    if len(used) < 2:
        return
    problems = [
        f"{proc.name} binds {proc.host}, a loopback address, but the run spans nodes"
        f" {', '.join(map(str, used))}: processes on the other nodes could not reach it;"
        " leave its host unset (all addresses) or put every process on one node"
        for proc in plan.processes
        if proc.role in LISTENS and is_loopback(proc.host, resolve=True)
    ]
    if problems:
        raise SlurmPlanError(problems)


def advertised(proc: Process) -> str:
    """Where others reach `proc` (a listening process), as the script writes it: its node's
    name from the job's node list, or the run file's host when it names one."""
    if proc.host in WILDCARD:
        return f"${{NODES[{proc.node}]}}"
    return proc.host


# ----- the script --------------------------------------------------------------------------------


def parse_time(text: str) -> int | None:
    """Seconds in a Slurm time limit (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
    `D-HH:MM:SS`); None for `UNLIMITED`/`INFINITE` or a form not known here.

    >>> parse_time("01:00:00"), parse_time("90"), parse_time("2-00"), parse_time("infinite")
    (3600, 5400, 172800, None)
    """
    text = text.strip()
    days = 0
    if "-" in text:
        head, _, text = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
        parts = text.split(":")
        if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
            return None
        hms = [int(p) for p in parts] + [0] * (3 - len(parts))
        return days * 86400 + hms[0] * 3600 + hms[1] * 60 + hms[2]
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    values = [int(p) for p in parts]
    if len(values) == 1:
        return values[0] * 60
    if len(values) == 2:
        return values[0] * 60 + values[1]
    return values[0] * 3600 + values[1] * 60 + values[2]


def stop_budget(plan: Plan) -> int:
    """Seconds the ordered stop may take at most: each tier's grace period plus slack."""
    return sum(int(max(p.grace for p in tier)) + STOP_SLACK for tier in plan.stop_tiers()) + 30


def node_cpus(plan: Plan) -> int:
    """CPUs to ask per node when run.slurm.cpus_per_node is not given: the most that the
    processes of one node ask together."""
    per_node: dict[int | None, float] = {}
    for proc in plan.processes:
        per_node[proc.node] = per_node.get(proc.node, 0.0) + proc.cpus
    return max(1, math.ceil(max(per_node.values(), default=1.0)))


def comment(text: str) -> str:
    """`text` as one comment line may hold it: control characters (a newline would end the
    comment and start a command) written as escapes.

    >>> comment("a\\nb\\x00")
    'a\\\\nb\\\\x00'
    """
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: m.group(0).encode("unicode_escape").decode(), text)


def _check_paths(*paths: Path) -> None:
    bad = [str(p) for p in paths if re.search(r"[\s'\"\\$`\x00-\x1f\x7f]", str(p))]
    if bad:
        raise SlurmPlanError(
            [
                f"{path}: a path with spaces, quotes or $ cannot go on an #SBATCH line; use"
                " another run directory (run.directory) or working directory"
                for path in bad
            ]
        )


def script(plan: Plan, run: RunFile, *, python: str, cwd: Path) -> str:
    """The sbatch script for the placed `plan` (module docstring)."""
    settings = run.run.slurm
    run_dir = plan.run_dir
    _check_paths(run_dir, cwd)
    for option in settings.sbatch:  # the run file's models check these; a changed model too
        if not option.startswith("-") or re.search(r"[\x00-\x1f\x7f]", option):
            raise SlurmPlanError(
                [f"run.slurm.sbatch: {option!r} is not an sbatch option like --qos=high"]
            )
    try:
        one_line(python, "an interpreter's path")
    except ValueError as err:
        raise SlurmPlanError([f"run.slurm.python: {err}"]) from None
    lines = _header(plan, run)
    lines += _sbatch_lines(plan, run, cwd)
    lines += [
        "",
        "# Stop at the first failing command; the run file's setup lines run before unset",
        "# variables count as errors (module and venv scripts often read unset ones).",
        "set -eo pipefail",
        "",
        f"RUN_DIR={shlex.quote(str(run_dir))}",
        f"PYTHON={shlex.quote(python)}   # the Python with atropos on the nodes (run.slurm.python)",
        f"GRACE={int(math.ceil(max(p.grace for p in plan.processes)))}"
        "   # seconds a process has to stop after SIGTERM (run.grace)",
        f"ENVS_END={int(math.ceil(ENVS_END))}"
        "   # seconds environments may take to end after the trainer finished",
    ]
    if settings.setup:
        lines += [
            "",
            "# ---- setup (run.slurm.setup); the steps inherit its environment -------------------",
        ]
        lines += settings.setup
    nodes_block = _NODES_BLOCK.strip("\n").replace("NODE_COUNT", str(settings.nodes))
    lines += ["", "set -u", "", nodes_block, ""]
    lines += _addresses(plan)
    lines += ["", _FUNCTIONS.strip("\n"), ""]
    lines += _stop_function(plan)
    lines += ["", _TRAPS.strip("\n"), ""]
    lines += _tiers(plan, python, settings.gpus_per_node > 0)
    envs = _names([p for p in plan.processes if p.role == "env"])
    watch = _WATCH.strip("\n").replace("{count}", str(len(plan.processes)))
    lines += ["", watch.replace("{envs}", envs)]
    return "\n".join(lines) + "\n"


def _header(plan: Plan, run: RunFile) -> list[str]:
    by_node: dict[int, list[str]] = {}
    for proc in plan.processes:
        assert proc.node is not None
        by_node.setdefault(proc.node, []).append(proc.name)
    layout = [
        comment(f"#   node {node}: {', '.join(names)}") for node, names in sorted(by_node.items())
    ]
    return [
        "#!/bin/bash",
        comment(f"# atropos launch: the run {plan.name!r} as one Slurm job."),
        "#",
        "# Written by `atropos launch` (backend: slurm) as RUN_DIR/job.sbatch and submitted with",
        "# sbatch; docs/launch.md, section Slurm, explains it. Every process of the run is one",
        "# srun step running `atropos launch --step NAME RUN_DIR`: the supervisor of every",
        "# backend (readiness gate, restarts, stop by process group), which keeps the process's",
        "# state in RUN_DIR/status/NAME.json and its output in RUN_DIR/logs/NAME.log. This script",
        "# only starts the steps tier by tier, watches them, and stops them in order.",
        "#",
        f"# Nodes (index: processes; run.slurm.nodes is {run.run.slurm.nodes}):",
        *layout,
    ]


def _sbatch_lines(plan: Plan, run: RunFile, cwd: Path) -> list[str]:
    settings = run.run.slurm
    cpus = settings.cpus_per_node or node_cpus(plan)
    source = "run.slurm.cpus_per_node" if settings.cpus_per_node else "its processes' cpus"
    lines = [
        "#",
        f"# The job: {settings.nodes} node(s), each one task of {cpus} CPU(s) ({source}) that",
        "# the steps of the node share. This script's output: RUN_DIR/logs/job-JOBID.out.",
        f"#SBATCH --job-name=atropos-{plan.name}",
        f"#SBATCH --nodes={settings.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}",
    ]
    if settings.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={settings.gpus_per_node}")
    if settings.partition:
        lines.append(f"#SBATCH --partition={settings.partition}")
    if settings.account:
        lines.append(f"#SBATCH --account={settings.account}")
    lines += [
        f"#SBATCH --time={settings.time}",
        f"#SBATCH --output={plan.run_dir / 'logs' / 'job-%j.out'}",
        f"#SBATCH --chdir={cwd}",
    ]
    budget = stop_budget(plan)
    limit = parse_time(settings.time)
    if limit is None or limit > 2 * budget:
        lines += [
            f"# {budget} s before the time limit, SIGTERM to this script alone (B:): it stops",
            "# the run in order.",
            f"#SBATCH --signal=B:TERM@{budget}",
        ]
    if settings.sbatch:
        lines.append("# more options (run.slurm.sbatch):")
        lines += [f"#SBATCH {option}" for option in settings.sbatch]
    return lines


_NODES_BLOCK = """
# ---- the job's nodes -----------------------------------------------------------------
# NODES[i] is node i of the layout above, in the order of the job's node list.
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
if (( ${#NODES[@]} < NODE_COUNT )); then
  echo "[launch] error: the job has ${#NODES[@]} node(s) ($SLURM_JOB_NODELIST);" \
    "the run needs NODE_COUNT"
  exit 1
fi
export ATROPOS_NODES="${NODES[*]}"
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/status"
rm -f "$RUN_DIR"/status/*   # states of an earlier job of this run directory
"""


def _addresses(plan: Plan) -> list[str]:
    lines = [
        "# ---- where the listening processes are reached ---------------------------------------",
        "# Ports were fixed when this script was written (the run file's, or one free on the",
        "# submitting machine); hosts are the nodes' names from the job's node list, unless the",
        "# run file gives a host. `atropos launch --step` builds its address book from these",
        "# variables (ATROPOS_ADDR_ + the process name, other characters than letters, digits and",
        "# _ written as _): every URL a process gets is made from them.",
    ]
    seen: dict[str, str] = {}
    problems = []
    for proc in plan.processes:
        if proc.role not in LISTENS:
            continue
        variable = address_variable(proc.name)
        if variable in seen:
            problems.append(
                f"{seen[variable]} and {proc.name} would share the variable {variable}:"
                " rename one of them"
            )
        seen[variable] = proc.name
        where = advertised(proc)
        # a node's name from the node list is expanded by the shell; a run file's host is not
        value = (
            f'"{where}:{proc.port}"'
            if proc.host in WILDCARD
            else shlex.quote(f"{where}:{proc.port}")
        )
        lines.append(
            f"export {variable}={value}"
            + comment(f"   # {proc.name} binds {proc.host}:{proc.port}")
        )
    if problems:
        raise SlurmPlanError(problems)
    return lines


_FUNCTIONS = r"""
# ---- how steps start, end and stop ---------------------------------------------------
declare -A STEP=()   # process name -> pid of the srun client that runs its step
AWAITER=""           # pid of the running `atropos launch --await`, if any
STOPPING=0           # 1 once the run is being stopped
HURRY=0              # 1 after a second signal: end what is left at once

# start NAME NODE [SRUN OPTIONS...]: run process NAME as one srun step on NODE.
# --overlap lets the steps of a node share the CPUs the job holds there (without it a step
# waits until the one before ends). The step's own output goes to this script's output; the
# process's goes to RUN_DIR/logs/NAME.log.
start() {
  local name=$1 node=$2
  shift 2
  echo "[launch] $name: starting on $node"
  srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap --job-name="$name" "$@" \
    "$PYTHON" -m atropos launch --step "$name" "$RUN_DIR" &
  STEP[$name]=$!
}

# next_ended: wait until the awaiter or a step ends; sets ENDED (a process name, or "await")
# and CODE (its exit status). Returns 1 when nothing is left to wait for.
next_ended() {
  local name
  while true; do
    if [[ -n $AWAITER ]] && ! kill -0 "$AWAITER" 2>/dev/null; then
      ENDED=await CODE=0
      wait "$AWAITER" || CODE=$?
      AWAITER=""
      return 0
    fi
    for name in "${!STEP[@]}"; do
      if ! kill -0 "${STEP[$name]}" 2>/dev/null; then
        ENDED=$name CODE=0
        wait "${STEP[$name]}" || CODE=$?
        unset "STEP[$name]"
        return 0
      fi
    done
    if [[ -z $AWAITER ]] && (( ${#STEP[@]} == 0 )); then
      return 1
    fi
    wait -n || true   # until a child ends, or a signal comes (its trap runs first)
  done
}

# await_ready NAME...: wait until the named processes are ready. `atropos launch --await`
# reads their RUN_DIR/status/NAME.json, with each one's ready_timeout as its deadline, and
# fails naming the process that failed, with its log's tail. A step that ends meanwhile
# fails the start too.
await_ready() {
  local tries code
  "$PYTHON" -m atropos launch --await "$RUN_DIR" "$@" &
  AWAITER=$!
  while next_ended; do
    if [[ $ENDED == await ]]; then
      return "$CODE"
    fi
    # the step wrote why it ended into its status file before it did: the awaiter, which
    # reads it twice a second, says so with the reason; give it two seconds to
    for tries in {1..20}; do
      if ! kill -0 "$AWAITER" 2>/dev/null; then
        code=0
        wait "$AWAITER" 2>/dev/null || code=$?
        AWAITER=""
        if (( code != 0 )); then
          return 1
        fi
        break
      fi
      sleep 0.1
    done
    echo "[launch] error: $ENDED ended (status $CODE) before the run started;" \
      "see $RUN_DIR/logs/$ENDED.log"
    return 1
  done
  return 1
}

# stop_steps NAME...: ask the named steps to stop, wait for them up to GRACE + 15 s, then end
# what is left. The ask is the word "stop" in RUN_DIR/status/NAME.control, which the step
# reads twice a second: it then stops its process as every backend does (SIGTERM to the
# process group, SIGKILL after the grace period). Not a signal, because Slurm delivers a
# signal for a step (one that srun forwards, SIGUSR1 or SIGUSR2, or scancel --signal) to
# every process of the step, the supervised one included. SIGTERM to an srun client is not
# forwarded at all: srun 22.05 answers it with "forcing job termination" and kills its step
# at once (SIGKILL); that is the last resort here.
stop_steps() {
  local name pid alive deadline pids=()
  for name in "$@"; do
    if [[ -n ${STEP[$name]:-} ]]; then
      pids+=("${STEP[$name]}")
    fi
  done
  if (( ${#pids[@]} == 0 )); then
    return 0
  fi
  echo "[launch] stopping $*"
  for name in "$@"; do
    echo stop > "$RUN_DIR/status/$name.control"
  done
  deadline=$((SECONDS + GRACE + 15))
  while (( SECONDS < deadline && HURRY == 0 )); do
    alive=0
    for pid in "${pids[@]}"; do
      if kill -0 "$pid" 2>/dev/null; then
        alive=1
      fi
    done
    if (( alive == 0 )); then
      break
    fi
    sleep 0.2
  done
  for name in "$@"; do
    if [[ -n ${STEP[$name]:-} ]]; then
      if kill -0 "${STEP[$name]}" 2>/dev/null; then
        echo "[launch] $name did not stop in time: ending its step"
        kill -TERM "${STEP[$name]}" 2>/dev/null || true
      fi
      wait "${STEP[$name]}" 2>/dev/null || true
      unset "STEP[$name]"
    fi
  done
  return 0
}

# let_envs_end NAME...: after a trainer that finished, give the named environment steps up to
# ENVS_END seconds to end on their own, as each does once it sees the trainer's last step and
# has sent what it holds (so the record says they exited, as on the other backends); the
# ordered stop ends what is left.
let_envs_end() {
  local name alive deadline=$((SECONDS + ENVS_END))
  while (( SECONDS < deadline )); do
    alive=0
    for name in "$@"; do
      if [[ -n ${STEP[$name]:-} ]] && kill -0 "${STEP[$name]}" 2>/dev/null; then
        alive=1
      fi
    done
    if (( alive == 0 )); then
      return 0
    fi
    sleep 0.1
  done
  echo "[launch] environments still running $ENVS_END s after the trainer finished"
}

# record [--exit-code CODE]: write RUN_DIR/launch.json from the steps' status files (and the
# API's /stats while it answers).
record() {
  "$PYTHON" -m atropos launch --record "$RUN_DIR" "$@" || true
}

# finish CODE: stop the run in order, write the record, end the job with CODE.
finish() {
  STOPPING=1
  record
  if [[ -n $AWAITER ]]; then
    kill "$AWAITER" 2>/dev/null || true
    wait "$AWAITER" 2>/dev/null || true
    AWAITER=""
  fi
  stop
  record --exit-code "$1"
  echo "[launch] run ended with exit status $1; record: $RUN_DIR/launch.json"
  exit "$1"
}
"""

_TRAPS = r"""
# ---- signals -------------------------------------------------------------------------
# SIGTERM comes from `atropos launch --cancel` (scancel --batch --signal=TERM: this script
# alone), from --signal=B:TERM before the time limit, or from a plain scancel (which also
# sends SIGTERM to every step, and SIGKILL to all after the cluster's KillWait). Either way
# the run stops in order; a second signal while stopping ends what is left at once.
on_signal() {
  if (( STOPPING )); then
    HURRY=1
    echo "[launch] $1 again: ending what is left"
    return 0
  fi
  echo "[launch] $1: stopping the run"
  finish "$2"
}
trap 'on_signal SIGTERM 143' TERM
trap 'on_signal SIGINT 130' INT
"""

_WATCH = r"""
# ---- the run lasts as long as the trainer --------------------------------------------
# The trainer's step ending ends the run with its exit status. Another step ending non-zero
# (its supervisor gave up after the restarts allowed) ends the run with 1; one ending with 0
# (an environment that saw the trainer's last step) is done. After a trainer that finished,
# the environments get ENVS_END seconds to end on their own before the ordered stop.
echo "[launch] all {count} processes ready; logs in $RUN_DIR/logs"
while next_ended; do
  if [[ $ENDED == trainer ]]; then
    echo "[launch] trainer ended with exit status $CODE"
    if (( CODE == 0 )); then
      let_envs_end {envs}
    fi
    finish "$CODE"
  elif (( CODE != 0 )); then
    echo "[launch] error: $ENDED failed (its step ended with $CODE);" \
      "see $RUN_DIR/logs/$ENDED.log"
    finish 1
  fi
  echo "[launch] $ENDED is done"
done
finish 1
"""


def _stop_function(plan: Plan) -> list[str]:
    lines = [
        "# stop: every backend's stop order, each group at once: the trainer (it checkpoints),",
        "# the environments (they drain), the inference servers, the API.",
        "stop() {",
    ]
    lines += [f"  stop_steps {_names(tier)}" for tier in plan.stop_tiers()]
    lines.append("}")
    return lines


def _tiers(plan: Plan, python: str, job_gpus: bool) -> list[str]:
    book: Mapping[str, tuple[str, int]] = {
        p.name: (advertised(p), p.port or 0) for p in plan.processes if p.role in LISTENS
    }
    lines = [
        "# ---- start, tier by tier: a tier starts once the one before is ready -----------------",
        "# Each process's resolved command line is shown above its step; the run key never is",
        "# (the steps read it from RUN_DIR/api.key).",
    ]
    for number, tier in enumerate(plan.tiers(), 1):
        names = _names(tier)
        lines += ["", comment(f"# tier {number}: {names}")]
        for proc in tier:
            lines += _step_lines(plan, proc, book, python, job_gpus)
        lines += [f"await_ready {names} || finish 1", "record"]
    return lines


def _names(procs: list[Process]) -> str:
    """Process names as shell words (names are letters, digits, `_.-` already: quoted anyway)."""
    return " ".join(shlex.quote(p.name) for p in procs)


def _shown(arg: str) -> str:
    """An argument as a comment shows it: quoted only where it has spaces or is empty."""
    return shlex.quote(arg) if not arg or re.search(r"\s", arg) else arg


def _step_lines(
    plan: Plan, proc: Process, book: Mapping[str, tuple[str, int]], python: str, job_gpus: bool
) -> list[str]:
    def render(text: str) -> str:
        return fill(text, proc, book, python=python, run_dir=plan.run_dir, key="<run key>")

    gpus = f", GPUs {','.join(map(str, proc.gpu_ids))} of the node" if proc.gpu_ids else ""
    lines = [
        comment(f"# {proc.headline(f'on node {proc.node}', gpus)}"),
        comment(f"#   $ {' '.join(_shown(render(a)) for a in proc.argv)}"),
    ]
    for name, value in proc.environ.items():
        lines.append(comment(f"#   env {name}={render(value)}"))
    lines += [comment(f"#   env {name}={SECRET_SHOWN}") for name in proc.secret_environ]
    call = f'start {shlex.quote(proc.name)} "${{NODES[{int(proc.node or 0)}]}}"'
    if job_gpus and not proc.gpus:
        call += " --gres=none"  # no GPUs for it (a step gets all of the node's by default)
    lines.append(call)
    return lines
