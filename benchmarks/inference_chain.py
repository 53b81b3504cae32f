#!/usr/bin/env python3
"""The inference call chain's own CPU per call, against the bare HTTP client (its floor).

A fake inference server (`python -m atropos.testing.fake_server`, zero latency, the vLLM shape)
runs in its own process; this process makes `--calls` calls at `--concurrency` and reports its
own CPU per call (`time.process_time`: the client side only). The ways (rows):

* `floor`: the request a token call sends, its body encoded once, posted with the bare
  `inference.http.HTTPClient` and its answer left unread: what any client pays;
* `manager`: `ServerManager.tokens_and_logprobs_completion(input_ids=...)`, the same prompt ids
  each call (manager, pool, backend, HTTP client, the answer read into rows);
* `single`: `ManagedServer.chat_turn` of a new one-message conversation in a fresh
  `manager.managed_server()` session (what a single-turn env's rollout makes: render from the
  prompt cache, generate, decode, build the node);
* `group`: `single` with `n=8` completions of the prompt in one call (one request, eight
  nodes: what a single-turn env's group makes); counted as one call;
* `local`: `group` over an in-process answer (a fixed completion per choice, no manager, no
  HTTP): `ManagedServer`'s own work per group (render from the cache, nodes, texts);
* `chain`: `manager` over an in-process client that answers at once with the fake server's
  answer to the same request (no socket, no server): the chain's own work per call, the least
  load-sensitive figure of it (the client's `request` here is one coroutine returning bytes);
* `turn`: `single` over `chain`'s in-process client: a single-turn rollout's whole chain,
  `ManagedServer` to the answer's rows and back to its node, without a socket;
* `gturn`: `group` over an in-process client (`chain`'s, answering the fake server's answer to
  the group's `n=8` request): a single-turn env's group as `Env.generate` made it, in a
  `managed_server()` session, without a socket;
* `gsingle`: the same group by `ServerManager.single_turn` (no session), as `Env.generate`
  makes it now;
* `session`: `--turns` calls of one conversation per session, each continuing the held sequence
  (the reply and a user message added; what a multi-turn env and the proxy make).

`--max-tokens` is every call's completion length (8: the env benchmark's; a longer one weighs
the answer's reading and decoding). "chain over floor" is a row's CPU per call minus the
floor's. Both token APIs of the vLLM backend can be measured (`--api generate`, what the env
benchmark's servers speak; `--api completions`, stock vLLM's, what the proxy benchmark's
speak). Each way is warmed up (`--warmup` calls, not counted) before its measured calls, and the
ways alternate over `--rounds`; the table gives the median over rounds.

Usage:
    nice .venv/bin/python benchmarks/inference_chain.py
    nice .venv/bin/python benchmarks/inference_chain.py --calls 2000 --rounds 1 --api generate
    nice .venv/bin/python benchmarks/inference_chain.py --ways floor group local --max-tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers beside us
from procstat import code_version, free_port, machine  # noqa: E402

from atropos.inference.config import APIServerConfig, ServerManagerConfig  # noqa: E402
from atropos.inference.http import HTTPClient, HTTPResponse  # noqa: E402
from atropos.inference.managed import ManagedServer  # noqa: E402
from atropos.inference.manager import ServerManager  # noqa: E402
from atropos.testing.fake_engine import load_tokenizer  # noqa: E402

WAYS = (
    "floor", "manager", "chain", "single", "turn", "group", "gturn", "gsingle", "session", "local"
)  # fmt: skip
GROUP = 8
MAX_TOKENS = 8
QUESTION = [{"role": "user", "content": "What is two plus two? Answer briefly."}]


def start_server(port: int) -> subprocess.Popen[bytes]:
    """The fake inference server in its own process; returns once `/health` answers."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the fake inference server did not start within 60 s")


