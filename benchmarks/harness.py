"""What the rollout proxy and the sandbox cost per harness rollout, against the harness calling
the fake inference server directly; and rollouts per minute with 16 sandboxes at once.

    nice -n 10 .venv/bin/python benchmarks/harness.py --rollouts 10 --concurrent 16

One task for every harness: `greet.py` prints hello, the instruction asks for goodbye, the test
is `test "$(python3 greet.py)" = goodbye`. A scripted policy (`policy`, run by a fake inference
server in its own process, `python -m atropos.testing.fake_server --responder harness:policy`)
makes one edit with the harness's own tool (mini-SWE-agent: `sed` through bash; Claude Code: its
Edit tool; Codex: `apply_patch` through exec_command), then ends (mini: its submit command;
the others: a plain answer). Every rollout is two model calls and should score 1.0.

Modes, each `--rollouts` rollouts one after the other (after one warm-up rollout, not counted):

- `direct` (mini-SWE-agent only): the harness on the host, a plain subprocess in a fresh folder,
  pointed at the fake server's `/v1/chat/completions`, then the test on the host. The fake
  server answers chat with text only (no `tool_calls`, no streaming, no Anthropic Messages nor
  Responses), so Claude Code and Codex cannot call it directly, and mini-SWE-agent runs with
  its text-based model (`litellm_textbased`, `mini_textbased.yaml`: the action is a
  ```` ```mswea_bash_command ```` block) instead of the shipped tool calls.
- `proxy_text` (mini-SWE-agent only): the same text-based run through a proxy session: the
  proxy's own cost, like for like with `direct`.
- `proxy`: the harness as shipped (its files, environment and argv from `atropos.harnesses`)
  on the host, a plain subprocess, pointed at a session of the environment's proxy (in this
  process), then the test on the host. No sandbox.
- `full`: `HarnessEnv.rollout`: a session, a bubblewrap sandbox with the model-only network
  (its relay), the harness's install bound in, the harness, the test in the sandbox, the score.

Measured per rollout: wall p50/p95 (s); CPU seconds, the mode's total over its rollouts
divided by their number, of this process (`self`: the proxy, the environment, the sandbox's
management; getrusage SELF), of every process it started (`children`: the harness's process
tree and the test; in `full` also nsenter, setpriv, bwrap and the relay), and of the fake
server (`server`, its /proc counters); the score and how the harness exited. `children` is a
cpuacct cgroup's total less `self` (cgroup v1, as root: this process moves into a cgroup of
its own once the fake server runs, so it and everything it starts are counted, orphans
included); getrusage(CHILDREN) misses a sandboxed harness (it saw 0.08 s of a sandboxed
mini-SWE-agent run that takes about 4 s: bwrap's tree is not reaped up to us), and is the
fallback only where no cgroup can be made (`children_cpu_from` in the JSON). Overheads:
`proxy_text - direct` (the proxy) and `full - proxy` (the sandbox and the test in it), in
median wall and in all CPU (self + children + server). Then `--concurrent` `full` rollouts
at once (`max_sandboxes` as many): wall, rollouts per minute (scored ones), CPU per rollout,
failures. Prints a table, writes
benchmarks/results/harness.json. One run of the defaults takes about 5-10 minutes here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from procstat import code_version, cpu_seconds, machine, machine_busy_seconds  # noqa: E402

from atropos.harnesses import harness_named  # noqa: E402
from atropos.harnesses.base import Harness, HarnessCall, Installed  # noqa: E402
from atropos.harnesses.env import HarnessEnv, HarnessEnvConfig  # noqa: E402
from atropos.harnesses.mini_swe_agent import MiniSweAgent  # noqa: E402
from atropos.harnesses.run import SYSTEM_PATH, base_url  # noqa: E402
from atropos.harnesses.tasks import HarnessTask, load_tasks  # noqa: E402
from atropos.inference.config import APIServerConfig  # noqa: E402
from atropos.testing import free_port  # noqa: E402

HARNESS_NAMES = ("mini-swe-agent", "claude-code", "codex")
MODES = ("direct", "proxy_text", "proxy", "full")
TIMEOUT = 180.0  # seconds for one harness run
INSTRUCTION = "Make greet.py print goodbye instead of hello."
TEST = 'test "$(python3 greet.py)" = goodbye'
PATCH = (
    "*** Begin Patch\n*** Update File: greet.py\n-print('hello')\n+print('goodbye')\n*** End Patch"
)


# ----- the scripted policy (runs in the fake server's process) ----------------------------------


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _bash_block(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


def policy(prompt: str) -> str:
    """Answer the k-th call of a conversation (k = assistant turns already in the prompt): the
    edit in the harness's own tool, then the end. The harness is told by its prompt."""
    done = prompt.count("<|im_start|>assistant") - 1  # the prompt ends with one, open
    if "mswea_bash_command" in prompt:  # mini-SWE-agent, text-based
        if done == 0:
            return _bash_block("sed -i 's/hello/goodbye/' greet.py")
        return _bash_block("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    if "exec_command" in prompt:  # Codex
        if done == 0:
            return _call("exec_command", cmd=f"apply_patch <<'EOF'\n{PATCH}\nEOF")
        return "Done: greet.py now prints goodbye."
    if "Claude Code" in prompt:
        if done == 0:
            found = re.search(r"orking directory: (/[^\s`]+)", prompt)
            path = f"{found.group(1) if found else '/work/repo'}/greet.py"
            return _call("Edit", file_path=path, old_string="hello", new_string="goodbye")
        return "Done: greet.py now prints goodbye."
    if done == 0:  # mini-SWE-agent with tool calls
        return _call("bash", command="sed -i 's/hello/goodbye/' greet.py")
    return _call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


# ----- mini-SWE-agent's text-based variant (the one the fake server can answer directly) --------


class MiniText(MiniSweAgent):
    """mini-SWE-agent with its text-based model and config: the shipped harness otherwise."""

    def files(self, call: HarnessCall) -> dict[str, bytes]:
        [(path, data)] = super().files(call).items()
        config = json.loads(data)
        config["model"]["model_class"] = "litellm_textbased"
        return {path: json.dumps(config).encode()}

    def command(self, call: HarnessCall) -> list[str]:
        argv = super().command(call)
        return [*argv[:-1], argv[-1].replace("-c mini.yaml", "-c mini_textbased.yaml")]


# ----- one rollout on the host ------------------------------------------------------------------


def _host(text: str, installed: Installed) -> str:
    """`text` with each mount's path inside the sandbox replaced by its host path."""
    for inside, host in installed.mounts.items():
        text = text.replace(inside, str(host))
    return text


async def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Any:
    """Run `argv` as a process group; its exit status, stdout, stderr and whether it timed out
    (then the whole group is SIGKILLed)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        return proc.returncode, out, err, False
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
        return proc.returncode, out, err, True


async def host_rollout(
    harness: Harness, installed: Installed, task: HarnessTask, url: str, key: str, folder: Path
) -> dict[str, Any]:
    """`harness` as a plain subprocess in `folder` against `url`, then the task's test there."""
    from atropos.sandbox import ExecResult

    repo, home = folder / "repo", folder / "home"
    repo.mkdir(parents=True)
    home.mkdir()
    for path, data in task.files.items():
        (repo / path).write_bytes(data)
    call = HarnessCall(INSTRUCTION, url, key, "atropos-tiny", str(repo), str(home), 32, TIMEOUT)
    for path, data in harness.files(call).items():
        target = Path(path) if path.startswith("/") else repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    env = {"HOME": str(home), "PATH": ":".join([*installed.path, SYSTEM_PATH])}
    env |= harness.environment(call)
    env = {k: _host(v, installed) for k, v in env.items()}
    argv = [_host(a, installed) for a in harness.command(call)]
    started = time.monotonic()
    code, out, err, timed_out = await _run(argv, repo, env, TIMEOUT)
    harness_seconds = time.monotonic() - started
    exit = harness.outcome(ExecResult(code, out, err, timed_out), 1)
    test = await _run(["/bin/sh", "-c", task.test], repo, {"PATH": SYSTEM_PATH}, 60)
    return {
        "exit": exit.reason if exit.ok else f"failed:{exit.reason}",
        "detail": "" if exit.ok else exit.detail[-400:],
        "score": 1.0 if test[0] == 0 else 0.0,
        "harness_s": harness_seconds,
    }


# ----- the modes ------------------------------------------------------------------------------


class Bench:
    """One harness's environment (its proxy over the fake server) and how each mode runs."""

    def __init__(self, name: str, fake_url: str, tasks: Path, work: Path, sandboxes: int) -> None:
        self.name, self.fake_url, self.work = name, fake_url, work
        config = HarnessEnvConfig(
            harness=name,
            tasks=str(tasks),
            group_size=1,
            tokenizer_name="tiny",
            use_wandb=False,
            agent_timeout=TIMEOUT,
            verifier_timeout=60.0,
            max_sandboxes=sandboxes,
        )
        server = APIServerConfig(base_url=fake_url, server_type="vllm", model_name="atropos-tiny")
        self.env = HarnessEnv(config, [server])
        self.count = 0

    async def setup(self) -> None:
        await self.env.setup()
        [self.task] = load_tasks(self.env.config.tasks)
        self.harness: Harness = self.env.harness
        self.installed: Installed = self.env.installed

    async def rollout(self, mode: str) -> dict[str, Any]:
        self.count += 1
        folder = self.work / f"{self.name}-{mode}-{self.count}"
        if mode == "direct":
            harness: Harness = MiniText()
            row = await host_rollout(harness, self.installed, self.task, self.fake_url, "x", folder)
        elif mode in ("proxy_text", "proxy"):
            harness = MiniText() if mode == "proxy_text" else self.harness
            session = await self.env.proxy.create_session()
            try:
                url = base_url(self.env.proxy_url, session, harness.dialect)
                row = await host_rollout(
                    harness, self.installed, self.task, url, session.key, folder
                )
                row["calls"] = session.turns
            finally:
                self.env.proxy.delete(session.id)
        else:
            run = await self.env.rollout(self.task)
            result = run.output
            row = {
                "exit": result.exit.reason
                if result.failure is None
                else f"failed:{result.failure}",
                "detail": "" if result.failure is None else result.detail[-400:],
                "score": result.score,
                "harness_s": result.harness_seconds,
                "calls": run.trajectory.turns,
            }
        shutil.rmtree(folder, ignore_errors=True)
        return row


CGROUP = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None  # this process's own cpuacct cgroup, when made


def enter_cgroup() -> bool:
    """Move this process into a cpuacct cgroup of its own (cgroup v1, as root), so that every
    process it starts from now on, orphans included, is counted; False where that fails."""
    global _group
    group = CGROUP / f"atropos-harness-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as error:
        print(f"no cpuacct cgroup ({error}): children's CPU from getrusage", flush=True)
        with contextlib.suppress(OSError):
            group.rmdir()
        return False
    _group = group
    return True


def leave_cgroup() -> None:
    """Back to the root cgroup; the own one removed once its last process has ended."""
    if _group is None:
        return
    (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _group.rmdir()
            return
        except OSError:
            time.sleep(0.2)
    print(f"left {_group}: processes remain in it", flush=True)


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process, and of the processes it started: the cgroup's
    total less its own (getrusage CHILDREN, reaped children only, without the cgroup)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    mine = own.ru_utime + own.ru_stime
    if _group is not None:
        return mine, int((_group / "cpuacct.usage").read_text()) / 1e9 - mine
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine, kids.ru_utime + kids.ru_stime


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(bench: Bench, mode: str, n: int, fake_pid: int) -> dict[str, Any]:
    """`n` rollouts of `mode` one after the other (after a warm-up one): wall and CPU."""
    warm = await bench.rollout(mode)
    print(f"  {bench.name} {mode} warm-up: {warm['exit']} score {warm['score']}", flush=True)
    rows, walls = [], []
    self0, kids0 = _cpu()
    server0, busy0, t0 = cpu_seconds(fake_pid), machine_busy_seconds(), time.monotonic()
    for i in range(n):
        began = time.monotonic()
        row = await bench.rollout(mode)
        walls.append(time.monotonic() - began)
        rows.append(row)
        print(
            f"  {bench.name} {mode} {i + 1}/{n}: {walls[-1]:.2f} s, {row['exit']},"
            f" score {row['score']} {row['detail'][:200]}",
            flush=True,
        )
    self1, kids1 = _cpu()
    elapsed = time.monotonic() - t0
    return {
        "rollouts": n,
        "wall_p50_s": statistics.median(walls),
        "wall_p95_s": _p(walls, 0.95),
        "harness_p50_s": statistics.median(r["harness_s"] for r in rows),
        "cpu_self_s": (self1 - self0) / n,
        "cpu_children_s": (kids1 - kids0) / n,
        "cpu_server_s": (cpu_seconds(fake_pid) - server0) / n,
        "machine_load_cores": (machine_busy_seconds() - busy0) / elapsed,
        "scores": [r["score"] for r in rows],
        "exits": [r["exit"] for r in rows],
        "failures": [r["detail"] for r in rows if r["exit"].startswith("failed")],
        "walls_s": walls,
    }


async def concurrent(bench: Bench, count: int, fake_pid: int) -> dict[str, Any]:
    """`count` full rollouts at once: wall, rollouts per minute, CPU per rollout, failures."""
    self0, kids0 = _cpu()
    server0, busy0, t0 = cpu_seconds(fake_pid), machine_busy_seconds(), time.monotonic()
    rows = await asyncio.gather(*(bench.rollout("full") for _ in range(count)))
    wall = time.monotonic() - t0
    self1, kids1 = _cpu()
    failed = [r for r in rows if r["exit"].startswith("failed")]
    return {
        "rollouts": count,
        "wall_s": wall,
        "rollouts_per_min": 60 * (count - len(failed)) / wall,
        "cpu_self_s": (self1 - self0) / count,
        "cpu_children_s": (kids1 - kids0) / count,
        "cpu_server_s": (cpu_seconds(fake_pid) - server0) / count,
        "machine_load_cores": (machine_busy_seconds() - busy0) / wall,
        "scores": [r["score"] for r in rows],
        "failures": [f"{r['exit']}: {r['detail'][:300]}" for r in failed],
    }


# ----- the table and main ---------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    head = "| harness | mode | wall p50 / p95 (s) | CPU self / children / server (s) | scores |"
    rows = [head, "|---|---|---|---|---|"]
    for name, found in results.items():
        for mode, m in found["modes"].items():
            cpu = f"{m['cpu_self_s']:.2f} / {m['cpu_children_s']:.2f} / {m['cpu_server_s']:.2f}"
            ok = sum(1 for s in m["scores"] if s == 1.0)
            rows.append(
                f"| {name} | {mode} | {m['wall_p50_s']:.2f} / {m['wall_p95_s']:.2f} | {cpu}"
                f" | {ok}/{m['rollouts']} |"
            )
        c = found.get("concurrent")
        if c:
            cpu = f"{c['cpu_self_s']:.2f} / {c['cpu_children_s']:.2f} / {c['cpu_server_s']:.2f}"
            ok = sum(1 for s in c["scores"] if s == 1.0)
            rows.append(
                f"| {name} | {c['rollouts']} at once | {c['wall_s']:.1f} wall,"
                f" {c['rollouts_per_min']:.1f} rollouts/min | {cpu} | {ok}/{c['rollouts']} |"
            )
    return "\n".join(rows)


def overheads(found: dict[str, Any]) -> dict[str, float]:
    """Median differences: the proxy (`proxy_text - direct`), the sandbox and test in it
    (`full - proxy`), in wall seconds and in all CPU seconds (self + children + server)."""
    modes = found["modes"]

    def cpu(m: dict[str, Any]) -> float:
        return float(m["cpu_self_s"] + m["cpu_children_s"] + m["cpu_server_s"])

    out = {}
    for label, a, b in (("proxy", "proxy_text", "direct"), ("sandbox", "full", "proxy")):
        if a in modes and b in modes:
            out[f"{label}_wall_s"] = modes[a]["wall_p50_s"] - modes[b]["wall_p50_s"]
            out[f"{label}_cpu_s"] = cpu(modes[a]) - cpu(modes[b])
    return out


async def bench_one(
    name: str, args: argparse.Namespace, fake: str, pid: int, tmp: Path
) -> dict[str, Any]:
    bench = Bench(name, fake, tmp / "tasks.jsonl", tmp, max(1, args.concurrent))
    await bench.setup()
    try:
        modes = [m for m in args.modes if name == "mini-swe-agent" or m in ("proxy", "full")]
        found: dict[str, Any] = {"modes": {}}
        for mode in modes:
            found["modes"][mode] = await measure(bench, mode, args.rollouts, pid)
        if args.concurrent:
            print(f"  {name}: {args.concurrent} full rollouts at once", flush=True)
            found["concurrent"] = await concurrent(bench, args.concurrent, pid)
        found["overheads"] = overheads(found)
        return found
    finally:
        await bench.env.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10, help="rollouts per mode")
    parser.add_argument(
        "--concurrent", type=int, default=16, help="full rollouts at once (0: skip)"
    )
    parser.add_argument("--harness", choices=HARNESS_NAMES, action="append", help="default: all")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/harness.json"))
    args = parser.parse_args()
    names = args.harness or list(HARNESS_NAMES)
    for name in names:
        harness_named(name).install()  # cached; installs on first use, with progress
    tmp = Path(tempfile.mkdtemp(prefix="atropos-harness-bench-", dir="/tmp"))
    tmp.chmod(0o711)  # the sandboxes' uids traverse it to their run root
    os.environ["ATROPOS_SANDBOX_ROOT"] = str(tmp / "sandboxes")
    (tmp / "sandboxes").mkdir(mode=0o711)
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "greet.py").write_text("print('hello')\n")
    task = {"id": "greet", "instruction": INSTRUCTION, "snapshot": "repo", "test": TEST}
    (tmp / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    fake_argv = [
        sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port),
        "--max-model-len", "131072", "--responder", "harness:policy",
    ]  # fmt: skip
    log = (tmp / "fake.log").open("wb")
    fake = subprocess.Popen(fake_argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    results: dict[str, Any] = {}
    counted = False
    try:
        from atropos.demo.procs import wait_until_up

        wait_until_up(f"http://127.0.0.1:{port}/v1/models", deadline=60)
        counted = enter_cgroup()  # after the fake server started: it stays outside
        for name in names:
            print(f"{name}:", flush=True)
            url = f"http://127.0.0.1:{port}/v1"
            results[name] = asyncio.run(bench_one(name, args, url, fake.pid, tmp))
    finally:
        leave_cgroup()
        fake.terminate()
        try:
            fake.wait(timeout=15)
        except subprocess.TimeoutExpired:
            fake.kill()
            fake.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(results))
    for name, found in results.items():
        print(f"{name} overheads: {found['overheads']}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"args": vars(args), "machine": machine(), "code": code_version()}
    doc |= {"children_cpu_from": "cgroup" if counted else "getrusage", "results": results}
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
