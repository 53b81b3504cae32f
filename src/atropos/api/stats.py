"""What the API tells about itself: `GET /stats` (JSON), `GET /stats/history` (the same figures
sampled over time, for the dashboard) and `GET /metrics` (Prometheus text).

Counters cover this process's lifetime (they restart at zero with the API, like any Prometheus
counter); queue depths and the step come from the durable state and survive restarts.

Two sides drop groups: the API (`drops`: stale or oversize groups it received) and the
environments (`env_dropped`: groups an env never sent, by the reason it gave, as the env last
reported them in `/status-env`, with `env_failed` for its failed rollouts and `env_outcomes`
for its rollouts by outcome). An env's report is
its own count since it started; the API keeps it for the run (in memory): when the env
disconnects or restarts, its last report is added to the env's totals (`Hub.env_totals`), so a
run whose groups were all dropped still shows why after its env has gone.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, deque
from typing import Any

import msgspec

from atropos.api.hub import EnvCounters, Hub


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _env_key(env_id: int | None) -> str:
    return "unassigned" if env_id is None else str(env_id)


def _add(total: dict[str, int], counts: dict[str, int]) -> None:
    for name, n in counts.items():
        total[name] = total.get(name, 0) + n


def stats(hub: Hub) -> dict[str, Any]:
    """The `/stats` document: per-env queues and traffic, drops by reason on both sides (the
    API's and the envs' own reports), batch latency.

    Queued groups are accepted and not yet consumed: `waiting_groups` wait for a batch,
    `leased_groups` are in batches handed to the trainer and not yet acknowledged.

    Long because it is the document: a table of its fields.
    """
    live = {e.env_id for e in hub.live_envs()}
    waiting: Counter[int | None] = Counter(row.env_id for row in hub.queue.values())
    leased: Counter[int | None] = Counter(row.env_id for row in hub.leased.values())
    groups_by_env = waiting + leased
    env_ids: set[int | None] = set(hub.counters) | set(groups_by_env)
    env_ids |= {e.env_id for e in hub.envs}
    envs: dict[str, Any] = {}
    for env_id in sorted(env_ids, key=lambda e: -1 if e is None else e):
        c = hub.counters.get(env_id, EnvCounters())
        report = hub.env_totals(env_id) if env_id is not None else None
        entry: dict[str, Any] = {
            "queued_groups": groups_by_env.get(env_id, 0),
            "waiting_groups": waiting.get(env_id, 0),
            "leased_groups": leased.get(env_id, 0),
            "queued_sequences": hub.env_seqs.get(env_id, 0),
            "groups_in": c.groups_in,
            "sequences_in": c.sequences_in,
            "groups_out": c.groups_out,
            "sequences_out": c.sequences_out,
            "duplicates": c.duplicates,
            "drops": dict(c.drops),
            "loose_fields": dict(c.loose),
            "env_dropped": dict(report.dropped) if report else {},
            "env_failed": dict(report.failed) if report else {},
            "env_outcomes": dict(report.outcomes) if report else {},
            "env_reported_at": report.at if report else None,
            "servers": [
                msgspec.structs.asdict(s)
                for s in hub.env_servers.get(env_id, [])  # type: ignore[arg-type]
            ],
            **_latency(hub, env_id),
        }
        if env_id is not None and env_id < len(hub.envs):
            record = hub.envs[env_id]
            entry.update(
                name=record.real_name,
                connected=record.connected,
                live=env_id in live,
                env_key=record.env_key,
                registrations=hub.registrations.get(env_id, 0),
            )
        envs[_env_key(env_id)] = entry
    latencies = list(hub.batch_latency)
    drops: dict[str, int] = {}
    for c in hub.counters.values():
        _add(drops, c.drops)
    env_dropped: dict[str, int] = {}
    env_failed: dict[str, int] = {}
    env_outcomes: dict[str, int] = {}
    for env_id in set(hub.env_reports) | set(hub.env_banked):
        totals = hub.env_totals(env_id)
        if totals is not None:
            _add(env_dropped, totals.dropped)
            _add(env_failed, totals.failed)
            _add(env_outcomes, totals.outcomes)
    return {
        "step": hub.step,
        "registered": hub.registration is not None,
        "batch_size": hub.batch_size,
        "queued_groups": hub.queued_groups(),
        "queued_sequences": sum(hub.env_seqs.values()),
        "leased_batches": len(hub.batches),
        "waiting_groups": len(hub.queue),
        "leased_groups": len(hub.leased),
        "drops": drops,
        "env_dropped": env_dropped,
        "env_failed": env_failed,
        "env_outcomes": env_outcomes,
        "internal_errors": hub.internal_errors,
        "batch_latency_seconds": {
            "count": len(latencies),
            "p50": _quantile(latencies, 0.5),
            "p99": _quantile(latencies, 0.99),
            "mean": statistics.fmean(latencies) if latencies else None,
        },
        "envs": envs,
    }


def _latency(hub: Hub, env_id: int | None) -> dict[str, Any]:
    """An env's `latency` (seconds, by stage: count and sum since it started, p50/p95/p99 and
    max over its recent window) and `paced_seconds`, from its last report, and its `evals`
    (`--env.eval_every`: one row per policy version evaluated, oldest first)."""
    report = hub.env_latency.get(env_id) if env_id is not None else None
    evals = list(hub.env_evals.get(env_id, ())) if env_id is not None else []
    if report is None:
        return {"latency": {}, "paced_seconds": None, "evals": evals}
    stages = {name: msgspec.structs.asdict(s) for name, s in report.stages.items()}
    return {"latency": stages, "paced_seconds": report.paced_seconds, "evals": evals}


def _label(value: str) -> str:
    r"""`value` escaped for a Prometheus label (backslash, double quote, newline).

    >>> _label('a"b\\c\nd')
    'a\\"b\\\\c\\nd'
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(hub: Hub) -> str:
    """The same figures in Prometheus' text exposition format.

    Long because it is a table of metrics.
    """
    doc = stats(hub)
    lines = [
        "# HELP atropos_step Batches served so far (the trainer step).",
        "# TYPE atropos_step gauge",
        f"atropos_step {doc['step']}",
        "# HELP atropos_queued_groups Groups accepted and not yet consumed.",
        "# TYPE atropos_queued_groups gauge",
        f"atropos_queued_groups {doc['queued_groups']}",
        "# TYPE atropos_queued_sequences gauge",
        f"atropos_queued_sequences {doc['queued_sequences']}",
        "# TYPE atropos_leased_batches gauge",
        f"atropos_leased_batches {doc['leased_batches']}",
        "# HELP atropos_internal_errors_total Requests that met an unexpected exception.",
        "# TYPE atropos_internal_errors_total counter",
        f"atropos_internal_errors_total {doc['internal_errors']}",
    ]
    per_env = [
        ("queued_groups", "gauge"),
        ("waiting_groups", "gauge"),
        ("leased_groups", "gauge"),
        ("queued_sequences", "gauge"),
        ("groups_in", "counter"),
        ("sequences_in", "counter"),
        ("groups_out", "counter"),
        ("sequences_out", "counter"),
        ("duplicates", "counter"),
    ]
    for name, kind in per_env:
        metric = f"atropos_env_{name}" + ("_total" if kind == "counter" else "")
        lines.append(f"# TYPE {metric} {kind}")
        for env, entry in doc["envs"].items():
            lines.append(f'{metric}{{env="{env}"}} {entry[name]}')
    lines.append("# TYPE atropos_env_drops_total counter")
    for env, entry in doc["envs"].items():
        for reason, n in entry["drops"].items():
            lines.append(f'atropos_env_drops_total{{env="{env}",reason="{_label(reason)}"}} {n}')
    reported = [
        ("dropped", "reason", "Groups the env reports it dropped before sending, by reason."),
        ("failed", "kind", "Rollouts the env reports failed, by kind."),
    ]
    for part, label, about in reported:
        metric = f"atropos_env_reported_{part}_total"
        lines += [f"# HELP {metric} {about}", f"# TYPE {metric} counter"]
        for env, entry in doc["envs"].items():
            for name, n in entry[f"env_{part}"].items():
                lines.append(f'{metric}{{env="{env}",{label}="{_label(name)}"}} {n}')
    lines += _outcome_lines(doc)
    lines.append("# HELP atropos_env_report_timestamp_seconds When the env last reported.")
    lines.append("# TYPE atropos_env_report_timestamp_seconds gauge")
    for env, entry in doc["envs"].items():
        at = entry["env_reported_at"]
        if at is not None:
            lines.append(f'atropos_env_report_timestamp_seconds{{env="{env}"}} {at:.3f}')
    lines += _server_lines(doc)
    lines += _latency_lines(doc)
    lines += _eval_lines(doc)
    lat = doc["batch_latency_seconds"]
    lines.append("# TYPE atropos_batch_latency_seconds summary")
    for q in ("p50", "p99"):
        if lat[q] is not None:
            lines.append(f'atropos_batch_latency_seconds{{quantile="0.{q[1:]}"}} {lat[q]:.6f}')
    lines.append(f"atropos_batch_latency_seconds_count {lat['count']}")
    return "\n".join(lines) + "\n"