async def spread(calls: int, concurrency: int, one: Callable[[], Awaitable[int]]) -> int:
    """`calls` calls of `one` (each returns how many calls it made) over `concurrency` workers."""
    left = [calls]

    async def worker() -> int:
        made = 0
        while left[0] > 0:
            left[0] -= 1
            made += await one()
        return made

    return sum(await asyncio.gather(*(worker() for _ in range(concurrency))))


class Answer:
    """An inference server in process: `output` (and its logprobs) for every choice."""

    def __init__(self, output: list[int]) -> None:
        self.output = output

    async def tokens_and_logprobs_completion(
        self, *, input_ids: list[int], n: int, **kw: Any
    ) -> Any:
        out = self.output
        return input_ids, [list(out) for _ in range(n)], [[-0.5] * len(out)] * n, ["stop"] * n


class CannedClient:
    """An HTTP client in process: every request is answered with `body` (status 200) at once."""

    def __init__(self, body: bytes) -> None:
        self.answer = HTTPResponse(200, body)
        self.closed = False

    async def request(self, method: str, url: str, body: Any = None, *a: Any, **kw: Any) -> Any:
        return self.answer

    async def close(self) -> None:
        self.closed = True


class Bench:
    """The ways, sharing one manager and one bare client on one fake server."""

    def __init__(self, url: str, api: str, turns: int, max_tokens: int = MAX_TOKENS) -> None:
        self.tok = load_tokenizer()
        config = APIServerConfig(
            base_url=url + "/v1", server_type="vllm", model_name="atropos-tiny",
            vllm_token_api=api, num_max_requests_at_once=4096,
        )  # fmt: skip
        self.manager = ServerManager([config], ServerManagerConfig(), tokenizer=self.tok)
        self.turns = turns
        self.max_tokens = max_tokens
        text = self.tok.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
        self.ids: list[int] = list(self.tok.encode(text, add_special_tokens=False))
        self.client = HTTPClient({"Content-Type": "application/json"})
        reply = self.tok.encode(" It is four. " * max(1, max_tokens // 4))[: max_tokens - 1]
        self.answer = Answer(reply + [self.tok.eos_token_id])
        if api == "generate":
            self.floor_url = url + "/generate"
            body: dict[str, Any] = {"prompt": {"prompt_token_ids": self.ids}, "logprobs": 0}
        else:
            self.floor_url = url + "/v1/completions"
            body = {"prompt": self.ids, "logprobs": 0, "return_token_ids": True,
                    "return_tokens_as_token_ids": True, "model": "atropos-tiny"}  # fmt: skip
        self.floor_body = msgspec.json.encode({**body, "n": 1, "max_tokens": max_tokens})
        self.canned = ServerManager([config], ServerManagerConfig(), tokenizer=self.tok)
        self.canned_group = ServerManager([config], ServerManagerConfig(), tokenizer=self.tok)
        self.group_body = msgspec.json.encode({**body, "n": GROUP, "max_tokens": max_tokens})

    async def start(self) -> None:
        """The `chain` way's manager: its backend's client answers the floor's answer at once."""
        answer = await self.client.request("POST", self.floor_url, self.floor_body)
        backend: Any = self.canned.servers[0]
        backend._session = CannedClient(answer.body)
        answer = await self.client.request("POST", self.floor_url, self.group_body)
        backend = self.canned_group.servers[0]
        backend._session = CannedClient(answer.body)

    async def chain(self) -> int:
        await self.canned.tokens_and_logprobs_completion(
            input_ids=self.ids, n=1, max_tokens=self.max_tokens
        )
        return 1

    async def floor(self) -> int:
        answer = await self.client.request("POST", self.floor_url, self.floor_body)
        assert answer.status == 200, answer.body[:200]
        return 1

    async def manager_call(self) -> int:
        await self.manager.tokens_and_logprobs_completion(
            input_ids=self.ids, n=1, max_tokens=self.max_tokens
        )
        return 1

    async def single(self) -> int:
        async with self.manager.managed_server(self.tok) as managed:
            await managed.chat_turn(messages=QUESTION, max_tokens=self.max_tokens)
        return 1

    async def turn(self) -> int:
        async with self.canned.managed_server(self.tok) as managed:
            await managed.chat_turn(messages=QUESTION, max_tokens=self.max_tokens)
        return 1

    async def group(self) -> int:
        async with self.manager.managed_server(self.tok) as managed:
            await managed.chat_turn(messages=QUESTION, n=GROUP, max_tokens=self.max_tokens)
        return 1

    async def gturn(self) -> int:
        async with self.canned_group.managed_server(self.tok) as managed:
            await managed.chat_turn(messages=QUESTION, n=GROUP, max_tokens=self.max_tokens)
        return 1

    async def gsingle(self) -> int:
        await self.canned_group.single_turn(
            self.tok, messages=QUESTION, n=GROUP, max_tokens=self.max_tokens
        )
        return 1

    async def local(self) -> int:
        managed = ManagedServer(self.answer, self.tok)
        await managed.chat_turn(messages=QUESTION, n=GROUP, max_tokens=self.max_tokens)
        return 1

    async def session(self) -> int:
        async with self.manager.managed_server(self.tok) as managed:
            msgs = list(QUESTION)
            for turn in range(self.turns):
                reply = await managed.chat_turn(messages=msgs, max_tokens=self.max_tokens)
                msgs += [
                    {"role": "assistant", "content": reply.contents[0]},
                    {"role": "user", "content": f"And then? ({turn})"},
                ]
        return self.turns

    def way(self, name: str) -> Callable[[], Awaitable[int]]:
        return {
            "floor": self.floor,
            "manager": self.manager_call,
            "chain": self.chain,
            "turn": self.turn,
            "single": self.single,
            "group": self.group,
            "local": self.local,
            "gturn": self.gturn,
            "gsingle": self.gsingle,
            "session": self.session,
        }[name]


async def measure(args: argparse.Namespace, url: str, api: str) -> dict[str, list[float]]:
    """CPU us per call of each way, one figure per round."""
    bench = Bench(url, api, args.turns, args.max_tokens)
    out: dict[str, list[float]] = {w: [] for w in args.ways}
    try:
        await bench.start()
        for way in args.ways:  # warm-up: connections, caches, first calls
            await spread(args.warmup, args.concurrency, bench.way(way))
        for r in range(args.rounds):
            order = args.ways[r % len(args.ways) :] + args.ways[: r % len(args.ways)]
            for way in order:
                calls = args.calls if way != "session" else max(1, args.calls // args.turns)
                cpu = time.process_time()
                made = await spread(calls, args.concurrency, bench.way(way))
                out[way].append((time.process_time() - cpu) / made * 1e6)
                print(f"  {api} round {r + 1} {way}: {out[way][-1]:.1f} us/call", flush=True)
    finally:
        await bench.manager.aclose()
        await bench.canned.aclose()
        await bench.canned_group.aclose()
        await bench.client.close()
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "| api | way | CPU us/call (median) | min-max | over floor |",
        "|---|---|---|---|---|",
    ]
    for api, ways in results.items():
        floor = statistics.median(ways["floor"]) if ways.get("floor") else None
        for way, figures in ways.items():
            median = statistics.median(figures)
            over = (
                f"{median - floor:.1f}"
                if floor is not None and way in ("manager", "single", "group", "session")
                else "—"
            )
            lines.append(
                f"| {api} | {way} | {median:.1f} | {min(figures):.1f}-{max(figures):.1f} | {over} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="measured calls per way/round")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4, help="calls per session ('session')")
    parser.add_argument("--api", action="append", choices=("generate", "completions"))
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS, help="completion length of every call"
    )
    args = parser.parse_args(argv)
    apis = args.api or ["generate", "completions"]
    port = free_port()
    server = start_server(port)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for api in apis:
            results[api] = asyncio.run(measure(args, f"http://127.0.0.1:{port}", api))
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(table(results))
    if args.json:
        record = {"args": vars(args) | {"json": str(args.json)}, "results": results}
        record |= {"machine": machine(), "code": code_version()}
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
