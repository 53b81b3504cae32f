#!/usr/bin/env python3
"""The trainer client's overhead per batch: `TrainerClient.next_batch()` (+ `tensors()`) against a
bare `GET /batch` and a JSON decode.

A real API (`atropos api serve --store memory`, a subprocess on 127.0.0.1) is filled with
`--groups` groups of `--group-size` sequences of `--seq-len` tokens (a ~128-token prompt masked
with -100, the rest trained, with `inference_logprobs`, as environments send them), then one
batch of all of them is fetched by one of these ways:

* `httpx + json`: `httpx.Client.get("/batch")`, then `json.loads` of the body (the least a
  trainer written against the API does; what axolotl and Tinker do, with `requests`);
* `httpx + msgspec`: the same with `msgspec.json.decode` (untyped);
* `client.next_batch`: `TrainerClient.next_batch()`: the answer decoded into `wire.Group`s;
* `+ tensors("padded")`, `+ tensors("packed")`: then `batch.tensors(layout)`: advantages worked
  out, targets shifted, torch tensors made.

Each way gets a freshly filled batch (the fill is not timed) in every round; the order of the
ways rotates from round to round. Per batch we take the wall time and this process's CPU time
(`time.process_time`, all its threads: the client side only, the server runs elsewhere). The
table gives the median and the min-max over `--rounds` rounds, after one untimed warm-up
round (imports, torch's first calls).

Usage:
    .venv/bin/python benchmarks/client_overhead.py --json benchmarks/results/client_overhead.json
    .venv/bin/python benchmarks/client_overhead.py --groups 2 --group-size 4 --seq-len 64 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec

from atropos.client import TrainerClient

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers beside us
from procstat import code_version, free_port, machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 32_000
WAYS = (
    "httpx + json",
    "httpx + msgspec",
    "client.next_batch",
    "+ tensors(padded)",
    "+ tensors(packed)",
)


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def make_group(index: int, size: int, seq_len: int, prompt_len: int = 128) -> dict[str, Any]:
    """One group as an environment posts it: a shared prompt, `size` completions, logprobs."""
    rng = random.Random(index)
    prompt_len = min(prompt_len, seq_len - 1)
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_len)]
    tokens, masks, logprobs = [], [], []
    for _ in range(size):
        completion = [rng.randrange(VOCAB) for _ in range(seq_len - prompt_len)]
        tokens.append(prompt + completion)
        masks.append([-100] * prompt_len + completion)
        logprobs.append([1.0] * prompt_len + [_float32(-rng.expovariate(3.0)) for _ in completion])
    scores = [float(rng.choice((1.0, 0.0))) for _ in range(size)]
    return {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": logprobs}


class Api:
    """`atropos api serve --store memory` on a free port, for the length of a `with` block."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "atropos", "api", "serve", "--store", "memory"]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.argv, self.log = argv, log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Api:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the API exited at start:\n{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the API did not answer /health within 60 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def setup(http: httpx.Client, groups: int, size: int, seq_len: int) -> None:
    registration = {
        "wandb_group": "",
        "wandb_project": "",
        "batch_size": groups * size,
        "max_token_len": seq_len + 1,
        "checkpoint_dir": "checkpoints",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": -1,
    }
    http.post("/register", json=registration).raise_for_status()
    env = {"max_token_length": seq_len + 1, "desired_name": "bench", "weight": 1.0}
    http.post("/register-env", json={**env, "group_size": size}).raise_for_status()


def fill(http: httpx.Client, bodies: list[bytes]) -> None:
    """Post one batch's groups (each a pre-encoded JSON body)."""
    headers = {"Content-Type": "application/json"}
    for body in bodies:
        http.post("/scored_data", content=body, headers=headers).raise_for_status()


def fetchers(http: httpx.Client, client: TrainerClient) -> dict[str, Callable[[], int]]:
    """Each way of getting one batch; each returns the sequences it got (a sanity check)."""

    def bare(decode: Callable[[bytes], Any]) -> Callable[[], int]:
        def run() -> int:
            r = http.get("/batch")
            r.raise_for_status()
            return sum(len(g["tokens"]) for g in decode(r.content)["batch"])

        return run

    def with_client(layout: str | None) -> Callable[[], int]:
        def run() -> int:
            batch = client.next_batch(within=10)
            assert batch is not None
            if layout is None:
                return sum(len(g.tokens) for g in batch.groups)
            return int(batch.tensors(layout).input_ids.shape[0 if layout == "padded" else 1])

        return run

    return dict(
        zip(
            WAYS,
            (
                bare(json.loads),
                bare(msgspec.json.decode),
                with_client(None),
                with_client("padded"),
                with_client("packed"),
            ),
            strict=True,
        )
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    bodies = [
        msgspec.json.encode(make_group(i, args.group_size, args.seq_len))
        for i in range(args.groups)
    ]
    expected = {
        "httpx + json": args.groups * args.group_size,
        "httpx + msgspec": args.groups * args.group_size,
        "client.next_batch": args.groups * args.group_size,
        "+ tensors(padded)": args.groups * args.group_size,
        "+ tensors(packed)": args.groups * args.group_size * (args.seq_len - 1),  # shifted
    }
    samples: dict[str, dict[str, list[float]]] = {w: {"wall_ms": [], "cpu_ms": []} for w in WAYS}
    with tempfile.TemporaryDirectory() as tmp, Api(Path(tmp) / "api.log") as api:
        with httpx.Client(base_url=api.url, timeout=120) as http:
            client = TrainerClient(api.url, patience=30, timeout=120)
            setup(http, args.groups, args.group_size, args.seq_len)
            ways = fetchers(http, client)
            order = list(WAYS)
            for round_ in range(args.rounds + 1):  # round 0: warm-up, not kept
                for way in order:
                    fill(http, bodies)
                    wall0, cpu0 = time.perf_counter(), time.process_time()
                    got = ways[way]()
                    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
                    if got != expected[way]:
                        raise RuntimeError(f"{way}: got {got}, expected {expected[way]}")
                    if round_:
                        samples[way]["wall_ms"].append(wall * 1e3)
                        samples[way]["cpu_ms"].append(cpu * 1e3)
                order = order[1:] + order[:1]
                print(f"round {round_}/{args.rounds} done", file=sys.stderr)
            client.close()
    import torch

    return {
        "workload": {
            "groups": args.groups,
            "group_size": args.group_size,
            "seq_len": args.seq_len,
            "rounds": args.rounds,
            "body_mib_posted": round(sum(map(len, bodies)) / 2**20, 1),
        },
        "torch_threads": torch.get_num_threads(),
        "machine": machine(),
        "code": code_version(),
        "samples": samples,
    }


def summary(result: dict[str, Any]) -> str:
    """The markdown table: median and min-max per way, wall and CPU ms per batch."""

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

    base = result["samples"]["httpx + json"]
    lines = [
        "| way | wall ms / batch | CPU ms / batch | wall vs httpx + json (median) |",
        "|---|---|---|---|",
    ]
    for way in WAYS:
        s = result["samples"][way]
        ratio = statistics.median(s["wall_ms"]) / statistics.median(base["wall_ms"])
        lines.append(f"| {way} | {cell(s['wall_ms'])} | {cell(s['cpu_ms'])} | {ratio:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, help="write every sample here")
    args = p.parse_args()
    result = measure(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))


if __name__ == "__main__":
    main()
