"""What `atropos launch` costs: time to the first batch, and trainer steps/s against the same
four processes started the way `make demo` starts them.

    python benchmarks/launch_overhead.py --rounds 3 --steps 40             # local backend
    python benchmarks/launch_overhead.py --rounds 3 --steps 40 --ray       # a 2-node Ray cluster

Each round runs, one after the other on the same machine:

- `launch`: `atropos launch examples/launch/local.yaml` (with `--ray`: backend ray on a
  two-node loopback cluster started here, env replicas on the second node);
- `direct`: the same command lines, taken from launch's own resolved plan, started as the demo
  starts its processes (`atropos.demo.procs.Service`: API and server, wait for `/health`, then
  trainer and env), with no supervisor.

Measured: seconds from the start to the API's first served batch (`/stats` step >= 1, polled
every 50 ms), and trainer steps/s over the steps after the first five (the trainer's own
`metrics.jsonl` timestamps). Prints a table and writes benchmarks/results/launch_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from atropos.demo.procs import Service, wait_until_up  # noqa: E402
from atropos.launch import config, local  # noqa: E402
from atropos.launch.plan import build, fill  # noqa: E402

EXAMPLE = ROOT / "examples" / "launch" / "local.yaml"
WARMUP_STEPS = 5


def first_batch_after(
    api_url: Callable[[], str | None],
    t0: float,
    alive: Callable[[], bool],
    key_file: Path | None = None,
) -> float:
    """Seconds from `t0` until the API has served a batch."""
    client = httpx.Client(timeout=1.0)
    while alive():
        url = api_url()
        if url:
            key = key_file.read_text().strip() if key_file and key_file.exists() else None
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                if client.get(f"{url}/stats", headers=headers).json().get("step", 0) >= 1:
                    return time.monotonic() - t0
            except (httpx.HTTPError, ValueError):
                pass
        time.sleep(0.05)
    raise RuntimeError("the run ended before its first batch")


def steps_per_second(metrics: Path) -> float:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    timed = [r["time"] for r in rows[WARMUP_STEPS - 1 :]]
    return (len(timed) - 1) / (timed[-1] - timed[0])


def run_launch(
    run_dir: Path, steps: int, extra: list[str], env: dict[str, str] | None
) -> dict[str, float]:
    argv = [
        sys.executable, "-m", "atropos", "launch", str(EXAMPLE), "--no-live",
        "--set", f"run.directory={run_dir}", "--set", f"trainer.args.steps={steps}", *extra,
    ]  # fmt: skip
    log = (run_dir.parent / f"{run_dir.name}.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )

    def api_url() -> str | None:
        try:
            record = json.loads((run_dir / "launch.json").read_text())
        except (OSError, ValueError):
            return None
        api = next(p for p in record["processes"] if p["name"] == "api")
        return f"http://{api['address']}" if api.get("address") else None

    first = first_batch_after(api_url, t0, lambda: proc.poll() is None, run_dir / "api.key")
    if proc.wait(900) != 0:
        raise RuntimeError(f"launch failed: see {log.name}")
    total = time.monotonic() - t0
    return {
        "first_batch_s": first,
        "steps_per_s": steps_per_second(run_dir / "trainer" / "metrics.jsonl"),
        "wall_s": total,
    }


def run_direct(run_dir: Path, steps: int) -> dict[str, float]:
    run = config.load(EXAMPLE, [f"run.directory={run_dir}", f"trainer.args.steps={steps}"])
    plan = local.place(build(run))
    book = local.book_of(plan)
    services: dict[str, Service] = {}
    for proc in plan.processes:
        argv = [fill(a, proc, book, python=sys.executable, run_dir=plan.run_dir) for a in proc.argv]
        for rel, content in proc.files.items():
            path = plan.run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(fill(content, proc, book, python=sys.executable, run_dir=plan.run_dir))
        services[proc.name] = Service(proc.name, argv, plan.run_dir / "logs" / f"{proc.name}.log")
    environ = {
        name: {k: fill(v, plan.get(name), book, python="", run_dir=plan.run_dir)
               for k, v in plan.get(name).environ.items()}
        for name in services
    }  # fmt: skip
    api = f"http://127.0.0.1:{book['api'][1]}"
    t0 = time.monotonic()
    started = []
    try:
        for name in ("api", "policy"):
            started.append(services[name].start(environ[name]))
        wait_until_up(f"{api}/health", 120, services["api"])
        wait_until_up(f"http://127.0.0.1:{book['policy'][1]}/health", 120, services["policy"])
        for name in ("trainer", "arithmetic"):
            started.append(services[name].start(environ[name]))
        first = first_batch_after(lambda: api, t0, services["trainer"].alive)
        if services["trainer"].wait(900) != 0:
            raise RuntimeError(f"trainer failed: see {services['trainer'].log_path}")
        total = time.monotonic() - t0
    finally:
        for svc in reversed(started):
            svc.stop()
    return {
        "first_batch_s": first,
        "steps_per_s": steps_per_second(plan.run_dir / "trainer" / "metrics.jsonl"),
        "wall_s": total,
    }


def summarize(rows: list[dict[str, float]]) -> dict[str, Any]:
    keys = rows[0].keys()
    return {
        k: {"median": statistics.median(r[k] for r in rows), "all": [r[k] for r in rows]}
        for k in keys
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ray", action="store_true", help="launch on a two-node loopback Ray cluster")
    p.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "launch_overhead.json"
    )
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {"launch": [], "direct": []}
    label = "launch (ray, 2 nodes)" if args.ray else "launch (local)"
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        cluster_env: dict[str, str] | None = None
        extra: list[str] = []
        cluster = None
        if args.ray:
            from atropos.testing.ray_cluster import RayCluster

            cluster = RayCluster(Path(tmp) / "ray", worker_resources={"env_node": 4})
            cluster.__enter__()
            cluster_env = cluster.environ
            extra = ["--set", "run.backend=ray", "--set", "envs.0.resources={env_node: 1}"]
            for key in ("api", "inference.0", "trainer", "envs.0"):  # 2 CPUs a node
                extra += ["--set", f"{key}.cpus=0.5"]
        try:
            for i in range(args.rounds):
                for mode in ("launch", "direct"):
                    run_dir = Path(tmp) / f"{mode}-{i}"
                    if mode == "launch":
                        row = run_launch(run_dir, args.steps, extra, cluster_env)
                    else:
                        row = run_direct(run_dir, args.steps)
                    results[mode].append(row)
                    print(
                        f"round {i + 1} {mode:6}: first batch {row['first_batch_s']:.2f} s,"
                        f" {row['steps_per_s']:.2f} steps/s, wall {row['wall_s']:.1f} s",
                        flush=True,
                    )
        finally:
            if cluster is not None:
                cluster.__exit__(None, None, None)
    summary = {mode: summarize(rows) for mode, rows in results.items()}
    ratio = summary["launch"]["steps_per_s"]["median"] / summary["direct"]["steps_per_s"]["median"]
    print("\n| start | first batch (s, median) | steps/s (median) | wall (s) |")
    print("|---|---|---|---|")
    for mode, name in (("launch", label), ("direct", "demo-style (direct)")):
        s = summary[mode]
        print(
            f"| {name} | {s['first_batch_s']['median']:.2f} | {s['steps_per_s']['median']:.2f}"
            f" | {s['wall_s']['median']:.1f} |"
        )
    print(f"\nlaunch/direct steps/s: {ratio:.3f} ({(1 - ratio) * 100:+.1f}% cost)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_name(args.out.stem + ("-ray" if args.ray else "") + ".json").write_text(
        json.dumps({"rounds": args.rounds, "steps": args.steps, "ray": args.ray,
                    "summary": summary, "ratio": ratio}, indent=2)
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