def _outcome_lines(doc: dict[str, Any]) -> list[str]:
    """`atropos_env_outcomes_total{env, outcome, reason}` from each env's outcome counts
    (`truncated/turns`: outcome `truncated`, reason `turns`; `scored`: reason "")."""
    metric = "atropos_env_outcomes_total"
    lines = [
        f"# HELP {metric} Rollouts the env reports by how they ended (scored, failed,"
        " truncated, invalid), with the reason.",
        f"# TYPE {metric} counter",
    ]
    for env, entry in doc["envs"].items():
        for name, n in entry["env_outcomes"].items():
            outcome, _, reason = name.partition("/")
            labels = f'env="{env}",outcome="{_label(outcome)}",reason="{_label(reason)}"'
            lines.append(f"{metric}{{{labels}}} {n}")
    return lines


SERVER_GAUGES = (
    ("in_flight", "Training requests the env has in flight on the inference server."),
    ("capacity", "The env's in-flight cap on the server now (adaptive when on)."),
    ("max", "The env's configured in-flight maximum on the server."),
    ("sessions", "Conversations of the env homed on the server."),
    ("waiting", "Requests waiting in the server's queue, as it last reported."),
    ("kv_usage", "The server's KV-cache usage (0-1), as it last reported."),
)


def _server_lines(doc: dict[str, Any]) -> list[str]:
    """`atropos_env_server_*{env, server}` gauges from each env's latest server report."""
    lines: list[str] = []
    for name, about in SERVER_GAUGES:
        metric = f"atropos_env_server_{name}"
        rows = [
            f'{metric}{{env="{env}",server="{_label(s["url"])}"}} {float(s[name]):g}'
            for env, entry in doc["envs"].items()
            for s in entry["servers"]
            if s.get(name) is not None
        ]
        if rows:
            lines += [f"# HELP {metric} {about}", f"# TYPE {metric} gauge", *rows]
    return lines


