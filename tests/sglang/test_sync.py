"""The trainer's weight sync against SGLang itself: `--sync reload` through SGLang's
`/update_weights_from_disk`, `--sync transfer` over gloo with `--server-type sglang` (pause
modes keep and abort), and SGLang's pause and continue. The tests that change weights share one
server of their own (`private=`); each compares what it serves with its own trainer's weights."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from atropos.client.transfer import TransferClient  # noqa: E402
from atropos.testing.server_process import tiny_policy_path  # noqa: E402
from atropos.testing.sglang import SGLangServer  # noqa: E402

from ..trainer.helpers import trained as train_against  # noqa: E402
from .helpers import PROMPT, TOLERANCE, gap, hf_prompt_logprobs, served_prompt_logprobs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
LONG = {  # a generation that runs for seconds: 32 choices of 110 tokens (context: 128)
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 110, "n": 32, "temperature": 1.0, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def server(sglang_servers: Any) -> SGLangServer:
    """A server whose weights the tests replace."""
    found: SGLangServer = sglang_servers.get(private="its weights are replaced")
    return found


def trained(server: SGLangServer, out: Path, **kw: Any) -> list[dict[str, Any]]:
    """Train the tiny policy 2 steps against a live API and `server`; the metrics."""
    return train_against(server.base_url, out, tiny_policy_path(), **kw)[0]


def test_reload_serves_the_trainers_weights_tied_head_included(
    server: SGLangServer, tmp_path: Path
) -> None:
    """SGLang reloads the tied tiny policy whole: what it serves after two steps is the
    trainer's v2 (its head is its new embeddings), not the start."""
    rows = trained(server, tmp_path / "run", sync="reload")
    assert [r["served_policy_version"] for r in rows] == [1, 2]
    served = served_prompt_logprobs(server)
    assert gap(served, hf_prompt_logprobs(tmp_path / "run" / "weights" / "v2")) < TOLERANCE
    assert gap(served, hf_prompt_logprobs(tiny_policy_path())) > 1e-3  # they did move
    log = server.log_path.read_text(errors="replace")
    assert '"POST /update_weights_from_disk HTTP/1.1" 200' in log


@pytest.mark.parametrize("pause", ["keep", "abort"])
def test_transfer_over_gloo_serves_each_step(server: SGLangServer, tmp_path: Path, pause: str):
    """`--sync transfer --server-type sglang`: no disk; each step's weights go by broadcast
    inside SGLang's weight-update session, and SGLang serves the trainer's last step."""
    out = tmp_path / "run"
    rows = trained(server, out, sync="transfer", server_type="sglang", transfer_pause=pause)
    assert [r["served_policy_version"] for r in rows] == [1, 2]
    assert not (out / "weights").exists()
    served = served_prompt_logprobs(server)
    assert gap(served, hf_prompt_logprobs(out / "checkpoints" / "step_2")) < TOLERANCE
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}}
    answer = httpx.post(f"{server.root}/generate", json=body, timeout=60).json()
    assert answer["meta_info"]["weight_version"] == "2"
    log = server.log_path.read_text(errors="replace")
    assert '"POST /begin_weight_update HTTP/1.1" 200' in log


def noisy_policy(seed: int) -> Any:
    """The tiny policy with every weight moved (other logprobs from the same architecture)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_policy_path(), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def parked(
    http: httpx.Client, root: str, pool: concurrent.futures.Executor, mode: str
) -> concurrent.futures.Future[Any]:
    """A long generation caught running and paused in `mode` (`in_place`: held in the running
    batch; `retract`: sent back to the queue); one that ends first is replaced by a new one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = pool.submit(http.post, f"{root}/generate", json=LONG, timeout=120)
        while not answer.done() and not running(http, root):
            time.sleep(0.01)
        assert http.post(f"{root}/pause_generation", json={"mode": mode}).status_code == 200
        if not answer.done():
            return answer
        assert http.post(f"{root}/continue_generation", json={}).status_code == 200
    raise AssertionError("no generation was caught running within 60 s")


def running(http: httpx.Client, root: str) -> int:
    """How many requests SGLang's running batch holds (`GET /v1/loads`)."""
    loads = http.get(f"{root}/v1/loads", timeout=10).json()["loads"]
    return sum(int(load["num_running_reqs"]) for load in loads)


@pytest.mark.parametrize(("pause", "held", "finish"), [
    ("keep", "in_place", "length"),
    ("abort", "retract", "abort"),  # after in_place, SGLang's abort pause never returns
])  # fmt: skip
def test_a_push_with_requests_in_flight(
    server: SGLangServer, pause: str, held: str, finish: str
) -> None:
    """Requests caught mid-decode: `keep` (SGLang's `retract`) lets them finish, recomputed
    under the new weights, even from SGLang's running batch (where `in_place` would refuse the
    update: SGLang cannot flush the cache the old weights made); `abort` ends them."""
    model = noisy_policy(seed=len(pause))
    version = 40 + len(pause)
    with httpx.Client() as http, concurrent.futures.ThreadPoolExecutor(1) as pool:
        client = TransferClient([server.root], http, server_type="sglang", pause=pause, timeout=60)
        client.connect(model)
        try:
            answer = parked(http, server.root, pool, held)
            client.push(model, version)
            choices = answer.result(120).json()
        finally:
            client.close()
    assert {c["meta_info"]["finish_reason"]["type"] for c in choices} == {finish}
    if pause == "keep":
        assert {len(c["output_ids"]) for c in choices} == {110}
        assert {c["meta_info"]["weight_version"] for c in choices} == {str(version)}
    assert gap(served_prompt_logprobs(server), hf_logprobs_of(model)) < TOLERANCE


def hf_logprobs_of(model: Any) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([PROMPT]), use_cache=False).logits[0]
    table = torch.log_softmax(logits.float(), dim=-1)
    return [float(table[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]


def test_pause_generation_holds_new_requests_until_continue(sglang_server: SGLangServer) -> None:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}}
    with httpx.Client(base_url=sglang_server.root, timeout=60) as http:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert http.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
            try:
                answer = pool.submit(http.post, "/generate", json=body)
                time.sleep(1.0)
                assert not answer.done()  # held while paused
            finally:
                assert http.post("/continue_generation", json={}).status_code == 200
            done = answer.result(60)
    assert done.status_code == 200 and len(done.json()["output_ids"]) == 4
