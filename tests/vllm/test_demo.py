"""The demo's loop with vLLM as the inference server (`atropos demo --server vllm`): API,
vLLM, environment and trainer as real processes. vLLM reports no policy version, so this is
also the end-to-end check that groups carry the version of the weights that generated them:
on tokens stamped with the weights being trained, the trainer's logprobs equal vLLM's (float32)
— a group stamped ahead of its weights would show a gap of ~1e-2 there."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rich.console import Console  # noqa: E402

from atropos.demo.run import DemoConfig, run_loop  # noqa: E402
from atropos.tiny.warmstart import policy_path  # noqa: E402

STEPS = 8


@pytest.mark.slow
def test_the_demo_loop_trains_through_vllm(vllm_python: Path, tmp_path: Path) -> None:
    cfg = DemoConfig(
        out=tmp_path / "demo", steps=STEPS, batch_size=16, max_workers=4, server="vllm",
        vllm_python=str(vllm_python),
    )  # fmt: skip
    rows = run_loop(cfg, str(policy_path()), Console(stderr=True, quiet=True))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and r["trained_tokens"] > 0 for r in rows)
    assert [r["served_policy_version"] for r in rows] == list(range(1, STEPS + 1))
    on_policy = [r["logprob_mismatch"] for r in rows if r["logprob_mismatch"] is not None]
    assert on_policy, "no step trained on tokens stamped with the weights being trained"
    assert max(on_policy) < 1e-3, on_policy
    log = (cfg.out / "logs" / "server.log").read_text(errors="replace")
    assert '/collective_rpc HTTP/1.1" 200' in log  # reloaded through vLLM's own route
    stopped = json.loads((cfg.out / "exit_codes.json").read_text())
    assert stopped["codes"]["trainer"] == 0 and stopped["killed"] == []