def _latency_lines(doc: dict[str, Any]) -> list[str]:
    """`atropos_env_latency_seconds{env, stage}`: a summary per env and stage (quantiles over
    the env's recent window, `_sum` and `_count` since it started), and the paced seconds."""
    lines = [
        "# HELP atropos_env_latency_seconds Env latency by stage (rollout, ttft, server,"
        " queue_wait, scoring), as the env last reported.",
        "# TYPE atropos_env_latency_seconds summary",
    ]
    for env, entry in doc["envs"].items():
        for stage, s in entry["latency"].items():
            labels = f'env="{env}",stage="{_label(stage)}"'
            for name, q in (("p50", "0.5"), ("p95", "0.95"), ("p99", "0.99")):
                if s.get(name) is not None:
                    lines.append(
                        f'atropos_env_latency_seconds{{{labels},quantile="{q}"}} {s[name]:.6g}'
                    )
            lines.append(f"atropos_env_latency_seconds_sum{{{labels}}} {s['sum']:.6f}")
            lines.append(f"atropos_env_latency_seconds_count{{{labels}}} {s['count']}")
    metric = "atropos_env_paced_seconds_total"
    lines += [
        f"# HELP {metric} Seconds the env's admission was paced (--max-staleness), as reported.",
        f"# TYPE {metric} counter",
    ]
    for env, entry in doc["envs"].items():
        if entry["paced_seconds"] is not None:
            lines.append(f'{metric}{{env="{env}"}} {entry["paced_seconds"]:.3f}')
    return lines


