"""The Ray backend: each process of the plan inside a Ray actor that supervises it.

`backend: ray` joins a running cluster (`run.ray.address`, `--address`, `$RAY_ADDRESS`) or,
with none, starts a local one sized for the run. Every process gets one actor
(`ProcessActor`), which runs the same `Supervisor` as the local backend on the node Ray placed
it on: the same readiness gates, restarts and stop rules. The driver (`drive`) is the local
backend's too; only the handles differ (`RayHandle` calls the actor).

Placement: each actor asks for the process's `cpus`, `gpus` and custom `resources`;
environment replicas are spread over the nodes (`SPREAD`); a process with GPUs gets a
placement group of its own (one bundle, `STRICT_PACK`), so its GPUs sit on one node and are
reserved before it starts. A process Ray cannot place within its `ready_timeout` fails the
launch with what it asked for and what the cluster has.

Addresses: a listening process binds its node's address (Ray's node IP) unless the run file
gives a host, on a free port picked on that node; others reach it at `http://NODE_IP:PORT`,
never 127.0.0.1 across nodes. Ray runs always make the run key (`keys.run_key`).

Logs: each actor writes its process's log on its own node; the driver copies new lines into
`RUN_DIR/logs/NAME.log` about once a second and at the end. The run directory's other contents
(the trainer's checkpoints, the API's store, env spools) are written on the node that runs the
process, at the same path: on a cluster, put `run.directory` on a filesystem the nodes share.

Ending the run stops every process in order, kills every actor and placement group it created,
and leaves a cluster it joined running (a local one it started goes with it).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from atropos.install import install_hint
from atropos.launch.config import RunFile
from atropos.launch.driver import drive
from atropos.launch.keys import run_key, write_private
from atropos.launch.plan import Plan, Process, symbolic_book
from atropos.launch.show import describe
from atropos.launch.supervise import LISTENS, Status, Supervisor

PROG = "atropos launch"
RAY_EXTRA = f"backend ray needs Ray: {install_hint('ray')}"
LOG_PULL = 1.0


class ProcessActor:
    """Runs one process of the plan under a `Supervisor` on the node Ray placed it on."""

    def __init__(
        self,
        proc: dict[str, Any],
        run_dir: str,
        key: str | None,
        run_name: str,
        secrets: dict[str, str] | None = None,
    ):
        import ray

        self.proc = Process.model_validate(proc)
        self.run_dir = Path(run_dir)
        self.key = key
        self.secrets = dict(secrets or {})  # its secret environment, as the key: never on disk
        self.node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.node_id = ray.get_runtime_context().get_node_id()
        base = Path(tempfile.gettempdir()) / "atropos-launch" / run_name / self.node_id[:12]
        self.log_dir = base / "logs"
        self.sup: Supervisor | None = None
        # Ray sets OMP_NUM_THREADS=1 in its workers; the processes supervised here size their
        # threads as they would when started by hand (cap them with environ: in the run file)
        if os.environ.get("OMP_NUM_THREADS") == "1" and "OMP_NUM_THREADS" not in self.proc.environ:
            os.environ.pop("OMP_NUM_THREADS")

    def where(self) -> dict[str, Any]:
        import socket

        return {"node_id": self.node_id, "node_ip": self.node_ip, "hostname": socket.gethostname()}

    def begin(self, book: dict[str, tuple[str, int]]) -> None:
        proc = self.proc
        if proc.role in LISTENS and not proc.host:
            proc.host = self.node_ip
        self.sup = Supervisor(
            proc,
            run_dir=self.run_dir,
            book=dict(book),
            python=sys.executable,
            key=self.key,
            secrets=self.secrets,
            log_dir=self.log_dir,
            advertise=self.node_ip if proc.host in ("", "0.0.0.0", "::") else proc.host,
        )
        self.sup.begin()

    def status(self) -> dict[str, Any] | None:
        return self.sup.status().as_dict() if self.sup is not None else None

    def stop(self, grace: float | None) -> int | None:
        return self.sup.stop(grace) if self.sup is not None else None

    def tail(self, lines: int) -> str:
        return self.sup.tail(lines) if self.sup is not None else ""

    def read_log(self, offset: int) -> tuple[bytes, int]:
        """Log bytes from `offset` (at most 4 MiB), and the offset after them."""
        path = self.log_dir / f"{self.proc.name}.log"
        try:
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read(4 << 20)
        except OSError:
            return b"", offset
        return data, offset + len(data)


class RayHandle:
    """The driver's side of one `ProcessActor` (`driver.Handle`)."""

    def __init__(
        self, plan: Plan, proc: Process, key: str, book: dict[str, tuple[str, int]]
    ) -> None:
        self.plan, self.proc, self.key, self.book = plan, proc, key, book
        self.actor: Any = None
        self.group: Any = None
        self.asked_at: float | None = None
        self.placed: dict[str, Any] = {}
        self.last: Status = _status(proc, "waiting")
        self.log_offset = 0
        self.log_path = plan.run_dir / "logs" / f"{proc.name}.log"
        self.next_pull = 0.0
        self.removed = False

    # ----- driver.Handle -------------------------------------------------------------------------

    def begin(self) -> None:
        import ray

        options: dict[str, Any] = {
            "num_cpus": self.proc.cpus,
            "num_gpus": self.proc.gpus,
            "resources": dict(self.proc.resources),
            "name": f"{self.plan.name}:{self.proc.name}",
            "max_restarts": 0,
        }
        if self.proc.gpus:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": self.proc.cpus, "GPU": float(self.proc.gpus), **self.proc.resources}
            self.group = placement_group([bundle], strategy="STRICT_PACK")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=0
            )
        elif self.proc.role == "env":
            options["scheduling_strategy"] = "SPREAD"
        actor_class = ray.remote(ProcessActor)
        self.actor = actor_class.options(**options).remote(
            self.proc.model_dump(mode="json"),
            str(self.plan.run_dir),
            self.key,
            self.plan.name,
            self.plan.secrets(self.proc.name),
        )
        self.actor.begin.remote(dict(self.book))
        self.asked_at = time.monotonic()
        self.last = _status(self.proc, "waiting", "waiting for Ray to place it")

    def status(self) -> Status:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self.actor is None or self.removed:
            return self.last
        try:
            doc = ray.get(self.actor.status.remote(), timeout=2.0)
        except GetTimeoutError:
            return self._unplaced()
        except RayActorError as err:
            self.last = _status(self.proc, "failed", f"{self.proc.name}: its Ray actor died: {err}")
            return self.last
        if doc is None:
            return self._unplaced()
        if not self.placed:
            self.placed = ray.get(self.actor.where.remote(), timeout=10)
        self.last = Status(**doc)
        if self.last.port and self.proc.role in LISTENS:
            self.book[self.proc.name] = (self.last.host, self.last.port)
        if time.monotonic() >= self.next_pull:
            self.pull_log()
        return self.last

    def stop(self, grace: float | None = None) -> int | None:
        import ray
        from ray.exceptions import RayActorError

        if self.actor is None or self.removed:
            return None
        wait = self.proc.grace if grace is None else grace
        try:
            code = ray.get(self.actor.stop.remote(grace), timeout=wait + 30)
            doc = ray.get(self.actor.status.remote(), timeout=10)
        except (RayActorError, ray.exceptions.GetTimeoutError):
            return None
        if doc is not None:
            self.last = Status(**doc)
        self.pull_log()
        return code if isinstance(code, int) else None

    def tail(self, lines: int = 20) -> str:
        import ray

        if self.actor is None:
            return ""
        try:
            return str(ray.get(self.actor.tail.remote(lines), timeout=10))
        except Exception:  # the actor is gone: the copied log is what is left
            return ""

    # ----- Ray's side ----------------------------------------------------------------------------

    def _unplaced(self) -> Status:
        """Status of an actor Ray has not started: waiting, or failed past the deadline."""
        waited = time.monotonic() - (self.asked_at or time.monotonic())
        if waited > self.proc.ready_timeout:
            import ray

            asks = {"CPU": self.proc.cpus, "GPU": self.proc.gpus, **self.proc.resources}
            asks = {k: v for k, v in asks.items() if v}
            resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
            has = {k: v for k, v in resources.items() if not k.startswith("node:")}
            self.last = _status(
                self.proc,
                "failed",
                f"Ray could not place {self.proc.name} within {self.proc.ready_timeout:g} s:"
                f" it asks for {asks}; the cluster has {has}",
            )
        return self.last

    def pull_log(self) -> None:
        """Append the actor's new log bytes to RUN_DIR/logs/NAME.log."""
        import ray

        self.next_pull = time.monotonic() + LOG_PULL
        try:
            data, offset = ray.get(self.actor.read_log.remote(self.log_offset), timeout=10)
        except Exception:  # the actor is gone or busy: try again later
            return
        if data:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as f:
                f.write(data)
            self.log_offset = offset

    def remove(self) -> None:
        """Kill the actor and remove its placement group (after `stop`)."""
        import ray

        self.removed = True
        if self.actor is not None:
            ray.kill(self.actor)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)


