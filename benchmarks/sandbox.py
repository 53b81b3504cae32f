"""What a sandbox costs to start, per provider: cold (`open_sandbox`, a probe exec included)
and handed out from a warm `SandboxPool`; cold with network "model-only" (the relay to the
rollout proxy started too); 64 at once; and N starts in a row with their
failures and leftovers (sandbox folders, uid reservations, processes of their uids; for
docker, the engine's containers and volumes labelled atropos.sandbox=1).

    python benchmarks/sandbox.py --starts 1000 --providers bubblewrap process docker

Prints a table and writes benchmarks/results/sandbox.json. Runs under a private run root.
docker uses the engine of `DOCKER_HOST` when set, else a private one of the tests
(atropos.testing.docker, root only), and `--image` (default: the tests' sandbox image, built
or loaded from the image cache as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(tempfile.mkdtemp(prefix="atropos-sbx-bench-", dir="/tmp"))
ROOT.chmod(0o711)
os.environ["ATROPOS_SANDBOX_ROOT"] = str(ROOT)

from atropos.sandbox import SandboxError, SandboxPool, SandboxSpec, _host, open_sandbox  # noqa: E402

SPECS: dict[str, SandboxSpec] = {}  # per provider; SandboxSpec() unless set (docker: an image)
ENGINE: Any = None  # the docker engine used, when docker is measured


def spec_of(provider: str) -> SandboxSpec:
    return SPECS.get(provider, SandboxSpec())


def quantiles(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
    }


async def cold(provider: str, rounds: int, model_only: bool = False) -> dict[str, float]:
    """Cold starts; `model_only`: with network="model-only" (its relay started, which dials
    the model URL only when a connection comes: nothing need listen there)."""
    spec = spec_of(provider)
    if model_only:
        spec = dataclasses.replace(spec, network="model-only", model_url=MODEL_URL)
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        box = await open_sandbox(spec, provider)
        times.append(time.perf_counter() - began)
        await box.close()
    return quantiles(times)


async def warm(provider: str, rounds: int) -> dict[str, float]:
    times = []
    async with SandboxPool(spec_of(provider), provider, size=4) as pool:
        for _ in range(rounds):
            while pool.warm.qsize() < pool.size:
                await asyncio.sleep(0.002)
            began = time.perf_counter()
            async with pool.sandbox():
                times.append(time.perf_counter() - began)
    return quantiles(times)


async def concurrent(provider: str, count: int) -> dict[str, Any]:
    uids: list[int] = []

    async def one() -> bool:
        try:
            async with await open_sandbox(spec_of(provider), provider) as box:
                uids.append(getattr(box, "uid", None) or 0)
                return (await box.exec("echo ok", timeout=60)).stdout == b"ok\n"
        except SandboxError:
            return False

    began = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(count)))
    return {
        "seconds": time.perf_counter() - began,
        "failures": results.count(False),
        "leftovers": len(leftovers(uids)),
    }


async def in_a_row(provider: str, count: int) -> dict[str, Any]:
    failures, uids, began = 0, [], time.perf_counter()
    for _ in range(count):
        try:
            box = await open_sandbox(spec_of(provider), provider)
        except SandboxError:
            failures += 1
            continue
        uids.append(getattr(box, "uid", None) or 0)
        await box.close()
    return {
        "seconds": time.perf_counter() - began,
        "failures": failures,
        "leftovers": len(leftovers(sorted(set(uids)))),
    }


def leftovers(uids: list[int]) -> list[str]:
    found = [str(p) for p in ROOT.glob("owner-*/*")] + [str(p) for p in ROOT.glob("uids/*")]
    found += [str(pid) for uid in uids if uid for pid in _host.tasks_of(uid)]
    if ENGINE is not None:
        label = ["--filter", "label=atropos.sandbox=1"]
        found += ENGINE.docker(["ps", "-aq", *label]).stdout.split()
        found += ENGINE.docker(["volume", "ls", "-q", *label]).stdout.split()
    return found


def docker_engine(image: str) -> Any:
    """The engine docker is measured on: `DOCKER_HOST`'s, else a private one (stopped at
    exit); `image` present on it (the tests' sandbox image is built or loaded from the cache)."""
    import atexit

    from atropos.images import DebianRoot, ensure_image
    from atropos.testing.docker import DockerEngine, find_program

    if os.environ.get("DOCKER_HOST"):

        class Current:  # the client against DOCKER_HOST, as DockerEngine.docker runs it
            environ = dict(os.environ)

            def docker(self, args: list[str]) -> Any:
                import subprocess

                program = find_program("docker") or "docker"
                return subprocess.run([program, *args], capture_output=True, text=True)

        engine: Any = Current()
    else:
        engine = DockerEngine(tempfile.mkdtemp(prefix="atropos-bench-docker-", dir="/tmp"))
        engine.start()
        atexit.register(engine.stop)
        os.environ["DOCKER_HOST"] = engine.host
    if image == TEST_IMAGE:
        recipe = DebianRoot(include=("python3", "python3-pytest", "bash"))
        ensure_image(image, recipe, env=engine.environ)
    return engine


TEST_IMAGE = "atropos-test-sandbox:bookworm"
MODEL_URL = "http://127.0.0.1:9/v1"  # never dialled: no exec connects during a start


async def main(args: argparse.Namespace) -> dict[str, Any]:
    global ENGINE
    results: dict[str, Any] = {}
    if "docker" in args.providers:
        ENGINE = docker_engine(args.image)
        SPECS["docker"] = SandboxSpec(image=args.image)
    for provider in args.providers:
        results[provider] = {
            "cold": await cold(provider, args.rounds),
            "cold_model_only": await cold(provider, args.rounds, model_only=True),
            "warm": await warm(provider, args.rounds),
            "concurrent_64": await concurrent(provider, 64),
            "in_a_row": await in_a_row(provider, args.starts),
        }
        print(provider, json.dumps(results[provider]), flush=True)
    return results


def table(results: dict[str, Any], starts: int) -> str:
    lines = [
        "| provider | cold p50 / p95 (ms) | cold, model-only p50 / p95 (ms) |"
        " warm pool p50 / p95 (ms) | 64 at once (s, failures,"
        f" leftovers) | {starts} in a row (s, failures, leftovers) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        c, w, k, n = r["cold"], r["warm"], r["concurrent_64"], r["in_a_row"]
        m = r["cold_model_only"]
        lines.append(
            f"| {name} | {c['p50_ms']:.1f} / {c['p95_ms']:.1f} |"
            f" {m['p50_ms']:.1f} / {m['p95_ms']:.1f} | {w['p50_ms']:.2f} /"
            f" {w['p95_ms']:.2f} | {k['seconds']:.2f}, {k['failures']}, {k['leftovers']} |"
            f" {n['seconds']:.1f}, {n['failures']}, {n['leftovers']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--providers", nargs="+", default=["bubblewrap", "process"])
    parser.add_argument("--image", default=TEST_IMAGE, help="docker: a local image")
    parser.add_argument("--rounds", type=int, default=100, help="cold and warm starts timed")
    parser.add_argument("--starts", type=int, default=1000, help="starts in a row")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    print(table(results, args.starts))
    out = Path(__file__).parent / "results" / "sandbox.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    shutil.rmtree(ROOT)  # empty by now: leftovers above counts what would be left
