"""The run itself, the same for the local and Ray backends: start in order, watch, stop in order.

`drive(plan, handles)` takes one handle per process (a `Supervisor` here, an actor wrapping one
on Ray) and:

1. starts the plan's tiers in order, each process of a tier at once, and waits until every
   one is ready; one that fails (exits for good, or misses its deadline) stops the launch with
   a message naming it and the tail of its log;
2. watches: shows each process's state, restarts and uptime, and the run's trainer step, queue
   depth and groups/s from the API's `/stats` (a live table on a terminal, one line per change
   otherwise); a process that fails for good ends the run (exit status 1);
3. ends when the trainer exits (its exit status is the run's) or on SIGINT/SIGTERM (status
   130/143), stopping the trainer first (it checkpoints), then the envs (they drain), the
   inference servers, the API, each tier with its grace period, then SIGKILL to each
   process's own group only; after a trainer that finished (exit 0) the envs first get up to
   `ENVS_END` seconds to end on their own, as they do once they see its last step (so a
   finished run's record says they exited, not that they were stopped);
4. keeps `launch.json` in the run directory: processes, command lines, placements, states,
   exit codes and restarts (rewritten on every change and at the end).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from atropos.launch.keys import write_private
from atropos.launch.plan import Plan, Process
from atropos.launch.supervise import State, Status

REFRESH = 0.5
ENVS_END = 10.0
"""Seconds the envs have to end on their own once the trainer finished (their status poll is
0.5 s, their final report waits at most 5 s): then the ordered stop signals what is left."""
ENDED = frozenset({"exited", "failed", "stopped"})


class Handle(Protocol):
    """What the driver needs of a supervised process, wherever it runs."""

    def begin(self) -> None: ...
    def status(self) -> Status: ...
    def stop(self, grace: float | None = None) -> int | None: ...
    def tail(self, lines: int = 20) -> str: ...


class LaunchError(RuntimeError):
    """The launch could not go on; the message names the process and shows its log's tail."""


class Signals:
    """SIGINT/SIGTERM set `event` (and remember which) instead of raising in the main thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self.count = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self.count += 1
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class RunStats:
    """The run's progress from the API's `/stats`: trainer step, queue depth, groups/s."""

    def __init__(self, api_url: Callable[[], str | None], key: str | None) -> None:
        self.api_url, self.key = api_url, key
        self.step: int | None = None
        self.queued: int | None = None
        self.rate: float | None = None
        self.groups_in = 0
        self.duplicates = 0
        self._last: tuple[float, int] | None = None
        self._next = 0.0
        self.doc: dict[str, Any] | None = None

    def poll(self, now_or_never: bool = False) -> None:
        now = time.monotonic()
        url = self.api_url()
        if url is None or (now < self._next and not now_or_never):
            return
        self._next = now + 1.0
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            doc = httpx.get(f"{url}/stats", headers=headers, timeout=1.0).json()
        except (httpx.HTTPError, ValueError):
            return
        if not isinstance(doc, dict):
            return
        self.doc = doc
        envs = doc.get("envs", {}).values()
        groups_in = sum(int(e.get("groups_in", 0)) for e in envs if isinstance(e, dict))
        self.duplicates = sum(int(e.get("duplicates", 0)) for e in envs if isinstance(e, dict))
        self.step, self.queued = doc.get("step"), doc.get("queued_groups")
        if self._last is not None and now > self._last[0]:
            self.rate = max(0.0, (groups_in - self._last[1]) / (now - self._last[0]))
        self._last, self.groups_in = (now, groups_in), groups_in

    def line(self) -> str:
        if self.step is None:
            return "waiting for the API's /stats"
        rate = f"{self.rate:.1f}" if self.rate is not None else "-"
        return f"trainer step {self.step} · {self.queued} groups queued · {rate} groups/s"


def say(console: Console, text: str) -> None:
    """Print one message as it is: no markup, no highlighting, and no wrapping by Rich, which
    (80 columns when the output is a log, not a terminal) would break a long error's lines and
    fold a path mid-word; a terminal wraps the line itself."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def _uptime(status: Status) -> str:
    if status.started is None or status.state not in ("starting", "ready"):
        return "-"
    seconds = int(time.time() - status.started)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def table(statuses: Sequence[Status], stats: RunStats, plan: Plan) -> Table:
    """The live view: one row a process, the run's progress as the caption."""
    view = Table(title=f"atropos launch: {plan.name} ({plan.backend})", caption=stats.line())
    for column in ("process", "state", "restarts", "uptime", "where", "pid"):
        view.add_column(column)
    colors = {"ready": "green", "failed": "red", "restarting": "yellow", "starting": "cyan"}
    for s in statuses:
        color = colors.get(s.state, "white")
        where = f"{s.host}:{s.port}" if s.port else s.host
        view.add_row(s.name, f"[{color}]{s.state}[/]", str(s.restarts), _uptime(s), where, pid(s))
    return view