def _status(proc: Process, state: Any, reason: str = "") -> Status:
    return Status(
        name=proc.name, role=proc.role, state=state, restarts=0, pid=None, exit_code=None,
        exit_codes=[], started=None, ready_after=None, reason=reason, host="",
        port=proc.port, log="", argv=[],
    )  # fmt: skip


def _connect(run_file: RunFile, plan: Plan) -> tuple[str, bool]:
    """Join the cluster (or start a local one); its address and whether we started it."""
    import ray

    address = run_file.run.ray.address or os.environ.get("RAY_ADDRESS")
    namespace = run_file.run.ray.namespace or f"atropos-{plan.name}"
    common: dict[str, Any] = {"namespace": namespace, "log_to_driver": False}
    info: Any
    if address:
        info = ray.init(address=address, **common)
        return str(info.address_info.get("gcs_address", address)), False
    # A cluster of this machine alone, sized for the run's logical CPUs, on loopback: Ray would
    # otherwise bind its services to the machine's outward address.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cpus = max(os.cpu_count() or 1, math.ceil(sum(p.cpus for p in plan.processes)))
    info = ray.init(num_cpus=cpus, include_dashboard=False, **common)
    return str(info.address_info.get("gcs_address", "local")), True


def main(plan: Plan, run_file: RunFile, *, dry_run: bool, live: bool | None) -> int:
    """Run `plan` on Ray; the run's exit status."""
    if dry_run:
        where = {p.name: _where_text(p) for p in plan.processes}
        print(
            describe(
                plan, symbolic_book(plan), python="python", where=where, keyed=True,
                key_note=f"a key is made for this run in {plan.run_dir / 'api.key'}",
            )
        )  # fmt: skip
        return 0
    try:
        import ray  # noqa: F401
    except ImportError:
        print(f"{PROG}: error: {RAY_EXTRA}", file=sys.stderr)
        return 2
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    write_private(plan.run_dir / "plan.json", plan.model_dump_json(indent=2))
    key = run_key(plan, force=True)
    assert key is not None
    address, started = _connect(run_file, plan)
    book: dict[str, tuple[str, int]] = {}
    handles = {p.name: RayHandle(plan, p, key, book) for p in plan.processes}
    try:
        return drive(
            plan, handles, key=key, live=live,
            placements=lambda: {n: h.placed for n, h in handles.items()},
            extra_record={"ray": {"address": address, "started_here": started}},
        )  # fmt: skip
    finally:
        import ray

        for handle in handles.values():
            try:
                handle.remove()
            except Exception as err:  # one actor that cannot be removed must not keep others
                print(f"{PROG}: could not remove the actor of {handle.proc.name}: {err}")
        ray.shutdown()


def _where_text(proc: Process) -> str:
    asks = [f"{proc.cpus:g} CPU"]
    if proc.gpus:
        asks.append(f"{proc.gpus} GPU (own placement group)")
    asks += [f"{v:g} {k}" for k, v in proc.resources.items()]
    spread = ", spread over nodes" if proc.role == "env" else ""
    return f"a Ray node with {', '.join(asks)}{spread}"