def _eval_lines(doc: dict[str, Any]) -> list[str]:
    """The latest evaluation per env (`--env.eval_every`): its policy version, each metric,
    and the versions skipped because an evaluation was still running."""
    latest = {env: e["evals"][-1] for env, e in doc["envs"].items() if e["evals"]}
    if not latest:
        return []
    lines = [
        "# HELP atropos_env_eval_policy_version The policy version of the env's latest evaluation.",
        "# TYPE atropos_env_eval_policy_version gauge",
        *(f'atropos_env_eval_policy_version{{env="{env}"}} {r["policy_version"]}'
          for env, r in latest.items()),
        "# HELP atropos_env_eval The env's latest evaluation, by metric.",
        "# TYPE atropos_env_eval gauge",
    ]  # fmt: skip
    for env, r in latest.items():
        for name, value in r["metrics"].items():
            lines.append(f'atropos_env_eval{{env="{env}",metric="{_label(name)}"}} {value:g}')
    lines += [
        "# HELP atropos_env_evals_skipped_total Versions not evaluated: one was still running.",
        "# TYPE atropos_env_evals_skipped_total counter",
        *(f'atropos_env_evals_skipped_total{{env="{env}"}} {r["skipped"]}'
          for env, r in latest.items()),
    ]  # fmt: skip
    return lines


class History:
    """`/stats` figures sampled every `interval` seconds, the last `size` of them (an hour at
    the defaults): what the dashboard plots. Counters are cumulative, so a reader derives
    rates from differences; the samples live in memory and restart with the API.

    >>> h = History(interval=2.0, size=2)
    >>> for step in range(3):
    ...     h.samples.append({"step": step})
    >>> [s["step"] for s in h.document()["samples"]]
    [1, 2]
    """

    def __init__(self, interval: float = 2.0, size: int = 1800) -> None:
        self.interval = interval
        self.samples: deque[dict[str, Any]] = deque(maxlen=size)

    def sample(self, hub: Hub) -> dict[str, Any]:
        """Record the hub's figures now."""
        doc = stats(hub)
        point = {
            "t": time.time(),
            "step": doc["step"],
            "queued_groups": doc["queued_groups"],
            "queued_sequences": doc["queued_sequences"],
            "leased_batches": doc["leased_batches"],
            "drops": doc["drops"],
            "env_dropped": doc["env_dropped"],
            "envs": {
                key: {
                    "name": entry.get("name"),
                    "queued_groups": entry["queued_groups"],
                    "groups_in": entry["groups_in"],
                    "sequences_in": entry["sequences_in"],
                    "groups_out": entry["groups_out"],
                    "drops": sum(entry["drops"].values()),
                    "env_dropped": sum(entry["env_dropped"].values()),
                }
                for key, entry in doc["envs"].items()
            },
        }
        self.samples.append(point)
        return point

    def document(self) -> dict[str, Any]:
        """The `/stats/history` answer: `{"interval", "samples": [oldest, ..., newest]}`."""
        return {"interval": self.interval, "samples": list(self.samples)}