def pid(status: Status) -> str:
    """The pid column: the process's id; `1234 ended` once that process ended (its supervisor
    may not have seen it yet: an environment ends by itself after the trainer's last step); `-`
    before it ever started (on Ray: before Ray placed it)."""
    if status.pid is None:
        return "-"
    return str(status.pid) if status.alive else f"{status.pid} ended"


class Record:
    """`launch.json`: the plan's processes with what became of them."""

    def __init__(self, plan: Plan, extra: Mapping[str, Any] | None = None) -> None:
        self.plan, self.extra = plan, dict(extra or {})
        self.path = plan.run_dir / "launch.json"
        self.started = time.time()
        self.exit_code: int | None = None
        self.error: str | None = None
        self.api_stats: dict[str, Any] | None = None  # the API's last /stats before the stop

    def write(self, statuses: Sequence[Status], placements: Mapping[str, Any]) -> None:
        procs = []
        by_name = {s.name: s for s in statuses}
        for proc in self.plan.processes:
            s = by_name.get(proc.name)
            entry: dict[str, Any] = {
                "name": proc.name, "role": proc.role,
                "command": s.argv if s and s.argv else proc.argv,
                "placement": placements.get(proc.name, {}),
                "gpus": proc.gpus, "node": proc.node,
            }  # fmt: skip
            if s is not None:
                entry.update(
                    state=s.state, restarts=s.restarts, exit_codes=s.exit_codes, pid=s.pid,
                    address=f"{s.host}:{s.port}" if s.port else None, log=s.log,
                    ready_after=s.ready_after, reason=s.reason.split("\n", 1)[0] or None,
                )  # fmt: skip
            procs.append(entry)
        doc = {
            "name": self.plan.name, "backend": self.plan.backend,
            "run_dir": str(self.plan.run_dir), "started": self.started,
            "ended": time.time() if self.exit_code is not None else None,
            "exit_code": self.exit_code, "error": self.error, **self.extra,
            "api_stats": self.api_stats, "processes": procs,
        }  # fmt: skip
        write_private(self.path, json.dumps(doc, indent=2))


def drive(
    plan: Plan,
    handles: Mapping[str, Handle],
    *,
    key: str | None = None,
    console: Console | None = None,
    live: bool | None = None,
    placements: Callable[[], Mapping[str, Any]] = dict,
    extra_record: Mapping[str, Any] | None = None,
) -> int:
    """Run `plan` through `handles` (module docstring); the run's exit status.

    Long because the run's phases (start in order, watch, stop) share the live display, the handles
    and the record, and read best in order.
    """
    console = console or Console(stderr=True)
    live = console.is_terminal if live is None else live
    record = Record(plan, extra_record)
    stats = RunStats(lambda: _api_url(handles), key)
    shown: dict[str, tuple[str, int]] = {}

    def statuses() -> list[Status]:
        return [handles[p.name].status() for p in plan.processes]

    def report(current: list[Status]) -> None:
        if live:
            return
        for s in current:
            seen = shown.get(s.name)
            if seen == (s.state, s.restarts) or s.state == "waiting":
                continue
            shown[s.name] = (s.state, s.restarts)
            extra = f" (restart {s.restarts})" if s.restarts and s.state == "ready" else ""
            if s.state == "restarting":
                extra = f": {s.reason.splitlines()[0]}"
            say(console, f"[launch] {s.name}: {s.state}{extra}")

    exit_code = 1
    with Signals() as signals, _View(live, console) as view:

        def tick() -> list[Status]:
            current = statuses()
            stats.poll()
            report(current)
            if view.live is not None:
                view.live.update(table(current, stats, plan))
            return current

        last_write = 0.0
        last_snapshot: list[tuple[State, int, int | None]] = []
        try:
            for tier in plan.tiers():
                _start_tier(tier, handles, signals.event, tick)
                if signals.event.is_set():
                    break
                record.write(statuses(), placements())
            if not signals.event.is_set():
                say(
                    console,
                    f"[launch] all {len(plan.processes)} processes ready; logs in"
                    f" {plan.run_dir / 'logs'}",
                )
            while not signals.event.is_set():
                current = tick()
                by_name = {s.name: s for s in current}
                trainer = by_name.get("trainer")
                if trainer is not None and trainer.state in ("exited", "failed"):
                    exit_code = trainer.exit_code if trainer.exit_code is not None else 1
                    if trainer.state == "failed" and exit_code == 0:
                        exit_code = 1
                    if trainer.state == "failed":
                        record.error = trainer.reason.split("\n", 1)[0]
                        say(console, f"[launch] error: {trainer.reason}")
                    else:
                        _let_envs_end(tick, signals.event)
                    break
                failed = [s for s in current if s.state == "failed"]
                if failed:
                    record.error = failed[0].reason.split("\n", 1)[0]
                    raise LaunchError(failed[0].reason)
                snapshot = [(s.state, s.restarts, s.pid) for s in current]
                if snapshot != last_snapshot or time.monotonic() - last_write > 5:
                    record.write(current, placements())
                    last_write, last_snapshot = time.monotonic(), snapshot
                signals.event.wait(REFRESH)
            if signals.signum is not None:
                exit_code = 128 + signals.signum
                say(console, f"[launch] {signal.Signals(signals.signum).name}: stopping the run")
        except LaunchError as err:
            record.error = str(err).split("\n", 1)[0]
            say(console, f"[launch] error: {err}")
            exit_code = 1
        finally:
            stats.poll(now_or_never=True)
            record.api_stats = stats.doc
            view_now = view.live  # the table follows the stop (else it shows the last tick)
            stop_all(
                plan, handles, console, signals,
                refresh=(lambda: view_now.update(table(statuses(), stats, plan)))
                if view_now is not None else None,
            )  # fmt: skip
            final = statuses()
            if live and view.live is not None:
                view.live.update(table(final, stats, plan))
            record.exit_code = exit_code
            record.write(final, placements())
    lost = f", {stats.duplicates} duplicate groups" if stats.duplicates else ""
    say(console, f"[launch] run ended with exit status {exit_code}{lost}; record: {record.path}")
    return exit_code


