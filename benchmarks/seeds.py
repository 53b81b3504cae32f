"""What `demo_seeds.py` and `distill_seeds.py` share: `atropos demo` once per seed, and the
result written as JSON beside its Markdown table."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_seeds(
    demo_flags: list[str], seeds: list[int], out: Path, steps: int | None
) -> list[dict[str, Any]]:
    """`atropos demo DEMO_FLAGS --seed S --out OUT/S [--steps N]` for each seed, one after
    another; each run's summary.json `summary`, with its seed and wall seconds."""
    rows = []
    for seed in seeds:
        run_dir = out / str(seed)
        argv = [sys.executable, "-m", "atropos", "demo", *demo_flags,
                "--seed", str(seed), "--out", str(run_dir)]  # fmt: skip
        if steps:
            argv += ["--steps", str(steps)]
        print(f"seed {seed}: {' '.join(argv[1:])}", flush=True)
        t0 = time.monotonic()
        subprocess.run(argv, check=True, cwd=ROOT)
        summary = json.loads((run_dir / "summary.json").read_text())["summary"]
        rows.append({"seed": seed, "seconds": round(time.monotonic() - t0, 1), **summary})
    return rows


def write_result(result: dict[str, Any], json_path: Path, render: Callable[[dict], str]) -> None:
    """`result` as JSON at `json_path`, its table (`render`) beside it as .md, and printed."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    md = render(result)
    json_path.with_suffix(".md").write_text(md)
    print(md)
