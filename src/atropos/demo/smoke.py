"""`atropos demo --smoke`: start the trajectory API, push sample groups, pull a batch.

The API-only smoke run: a real API process with its SQLite store under runs/demo-smoke/, a fake
environment posting groups, and a trainer client pulling an exact batch with a lease and
acknowledging it. Seconds, and no torch.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import track
from rich.table import Table

from atropos.demo.procs import wait_until_up
from atropos.net import free_port


def sample_group(rng: random.Random, env_id: int, size: int, i: int) -> dict[str, object]:
    """A group of `size` sequences: a shared prompt and random completions with scores."""
    prompt = [rng.randrange(1000) for _ in range(12)]
    tokens, masks, scores = [], [], []
    for _ in range(size):
        completion = [rng.randrange(1000) for _ in range(rng.randrange(4, 20))]
        tokens.append(prompt + completion)
        masks.append([-100] * len(prompt) + completion)
        scores.append(round(rng.uniform(-1, 1), 3))
    return {
        "tokens": tokens,
        "masks": masks,
        "scores": scores,
        "env_id": env_id,
        "group_id": f"demo-{i}",
    }


def run(port: int = 0, run_dir: str = "runs/demo-smoke") -> int:
    """Run the demo; return a process exit code.

    Long because it is the demo's script, its steps in order.
    """
    console = Console()
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    store = f"sqlite:{run_dir}/api.db"
    cmd = [sys.executable, "-m", "atropos", "api", "serve", "--port", str(port), "--store", store]
    console.print(f"[bold]starting the trajectory API[/] on {url} (store {store})")
    api = subprocess.Popen(cmd)
    try:
        wait_until_up(url + "/health")
        with httpx.Client(base_url=url, timeout=10.0) as client:
            client.post("/reset_data")
            client.post(
                "/register",
                json={
                    "wandb_group": "demo",
                    "wandb_project": "atropos",
                    "batch_size": 16,
                    "max_token_len": 64,
                    "checkpoint_dir": f"{run_dir}/checkpoints",
                    "save_checkpoint_interval": 10,
                    "starting_step": 0,
                    "num_steps": 10,
                },
            ).raise_for_status()
            client.get("/batch")  # the trainer starts; envs may now register
            env = client.post(
                "/register-env",
                json={
                    "max_token_length": 64,
                    "desired_name": "demo_env",
                    "weight": 1.0,
                    "group_size": 4,
                    "env_key": "demo",
                },
            ).json()
            rng = random.Random(0)
            sizes = [4, 4, 3, 5, 4, 8, 2, 6]  # mixed group sizes pack into exact batches
            for i in track(range(24), description="env: posting scored groups"):
                group = sample_group(rng, env["env_id"], sizes[i % len(sizes)], i)
                client.post("/scored_data", json=group).raise_for_status()
            console.print(client.get("/status").json())
            table = Table(title="batches served (exactly 16 sequences each)")
            for col in ("step", "batch_id", "groups", "group sizes", "sequences"):
                table.add_column(col)
            while True:
                reply = client.get("/batch", params={"lease": 60}).json()
                if reply["batch"] is None:
                    break
                sizes_in = [len(g["tokens"]) for g in reply["batch"]]
                table.add_row(
                    str(reply["step"]),
                    reply["batch_id"][:8],
                    str(len(sizes_in)),
                    " ".join(map(str, sizes_in)),
                    str(sum(sizes_in)),
                )
                client.post("/batch/ack", json={"batch_id": reply["batch_id"]}).raise_for_status()
            console.print(table)
            console.print(client.get("/stats").json()["envs"])
    finally:
        api.terminate()
        api.wait(timeout=10)
    console.print("[green]demo finished[/]: the API stopped cleanly")
    return 0