def _let_envs_end(tick: Callable[[], list[Status]], stop: threading.Event) -> None:
    """After a trainer that finished, wait up to `ENVS_END` seconds for the envs to end on
    their own (each sees the trainer's last step at its next status poll, sends what it holds
    and exits) before the ordered stop signals them; a signal cuts the wait short."""
    end = time.monotonic() + ENVS_END
    while time.monotonic() < end and not stop.is_set():
        if all(s.state in ENDED for s in tick() if s.role == "env"):
            return
        stop.wait(0.1)


def _start_tier(
    tier: list[Process],
    handles: Mapping[str, Handle],
    stop: threading.Event,
    tick: Callable[[], list[Status]],
) -> None:
    for proc in tier:
        handles[proc.name].begin()
    names = {p.name for p in tier}
    while not stop.is_set():
        current = [s for s in tick() if s.name in names]
        bad = [s for s in current if s.state in ("failed", "exited", "stopped")]
        if bad:
            s = bad[0]
            reason = s.reason or f"{s.name} ended ({s.state}) before the run started"
            raise LaunchError(f"{s.name} did not come up: {reason}")
        if all(s.state == "ready" for s in current):
            return
        stop.wait(REFRESH / 2)


def stop_all(
    plan: Plan,
    handles: Mapping[str, Handle],
    console: Console,
    hurry: Signals | None = None,
    refresh: Callable[[], None] | None = None,
) -> None:
    """Stop every process: trainer, envs, inference, API; each tier at once, then the next.

    A second SIGINT/SIGTERM while stopping (`hurry`) cuts every grace period short: what is
    still running gets SIGKILL at once. `refresh` (the live table's) is called about twice a
    second meanwhile."""
    hurried = False
    next_refresh = 0.0
    for tier in plan.stop_tiers():
        threads = [
            threading.Thread(target=handles[p.name].stop, name=f"stop-{p.name}", daemon=True)
            for p in tier
        ]
        for t in threads:
            t.start()
        for t, proc in zip(threads, tier, strict=True):
            end = time.monotonic() + proc.grace + 15
            while t.is_alive() and time.monotonic() < end:
                if hurry is not None and hurry.count >= 2 and not hurried:
                    hurried = True
                    say(console, "[launch] second signal: killing what is left")
                if hurried:
                    handles[proc.name].stop(0)
                if refresh is not None and time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + REFRESH
                    refresh()
                t.join(0.1)
            if t.is_alive():
                say(console, f"[launch] {proc.name} did not stop in time")


def _api_url(handles: Mapping[str, Handle]) -> str | None:
    api = handles.get("api")
    if api is None:
        return None
    s = api.status()
    if s.state != "ready" or not s.port:
        return None
    return f"http://{s.host}:{s.port}"


class _View:
    def __init__(self, enabled: bool, console: Console) -> None:
        self.enabled, self.console = enabled, console
        self.live: Live | None = None

    def __enter__(self) -> _View:
        if self.enabled:
            self.live = Live(console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)
