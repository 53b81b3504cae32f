"""The trajectory API's state machine: registration, env registry, queue, batches, leases.

Routes in `app.py` decode requests and call one method here; each method validates, writes
through the store (one transaction) and only then changes memory, so a failure leaves no
half-written state. Everything runs on the event loop thread, so methods are atomic.

Semantics that differ from atroposlib 0.4.0 on purpose (old clients cannot tell):
* the step counts batches *served*; batches are formed on demand and served oldest first
  (upstream counted batches formed and served its cache newest first);
* "queued" means accepted and not yet consumed: in the queue or in a leased, unacknowledged
  batch. `/status` and `/status-env` count all of it (upstream skipped cached batches);
* groups of any size go straight to the queue: the packer handles any mix of sizes, so
  upstream's per-env buffer (which kept oversize groups forever) is not needed;
* weights and minimum allocations count live envs only (heartbeat within `env_timeout`).
"""

from __future__ import annotations

import heapq
import math
import secrets
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from atropos import wire
from atropos.api.packer import Item, allocate_minimums, pick_batch
from atropos.api.store import BatchRow, GroupRow, NewGroup, Store
from atropos.wire import Group, ProtocolError, RegisterEnv, Registration, ServerGauge


class NotFound(ProtocolError):
    """An id that names nothing (unknown env_id or batch_id)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=404)


@dataclass
class EnvRecord:
    """A registered environment (persisted)."""

    env_id: int
    desired_name: str
    real_name: str
    max_token_length: int
    weight: float
    group_size: int
    min_batch_allocation: float | None
    env_key: str | None = None
    connected: bool = True


@dataclass
class EnvCounters:
    """Per-env traffic counters since this process started."""

    groups_in: int = 0
    sequences_in: int = 0
    groups_out: int = 0
    sequences_out: int = 0
    duplicates: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    loose: Counter[str] = field(default_factory=Counter)


@dataclass
class EnvReport:
    """What an env last reported about itself in `/status-env` (in memory only):
    groups it dropped before sending, by reason, rollouts that failed, by kind, and rollouts
    by outcome (`scored`, `truncated/turns`, ...), each counted since that env started; `at`
    is when the report arrived (unix seconds)."""

    dropped: dict[str, int]
    failed: dict[str, int]
    at: float
    outcomes: dict[str, int] = field(default_factory=dict)


@dataclass
class EnvLatency:
    """An env's latest latency report: its stages (`wire.LatencySummary` by stage name) and
    the seconds its admission was paced, since it started (None: not sent)."""

    stages: dict[str, wire.LatencySummary]
    paced_seconds: float | None


@dataclass
class Served:
    """A batch ready to send."""

    bodies: list[bytes]
    step: int
    batch_id: str | None = None
    lease_expires: float | None = None


@dataclass
class HubConfig:
    """Knobs of the hub (set from `atropos api serve` flags)."""

    env_timeout: float = 120.0  # seconds of silence after which an env stops counting
    max_staleness: int | None = None  # drop groups older than this many steps at batch time
    recent_groups: int = 4096  # accepted groups kept for read-only readers (`/rollouts`)
    recent_bytes: int = 64 * 2**20  # ... and at most this many bytes of them


@dataclass(frozen=True)
class Recent:
    """One accepted group as read-only readers see it: arrival number, env, time, body."""

    seq: int
    env_id: int | None
    received: float
    body: bytes


class Hub:
    """In-memory indexes over a durable store."""

    def __init__(
        self, store: Store, config: HubConfig | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.config = config or HubConfig()
        self.clock = clock
        self.latest: bytes | None = None
        self.batch_latency: deque[float] = deque(maxlen=2048)
        self.counters: dict[int | None, EnvCounters] = {}
        self.env_reports: dict[int, EnvReport] = {}  # the latest `/status-env` report per env
        self.env_servers: dict[int, list[ServerGauge]] = {}  # its inference servers, latest
        self.env_latency: dict[int, EnvLatency] = {}  # its latency stages, latest
        self.env_evals: dict[int, deque[dict[str, Any]]] = {}  # its evaluations, newest last
        # what earlier processes (or connections) of each env reported, kept for the run
        self.env_banked: dict[int, EnvReport] = {}
        # registrations of each env since this process started (a launcher's readiness gate
        # for a restarted env: the count grows when the new process has registered)
        self.registrations: Counter[int] = Counter()
        self._recent_acks: deque[str] = deque(maxlen=1024)
        self.internal_errors = 0  # requests that met an exception no check foresaw (app.py)
        self.recent: deque[Recent] = deque()  # newest last; whether consumed or not
        self.recent_bytes = 0
        self._load()
        self._seed_recent()

    # ----- state -------------------------------------------------------------------------

    def _load(self) -> None:
        snap = self.store.load()
        self.registration: dict[str, Any] | None = snap.meta.get("registration")
        self.step: int = snap.meta.get("step", 0)
        # the version the servers serve, as the trainer last said (None: it never said)
        self.published: int | None = snap.meta.get("published")
        self.started: bool = snap.meta.get("started", False)
        self.envs: list[EnvRecord] = [EnvRecord(**snap.envs[i]) for i in sorted(snap.envs)]
        now = self.clock()
        self.last_seen: dict[int, float] = {e.env_id: now for e in self.envs}  # restart = grace
        self.queue: dict[int, GroupRow] = {}  # unleased groups, in age order
        self.leased: dict[int, GroupRow] = {}
        self._versions: list[tuple[int, int]] = []  # (policy_version, seq): `_drop_stale`
        for row in snap.groups:
            (self.leased if row.batch_id else self.queue)[row.seq] = row
            if not row.batch_id:
                self._track_version(row)
        self.batches: dict[str, BatchRow] = {b.batch_id: b for b in snap.batches}
        self.sizes: Counter[int] = Counter()
        self.env_seqs: Counter[int | None] = Counter()
        self.env_leased: Counter[int | None] = Counter()  # of env_seqs, in leased batches
        self.env_sizes: dict[int | None, Counter[int]] = {}
        for row in snap.groups:
            self._count_in(row)
            if row.batch_id:
                self.env_leased[row.env_id] += row.size

    def _count_in(self, row: GroupRow) -> None:
        self.sizes[row.size] += 1
        self.env_seqs[row.env_id] += row.size
        self.env_sizes.setdefault(row.env_id, Counter())[row.size] += 1

    def _count_out(self, row: GroupRow) -> None:
        for counter in (self.sizes, self.env_sizes[row.env_id]):
            counter[row.size] -= 1
            if counter[row.size] <= 0:
                del counter[row.size]
        self.env_seqs[row.env_id] -= row.size

    def _counters(self, env_id: int | None) -> EnvCounters:
        if env_id not in self.counters:
            self.counters[env_id] = EnvCounters()
        return self.counters[env_id]

    @property
    def batch_size(self) -> int:
        return int(self.registration["batch_size"]) if self.registration else -1

    def queued_groups(self) -> int:
        return len(self.queue) + len(self.leased)

    # ----- trainer ---------------------------------------------------------------------------

    def register(self, reg: Registration) -> dict[str, Any]:
        """`POST /register`. A second call updates the run parameters and re-offers leases."""
        params = {f: getattr(reg, f) for f in Registration.__struct_fields__}
        meta: dict[str, Any] = {"registration": params}
        if self.registration is None:
            step = reg.starting_step
            meta.update(step=step, started=False)
        else:
            # A restarted trainer: keep the queue and the registry; the step never goes back,
            # because envs schedule evals and stamp policy versions with it.
            step = max(self.step, reg.starting_step)
            meta["step"] = step
        self.store.set_meta(meta)
        for batch in self.batches.values():  # a (re)starting trainer gets these back first
            batch.expires = 0.0
            self.store.relet(batch.batch_id, 0.0)
        if self.registration is None:
            self.started = False
        self.registration = params
        self.step = step
        self._drop_oversize()
        return {"uuid": secrets.randbits(53)}  # an int, as upstream; small enough for JS

    def _drop_oversize(self) -> None:
        limit = self.batch_size
        too_big = [r for r in self.queue.values() if r.size > limit]
        if too_big:
            self._drop(too_big, "oversize")

    def _drop(self, rows: list[GroupRow], reason: str) -> None:
        self.store.drop([r.seq for r in rows])
        for r in rows:
            del self.queue[r.seq]
            self._count_out(r)
            self._counters(r.env_id).drops[reason] += 1

    def next_batch(self, lease: float | None) -> Served | None:
        """`GET /batch`: re-serve an expired lease, else form the next batch, else None."""
        t0 = time.perf_counter()
        now = self.clock()
        if not self.started:
            self.started = True
            self.store.set_meta({"started": True})
        served = self._reserve(now, lease) or self._form(now, lease)
        if served is not None:
            self.batch_latency.append(time.perf_counter() - t0)
        return served

    def _reserve(self, now: float, lease: float | None) -> Served | None:
        for batch in sorted(self.batches.values(), key=lambda b: b.seqs[0]):
            if batch.expires > now:
                continue
            if lease is None:  # an old client took it: that counts as acknowledgement
                bodies = self.store.bodies(batch.seqs)
                self.ack(batch.batch_id)
                return Served(bodies, batch.step)
            batch.expires = now + lease
            self.store.relet(batch.batch_id, batch.expires)
            return Served(self.store.bodies(batch.seqs), batch.step, batch.batch_id, batch.expires)
        return None

    def _form(self, now: float, lease: float | None) -> Served | None:
        if self.registration is None:
            return None
        self._drop_stale()
        live = self.live_envs(now)
        allocations = {e.env_id: _share(e) for e in live if _share(e) > 0}
        minimums = allocate_minimums(self.batch_size, allocations)
        chosen = None if minimums else self._first_fit()
        if chosen is None:
            rows = list(self.queue.values())
            picked = pick_batch([Item(r.size, r.env_id) for r in rows], self.batch_size, minimums)
            if picked is None:
                return None
            chosen = [rows[i] for i in picked]
        seqs = [r.seq for r in chosen]
        step = self.step + 1
        if lease is None:
            bodies = self.store.take(seqs, {"step": step})
            served = Served(bodies, step)
            for r in chosen:
                self._count_out(r)
        else:
            batch = BatchRow(uuid.uuid4().hex, step, now + lease, seqs)
            bodies = self.store.lease(batch, {"step": step})
            self.batches[batch.batch_id] = batch
            for r in chosen:
                r.batch_id = batch.batch_id
                self.leased[r.seq] = r
                self.env_leased[r.env_id] += r.size
            served = Served(bodies, step, batch.batch_id, batch.expires)
        for r in chosen:
            del self.queue[r.seq]
            c = self._counters(r.env_id)
            c.groups_out += 1
            c.sequences_out += r.size
        self.step = step
        return served

    def _first_fit(self) -> list[GroupRow] | None:
        """The packer's greedy pass, run lazily over the queue (the common, uniform case)."""
        room = self.batch_size
        chosen: list[GroupRow] = []
        for row in self.queue.values():
            if row.size <= room:
                chosen.append(row)
                room -= row.size
                if room == 0:
                    return chosen
        return None

    def _drop_stale(self) -> None:
        """Drop queued groups older than `max_staleness` steps: O(stale) per batch, not
        O(queue), by popping `_versions` (a heap of every queued group's policy version, whose
        entries for groups already gone are skipped as they surface)."""
        limit = self.config.max_staleness
        if limit is None:
            return
        oldest_ok = self.step - limit
        heap = self._versions
        stale = []
        while heap and heap[0][0] < oldest_ok:
            row = self.queue.get(heapq.heappop(heap)[1])
            if row is not None:
                stale.append(row)
        if stale:
            stale.sort(key=lambda r: r.seq)  # queue order
            self._drop(stale, "stale")

    def _track_version(self, row: GroupRow) -> None:
        """Note a queued group's policy version for `_drop_stale` (kept only when it is used)."""
        if self.config.max_staleness is not None and row.policy_version is not None:
            heapq.heappush(self._versions, (row.policy_version, row.seq))

    def ack(self, batch_id: str) -> dict[str, Any]:
        """`POST /batch/ack`: the leased batch is consumed; its groups are deleted."""
        batch = self.batches.get(batch_id)
        if batch is None:
            if batch_id in self._recent_acks:
                return {"status": "already acknowledged"}
            raise NotFound(f"batch_id {batch_id!r} names no leased batch")
        self.store.ack(batch_id)
        del self.batches[batch_id]
        self._recent_acks.append(batch_id)
        for seq in batch.seqs:
            row = self.leased.pop(seq)
            self._count_out(row)
            self.env_leased[row.env_id] -= row.size
        return {"status": "acknowledged"}

    # ----- environments ----------------------------------------------------------------------

    def env(self, env_id: int) -> EnvRecord:
        """The env with this id, or NotFound naming the rule."""
        if env_id < 0 or env_id >= len(self.envs):
            raise NotFound(
                f"env_id {env_id} is not registered (known ids: 0..{len(self.envs) - 1})"
                if self.envs
                else f"env_id {env_id} is not registered (no env has registered yet)"
            )
        return self.envs[env_id]

    def heartbeat(self, env_id: int | None) -> None:
        if env_id is not None and 0 <= env_id < len(self.envs):
            self.last_seen[env_id] = self.clock()

    def live_envs(self, now: float | None = None) -> list[EnvRecord]:
        now = self.clock() if now is None else now
        horizon = now - self.config.env_timeout
        return [e for e in self.envs if e.connected and self.last_seen[e.env_id] >= horizon]

    def register_env(self, req: RegisterEnv) -> dict[str, Any]:
        """`POST /register-env`: gated until the trainer's first `/batch`, as upstream."""
        if self.registration is None or not self.started:
            return {"status": "wait for trainer to start"}
        record = None
        if req.env_key is not None:
            record = next(
                (
                    e
                    for e in self.envs
                    if e.env_key == req.env_key and e.desired_name == req.desired_name
                ),
                None,
            )
        if record is None:
            k = sum(1 for e in self.envs if e.desired_name == req.desired_name)
            record = EnvRecord(
                len(self.envs), req.desired_name, f"{req.desired_name}_{k}", 0, 0.0, 1, None
            )
        record.max_token_length = req.max_token_length
        record.weight = req.weight
        record.group_size = req.group_size
        record.min_batch_allocation = req.min_batch_allocation
        record.env_key = req.env_key
        record.connected = True
        self.store.put_env(record.env_id, asdict(record), {})
        if record.env_id == len(self.envs):
            self.envs.append(record)
        self._bank(record.env_id)  # a (re)started env counts from zero; the run keeps its past
        self.registrations[record.env_id] += 1
        self.last_seen[record.env_id] = self.clock()
        reg = self.registration
        return self._versioned(
            {
                "status": "success",
                "env_id": record.env_id,
                "wandb_name": record.real_name,
                "checkpoint_dir": reg["checkpoint_dir"],
                "starting_step": self.step,
                "checkpoint_interval": reg["save_checkpoint_interval"],
                "num_steps": reg["num_steps"],
            }
        )

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        record = self.env(env_id)
        record.connected = False
        self.store.put_env(env_id, asdict(record), {})
        self._bank(env_id)
        return {"status": "success"}

    def _bank(self, env_id: int) -> None:
        """Move an env's live report into its run totals (a disconnect, or a new process)."""
        last = self.env_reports.pop(env_id, None)
        if last is None:
            return
        banked = self.env_banked.get(env_id) or EnvReport({}, {}, last.at)
        self.env_banked[env_id] = EnvReport(
            dict(Counter(banked.dropped) + Counter(last.dropped)),
            dict(Counter(banked.failed) + Counter(last.failed)),
            last.at,
            dict(Counter(banked.outcomes) + Counter(last.outcomes)),
        )

    def env_totals(self, env_id: int) -> EnvReport | None:
        """An env's drops and failures for the whole run: what its earlier processes reported
        (kept when they disconnected) plus its live report; None when it never reported."""
        live, banked = self.env_reports.get(env_id), self.env_banked.get(env_id)
        if live is None or banked is None:
            return live or banked
        return EnvReport(
            dict(Counter(banked.dropped) + Counter(live.dropped)),
            dict(Counter(banked.failed) + Counter(live.failed)),
            live.at,
            dict(Counter(banked.outcomes) + Counter(live.outcomes)),
        )

    def report(
        self,
        env_id: int,
        dropped: dict[str, int] | None,
        failed: dict[str, int] | None,
        outcomes: dict[str, int] | None = None,
    ) -> None:
        """Keep an env's latest report of its own drops and failures (cumulative counts since
        it started, so each replaces the last). A part left out keeps its last value; a
        report with neither part (every old client) changes nothing. A count lower than the
        last report's means a new process of the env: the last report goes to its totals."""
        self.env(env_id)
        if dropped is None and failed is None and outcomes is None:
            return
        last = self.env_reports.get(env_id)
        if last is not None and _restarted(last, dropped, failed, outcomes):
            self._bank(env_id)  # a new process of the env counts from zero again
            last = None
        self.env_reports[env_id] = EnvReport(
            dict(dropped) if dropped is not None else (last.dropped if last else {}),
            dict(failed) if failed is not None else (last.failed if last else {}),
            self.clock(),
            dict(outcomes) if outcomes is not None else (last.outcomes if last else {}),
        )

    def report_servers(self, env_id: int, servers: list[ServerGauge]) -> None:
        """Keep an env's latest view of its inference servers (`wire.ServerGauge`)."""
        self.env_servers[env_id] = list(servers)

    def report_latency(self, env_id: int, report: EnvLatency) -> None:
        """Keep an env's latest latency summaries and paced seconds (`wire.LatencySummary`)."""
        self.env_latency[env_id] = report

    def report_eval(self, result: wire.EvalResult) -> dict[str, Any]:
        """`POST /eval_results`: keep an env's evaluation of one policy version (the last 100
        per env, in memory)."""
        self.env(result.env_id)
        kept = self.env_evals.setdefault(result.env_id, deque(maxlen=100))
        kept.append(
            {
                "policy_version": result.policy_version,
                "metrics": dict(result.metrics),
                "seconds": result.seconds,
                "skipped": result.skipped,
                "at": self.clock(),
            }
        )
        return {"status": "received"}

    # ----- data ------------------------------------------------------------------------------

    def ingest(
        self, groups: list[Group], bodies: Sequence[bytes | None] | None = None
    ) -> list[str]:
        """Validate and store groups, all or none; return "received" or "duplicate" per group.

        `bodies[i]`, when given and not None, is group i already in its stored form (`ingest.py`
        decides when the bytes that came in are); otherwise it is encoded here."""
        limit = self.batch_size
        now = self.clock()
        new: list[NewGroup] = []
        findings: list[list[str]] = []
        for i, g in enumerate(groups):
            where = f"$[{i}]" if len(groups) > 1 else "$"
            findings.append(wire.check_group(g, where))
            if g.env_id is not None:
                self.env(g.env_id)
            n = len(g.tokens)
            if limit > 0 and n > limit:
                raise ProtocolError(
                    f"{where}.tokens: a group of {n} sequences is larger than the trainer's"
                    f" batch_size {limit}; it could never be batched",
                    status=413,
                )
            new.append(NewGroup(g.env_id, n, g.policy_version, now, g.group_id, b""))
        for g, ng, raw in zip(groups, new, bodies or [None] * len(groups), strict=True):
            ng.body = wire.encode_group(g) if raw is None else raw
        seqs = self.store.add_groups(new)
        out: list[str] = []
        for ng, seq, found in zip(new, seqs, findings, strict=True):
            c = self._counters(ng.env_id)
            self.heartbeat(ng.env_id)
            if seq is None:
                c.duplicates += 1
                out.append("duplicate")
                continue
            row = GroupRow(seq, ng.env_id, ng.size, ng.policy_version, ng.received)
            self.queue[seq] = row
            self._track_version(row)
            self._count_in(row)
            c.groups_in += 1
            c.sequences_in += ng.size
            c.loose.update(found)
            self.latest = ng.body
            self._remember(Recent(seq, ng.env_id, ng.received, ng.body))
            out.append("received")
        return out

    # ----- read-only readers (exporters, the dashboard) ---------------------------------------

    def _remember(self, item: Recent) -> None:
        self.recent.append(item)
        self.recent_bytes += len(item.body)
        cfg = self.config
        while self.recent and (
            len(self.recent) > cfg.recent_groups or self.recent_bytes > cfg.recent_bytes
        ):
            self.recent_bytes -= len(self.recent.popleft().body)

    def _seed_recent(self) -> None:
        """After a restart, the groups still stored (queued or leased) are the recent ones."""
        rows = sorted([*self.queue.values(), *self.leased.values()], key=lambda r: r.seq)
        rows = rows[-self.config.recent_groups :]
        if not rows:
            return
        for row, raw in zip(rows, self.store.bodies([r.seq for r in rows]), strict=True):
            self._remember(Recent(row.seq, row.env_id, row.received, raw))

    def rollouts(self, after: int, limit: int) -> tuple[list[Recent], int]:
        """Up to `limit` remembered groups that arrived after `after` (oldest first), and how
        many that arrived after `after` are no longer remembered (a reader that fell behind).
        Reading changes nothing: no group is consumed, leased or reset."""
        held = self.recent
        if not held:
            return [], 0
        oldest = held[0].seq
        # seqs grow by one per accepted group, except across a restart of the numbering
        missed = max(0, oldest - after - 1) if after >= 0 else 0
        start = 0 if after < oldest else len(held)
        if oldest <= after < held[-1].seq:
            lo, hi = 0, len(held)
            while lo < hi:  # the first held seq > after
                mid = (lo + hi) // 2
                if held[mid].seq <= after:
                    lo = mid + 1
                else:
                    hi = mid
            start = lo
        out = [held[i] for i in range(start, min(len(held), start + limit))]
        return out, missed

    # ----- status ----------------------------------------------------------------------------

    def publish(self, version: int) -> dict[str, Any]:
        """`POST /policy_version`: the servers now serve the weights of step `version`.

        The step (`current_step`) counts batches handed out; a batch is handed out before the
        weights trained on it are published, so a rollout started in between is generated by
        the older weights. Environments stamp groups with this version instead, when the
        trainer reports it. A resumed trainer may report a lower version than before (it went
        back to a checkpoint): what the servers serve is the truth, so it is taken as said."""
        self.published = version
        self.store.set_meta({"published": version})
        return {"status": "ok", "policy_version": version}

    def _versioned(self, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer` with `policy_version` once a trainer has said one (upstream's shape until
        then, so an atroposlib trainer's run looks as it did)."""
        if self.published is not None:
            answer["policy_version"] = self.published
        return answer

    def status(self) -> dict[str, Any]:
        return self._versioned({"current_step": self.step, "queue_size": self.queued_groups()})

    def status_env(self, env_id: int) -> dict[str, Any]:
        """`/status-env`: upstream's arithmetic over live envs, with no side effect.

        The queue here is what waits to be batched: groups already handed to the trainer in a
        leased batch are not backlog for off-policy pacing, even before they are acknowledged
        (a trainer that acknowledges at checkpoints would otherwise stall its environments).
        """
        me = self.env(env_id)
        self.heartbeat(env_id)
        live = {e.env_id: e for e in self.live_envs()}
        live[env_id] = me
        denom = sum(e.max_token_length * max(0.0, e.weight) for e in live.values())
        share = me.max_token_length * me.weight / denom if denom > 0 else 0.0
        allocated = sum(_share(e) for e in live.values())
        big = max(self.sizes, default=1)
        own_group = max(me.group_size, max(self.env_sizes.get(env_id, ()), default=0))
        waiting = self.env_seqs - self.env_leased  # Counter subtraction keeps positives
        own = waiting[env_id]
        batch = max(self.batch_size, 0)
        available = 0
        for other, seqs in waiting.items():
            if other == env_id or seqs <= 0:
                continue
            packed = math.ceil(seqs / big) * big
            rec = live.get(other) if other is not None else None
            reserved = int(batch * _share(rec)) if rec else 0
            available += max(0, packed - reserved)
        answer = {
            "current_step": self.step,
            "queue_size": (own + available) // own_group,
            "unallocated_fraction": 1.0 - min(1.0, allocated),
            "self_queue_size": own // own_group,
            "max_group_size": big,
            "env_weight": max(0.01, share),
        }
        answer.update(self._pacing(env_id, waiting))
        return self._versioned(answer)

    def _pacing(self, env_id: int, waiting: Counter[int | None]) -> dict[str, Any]:
        """What an env needs to pace itself under `--max-staleness` (nothing without it, so an
        old client's answer is as it was): the limit, the batch size, the sequences waiting to
        be batched (every env's; leased batches are already counted in the step), and the
        groups of this env the API dropped, by reason (`api_dropped`, when any)."""
        limit = self.config.max_staleness
        if limit is None:
            return {}
        extra: dict[str, Any] = {
            "max_staleness": limit,
            "batch_size": self.batch_size,
            "waiting_sequences": sum(n for n in waiting.values() if n > 0),
        }
        counters = self.counters.get(env_id)
        if counters is not None and counters.drops:
            extra["api_dropped"] = dict(counters.drops)
        return extra

    def info(self) -> dict[str, Any]:
        reg = self.registration
        return {
            "batch_size": reg["batch_size"] if reg else -1,
            "max_token_len": reg["max_token_len"] if reg else -1,
        }

    def wandb_info(self) -> dict[str, Any]:
        reg = self.registration
        return {
            "group": reg["wandb_group"] if reg else None,
            "project": reg["wandb_project"] if reg else None,
        }

    def reset(self) -> None:
        """Forget everything: registration, envs, queue, leases, step (upstream's `/reset_data`)."""
        self.store.reset()
        self.latest = None
        self.counters.clear()
        self.env_reports.clear()
        self.env_banked.clear()
        self.env_servers.clear()
        self.env_latency.clear()
        self.env_evals.clear()
        self.recent.clear()
        self.recent_bytes = 0
        self._load()


def _restarted(
    last: EnvReport,
    dropped: dict[str, int] | None,
    failed: dict[str, int] | None,
    outcomes: dict[str, int] | None = None,
) -> bool:
    """Whether a report counts less than the last one of any kind (its process restarted).

    >>> _restarted(EnvReport({"identical_scores": 5}, {}, 0.0), {"identical_scores": 2}, None)
    True
    >>> _restarted(EnvReport({"identical_scores": 5}, {}, 0.0), {"identical_scores": 7}, {})
    False
    """
    for new, old in ((dropped, last.dropped), (failed, last.failed), (outcomes, last.outcomes)):
        if new is not None and any(new.get(k, 0) < n for k, n in old.items()):
            return True
    return False


def _share(env: EnvRecord) -> float:
    """An env's minimum batch share, clamped to [0, 1] (upstream did not validate it)."""
    return min(1.0, max(0.0, env.min_batch_allocation or 0.0))
