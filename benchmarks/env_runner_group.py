#!/usr/bin/env python3
"""The serve runner's own CPU per group, in process: everything the env does for a group
outside the inference call chain.

`benchmarks/env_throughput.py` measures the whole env process, where a few us per rollout of
the runner drown in the run-to-run spread of a shared machine (+-2 us per rollout). Here the
simple env of that benchmark (`benchmarks/envs/ours_single_turn.py`, G = 8) runs in
`ServeRunner._work` with its server call replaced by rollouts captured from the fake server
(`atropos.testing.FakeInferenceServer`, once, at the start): the item, the rollout's bookkeeping
(pacing, deadline, drop and version contexts), the simple env's scoring and group building,
the runner's checks and stamps, the step-metrics window and the sender's encoding at submit.
Not here: the inference chain, the event loop's sockets, the sender's POST.

`--depth` and `--resumes`: the canned call awaits through that many coroutine levels and
resumes that many times (as a server call does), so frames between the task and the env count.
The figure is process CPU (`time.process_time`) per group, less the copying of the canned
rollouts (measured alone), the least of `--repeat` rounds of `--groups` groups.

    .venv/bin/python benchmarks/env_runner_group.py
    PYTHONPATH=/tmp/before/src .venv/bin/python benchmarks/env_runner_group.py   # another tree
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "envs"))

from ours_single_turn import SingleTurn  # noqa: E402

import atropos.envs.simple as simple  # noqa: E402
from atropos.envs.config import BaseEnvConfig, ResolvedConfig  # noqa: E402
from atropos.envs.runner.deadline import Deadlines  # noqa: E402
from atropos.envs.runner.serve import ServeRunner  # noqa: E402
from atropos.inference.config import APIServerConfig, ServerManagerConfig  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

ITEMS = 64  # items (and captured groups) cycled through


def make_env(url: str) -> tuple[SingleTurn, ResolvedConfig]:
    """The benchmark's env as `env_throughput.py` starts it (vLLM /generate, G = 8)."""
    config = BaseEnvConfig(
        tokenizer_name="tiny", group_size=8, use_wandb=False,
        ensure_scores_are_not_same=False, max_num_workers=256,
    )  # fmt: skip
    servers = [
        APIServerConfig(
            base_url=url, server_type="vllm", model_name="atropos-tiny", vllm_token_api="generate"
        )
    ]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "serve")  # type: ignore[arg-type]
    return SingleTurn(config, servers, manager=resolved.manager), resolved


async def capture(env: SingleTurn) -> tuple[list[Any], list[list[simple.Rollout]]]:
    """`ITEMS` items and the rollouts the fake server gave for each."""
    await env.setup()
    items = [await env.get_next_item() for _ in range(ITEMS)]
    canned = [await env.generate(env.prompt(item), n=8) for item in items]
    await env.server.aclose()
    return items, canned


async def measure(args: argparse.Namespace) -> float:
    with FakeInferenceServer() as fake:
        env, resolved = make_env(fake.base_url)
        items, canned = await capture(env)
    made = 0

    async def deep(level: int) -> None:
        if level:
            return await deep(level - 1)
        for _ in range(args.resumes):
            await asyncio.sleep(0)

    async def generate(messages: Any, n: int, split: str = "train", **kw: Any) -> list[Any]:
        nonlocal made
        made += 1
        await deep(args.depth)
        return [
            simple.Rollout(r.text, list(r.tokens), list(r.masks), list(r.logprobs or []),
                           r.finish_reason, r.token_source, r.policy_version)
            for r in canned[made % ITEMS]
        ]  # fmt: skip

    env.generate = generate  # type: ignore[method-assign]
    runner = ServeRunner(env, resolved, Path(tempfile.mkdtemp()))
    runner.sender.msgpack = True  # as with our API: groups encoded at submit
    env.env_id, env.max_token_len = 3, 4096
    runner.deadlines = Deadlines(600.0)  # the default worker_timeout
    runner.capacity = lambda: 1 << 30  # type: ignore[method-assign]
    started = time.process_time()
    for _ in range(args.groups):
        await generate(None, 8)
    copies = time.process_time() - started
    queue, best = runner.sender._queue, float("inf")
    for _ in range(args.repeat):
        count = 0

        async def next_item() -> Any:
            nonlocal count
            count += 1
            while queue.qsize() > 512:  # the pump's part, outside the figure's purpose
                runner._delivered([queue.get_nowait().policy_version])  # type: ignore[union-attr]
            return None if count >= args.groups else items[count % ITEMS]

        env.get_next_item = next_item  # type: ignore[method-assign]
        started = time.process_time()
        with runner.heap, runner.latency.bind():
            await runner._work(items[0])
        best = min(best, time.process_time() - started - copies)
    return best / args.groups * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=15_000, help="groups per round")
    p.add_argument("--repeat", type=int, default=4, help="rounds; the least counts")
    p.add_argument("--depth", type=int, default=6, help="coroutine levels of the canned call")
    p.add_argument("--resumes", type=int, default=1, help="times the canned call resumes")
    args = p.parse_args()
    us = asyncio.run(measure(args))
    print(f"runner CPU per group (G = 8), inference call excluded: {us:.2f} us")


if __name__ == "__main__":
    main()
