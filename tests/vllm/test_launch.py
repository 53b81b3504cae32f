"""`atropos launch` with a `vllm` inference tier (local backend): vLLM from its own venv
(`python:`), started by the default command in dev mode, the `arithmetic` environment on it and
the reference trainer reloading every step's weights into it (`--sync reload`, vLLM's
`/collective_rpc`); the run ends with the trainer and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("torch")

from atropos.local.weights import untied_copy  # noqa: E402
from atropos.testing.proc import environ_has, group_alive, live_processes  # noqa: E402
from atropos.testing.vllm import MARKER, VLLMServer, tiny_policy_path  # noqa: E402

from ..launch.runs import Launch, kill_leftovers  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STEPS = 3
# the CPU recipe of `VLLMServer` (one thread, no binding, a small KV cache, loopback, offline)
RECIPE = ("VLLM_", "OMP_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "DO_NOT_TRACK")
# dev mode comes from launch's default; positions past the tiny policy's 128 from --hf-overrides
NOT_COPIED = ("VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")


def recipe_environ(python: Path, base: Path) -> dict[str, str]:
    environ = VLLMServer(python, base).environ()
    return {
        k: v for k, v in environ.items() if k.startswith(RECIPE) and k not in NOT_COPIED
    }  # fmt: skip


def run_file(tmp_path: Path, python: Path, marker: str) -> Path:
    policy = untied_copy(tiny_policy_path(), tmp_path / "policy")  # vLLM reloads it whole
    data: dict[str, Any] = {
        "run": {"name": "vllm-launch", "backend": "local", "ready_timeout": 600, "grace": 20},
        "api": {"args": {"max-staleness": 2}},
        "inference": [
            {
                "name": "vllm",
                "type": "vllm",
                "model": str(policy),
                "served_model_name": "atropos-tiny",
                "python": str(python),
                "args": {
                    "dtype": "float32",
                    "enforce-eager": True,
                    "max-model-len": 512,
                    "max-num-seqs": 16,
                    "seed": 0,
                    "hf-overrides": json.dumps({"max_position_embeddings": 512}),
                },  # fmt: skip
                "environ": {**recipe_environ(python, tmp_path / "vllm"), MARKER: marker},
                "restart": {"policy": "never"},
            }
        ],
        "envs": [
            {
                "name": "arithmetic",
                "env": {
                    "group_size": 8,
                    "max_num_workers": 4,
                    "max_batches_offpolicy": 1,
                    "steps_per_eval": 0,
                    "use_wandb": False,
                },  # fmt: skip
            }
        ],
        "trainer": {
            "model": str(policy),
            "args": {
                "steps": STEPS,
                "batch-size": 16,
                "micro-batch-size": 16,
                "seq-len": 64,
                "lr": 0.0005,
                "sync": "reload",
                "checkpoint-every": 50,
                "seed": 0,
            },  # fmt: skip
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def marked(marker: str) -> list[int]:
    """Live processes started with this test's marker in their environment (vLLM's)."""
    return [p.pid for p in live_processes() if environ_has(p.pid, MARKER, marker)]


@pytest.fixture
def marker() -> Iterator[str]:
    """A mark in vLLM's environment; whatever carries it is killed by pid afterwards."""
    mark = uuid.uuid4().hex
    yield mark
    for pid in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_launch_runs_the_loop_on_vllm_from_its_own_venv(
    vllm_python: Path, tmp_path: Path, marker: str
) -> None:
    launch = Launch(tmp_path / "run", example=str(run_file(tmp_path, vllm_python, marker)))
    pids: set[int] = set()  # every process group it started (launch.json forgets stopped ones)
    try:
        deadline = time.monotonic() + 600
        while launch.proc.poll() is None and time.monotonic() < deadline:
            pids.update(p["pid"] for p in launch.record().get("processes", []) if p.get("pid"))
            time.sleep(0.5)
        code = launch.wait(30)
    except BaseException:
        kill_leftovers(launch)  # it hung: every process group it recorded
        raise
    record, output = launch.record(), launch.output()
    launch.close()
    left = [pid for pid in pids if group_alive(pid)]
    for pid in left:  # groups of this launch that outlived it (then the test fails below)
        os.killpg(pid, signal.SIGKILL)
    assert code == 0, output
    states = {p["name"]: (p["state"], p["exit_codes"]) for p in record["processes"]}
    assert states["trainer"] == ("exited", [0]), states
    assert states["vllm"][0] == "stopped" and states["api"][0] == "stopped", states
    vllm = next(p for p in record["processes"] if p["name"] == "vllm")
    assert vllm["command"][:3] == [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server"]
    assert vllm["address"].startswith("127.0.0.1:")
    rows = [json.loads(line) for line in (tmp_path / "run" / "trainer" / "metrics.jsonl")
            .read_text().splitlines()]  # fmt: skip
    assert [r["served_policy_version"] for r in rows] == list(range(1, STEPS + 1))
    on_policy = [r["logprob_mismatch"] for r in rows if r["logprob_mismatch"] is not None]
    assert max(on_policy, default=0.0) < 1e-3, on_policy  # float32: vLLM's logprobs are ours
    assert record["api_stats"]["step"] == STEPS
    log = (tmp_path / "run" / "logs" / "vllm.log").read_text(errors="replace")
    assert '/update_weights_from_disk HTTP/1.1" 404' in log  # tried, then vLLM's own route:
    assert log.count('/collective_rpc HTTP/1.1" 200') == STEPS
    assert len(pids) == 4 and left == [], (pids, left, record["processes"])
    assert marked(marker) == []  # nor any process vLLM started (engine core, workers)
