"""The rollout proxy's own CPU per request, in process: its ASGI app driven without sockets.

`benchmarks/proxy_overhead.py` measures the proxy as a process (uvicorn, the event loop, the
HTTP client to the inference server, the kernel's loopback). This one drives the app that
`atropos proxy serve` serves (`atropos.proxy.app.build_app`, the HTTP rules included) with
ASGI messages in the same loop, over sessions whose `ManagedServer`s call a stub server in
process (`atropos.testing.fake_engine.Engine`: the fake server's seeded 3-20 token answers
ending in `<|im_end|>`, no HTTP), so what it measures is the proxy's work from the ASGI call to
the inference call and back: the route, the session, the render, the tokens, the answer.

    python benchmarks/proxy_asgi.py --sessions 256 --turns 16
    python benchmarks/proxy_asgi.py --sessions 256 --turns 16 --profile 30   # cProfile, top 30

Each agent sends its whole history each call (a reply and a user turn added per call), as in
`proxy_overhead.py`. The stub's call suspends once, as a server call does, so the sessions'
calls interleave as in the proxy process (`--back-to-back`: no suspension, each session's calls
then run one after another with its objects in the CPU's caches, ~25% less CPU per request;
`--canonical`: the answers are text the tokenizer encodes, so their ids are canonical, as a
model's mostly are, and a continued call takes `HeldTexts`' canonical path rather than the
one for the fake engine's random ids).
`--context N`: the first message carries about N tokens of text (the README, repeated), as an
agent's prompt with its files and tool output does: what a call costs as the conversation
grows long (`continued_us_per_request`).

Reports, over the conversations (the sessions opened before): `proxy_us_per_request`, the
process time of the app's own steps (each run of its coroutine between suspensions, `steps`)
less the stub's own generation; `continued_us_per_request`, the same over the calls after each
session's first (a continued conversation: the first call renders and tokenizes the whole
prompt); `us_per_request`, all of this process's (the agents' JSON too); with `--memory`, the
memory the sessions hold (`tracemalloc`'s growth over the run, per session); and how many
renders used the window.

    python benchmarks/proxy_asgi.py --sessions 32 --turns 16 --canonical --context 32000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time
import tracemalloc
import types
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(ROOT / "benchmarks"))

from long_context import context_text  # noqa: E402

from atropos.envs.runner.heap import FrozenHeap  # noqa: E402
from atropos.inference.managed import ManagedServer  # noqa: E402
from atropos.inference.tokenizer import load_tokenizer  # noqa: E402
from atropos.proxy.app import Proxy, ProxySettings, build_app  # noqa: E402
from atropos.testing.fake_engine import Engine, Sampling  # noqa: E402

IN_APP = [0.0]  # process time of the app's own steps (the stub's included)
STUB = [0.0]  # process time of the stub's generation (not the proxy's)
CONTINUED = [0.0, 0]  # the app's own steps less the stub's, in calls after a session's first


@types.coroutine
def steps(coro: Any, own: list[float]) -> Generator[Any, Any, Any]:
    """Await `coro`, adding the process time of each of its steps (not the time it spent
    suspended, when other calls ran) to `IN_APP`, and less the stub's to `own[0]`."""
    value: Any = None
    error: BaseException | None = None
    while True:
        t0, stub0 = time.process_time(), STUB[0]
        try:
            yielded = coro.throw(error) if error is not None else coro.send(value)
        except StopIteration as stop:
            spent = time.process_time() - t0
            IN_APP[0] += spent
            own[0] += spent - (STUB[0] - stub0)
            return stop.value
        finally:
            error = None
        spent = time.process_time() - t0
        IN_APP[0] += spent
        own[0] += spent - (STUB[0] - stub0)
        try:
            value = yield yielded
        except BaseException as exc:  # delivered to the app at its next step
            value, error = None, exc


def _answer(prompt: str) -> str:
    """A text answer for `--canonical` (its ids the tokenizer's own encoding, as a model's
    answers mostly are): a few words that vary with the prompt."""
    return f"Step {len(prompt) % 97} done: {prompt[-20:-12].strip()!r} checked."


try:  # (a tree from before `prompt_json` encodes the ids whole, as its backends did)
    from atropos.inference.prompt_json import ids_json as SPELL
except ImportError:
    SPELL = msgspec.json.encode


class Stub:
    """The inference call, in process: the fake engine's answer for the prompt's ids, after
    one suspension (unless `back_to_back`), as a server call has."""

    def __init__(self, tokenizer: Any, back_to_back: bool = False, canonical: bool = False) -> None:
        self.engine = Engine(tokenizer, responder=_answer if canonical else None)
        self.back_to_back = back_to_back

    async def tokens_and_logprobs_completion(
        self, *, input_ids: list[int], n: int = 1, **kw: Any
    ) -> Any:
        if not self.back_to_back:
            await asyncio.sleep(0)
        t0 = time.process_time()
        SPELL(input_ids)  # the JSON a token backend sends (its work, not the proxy's)
        s = Sampling(n=n, max_tokens=kw.get("max_tokens") or 24)
        outs = await self.engine.generate(input_ids, "", s)
        STUB[0] += time.process_time() - t0
        return input_ids, [o.ids for o in outs], [o.logprobs for o in outs], ["stop"] * n


class StubServers:
    """What `Proxy` needs of a `ServerManager`: a `ManagedServer` per session over `Stub`."""

    def __init__(self, tokenizer: Any, back_to_back: bool = False, canonical: bool = False) -> None:
        self.stub = Stub(tokenizer, back_to_back, canonical)

    def managed_server(self, tokenizer: Any) -> Any:
        @asynccontextmanager
        async def opened() -> AsyncIterator[ManagedServer]:
            yield ManagedServer(self.stub, tokenizer)

        return opened()


async def call(
    app: Any, method: str, path: str, body: bytes, key: str | None, own: list[float] | None = None
) -> tuple[int, Any]:
    """One request through the ASGI app; its status and decoded JSON body (the app's own
    process time, less the stub's, added to `own[0]`)."""
    headers = [(b"host", b"127.0.0.1:9100"), (b"content-type", b"application/json")]
    headers.append((b"content-length", b"%d" % len(body)))
    if key is not None:
        headers.append((b"authorization", b"Bearer " + key.encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "server": ("127.0.0.1", 9100),
        "client": ("127.0.0.1", 50000),
    }  # fmt: skip
    sent = False
    got: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
        else:
            got["body"] += message.get("body", b"")

    await steps(app(scope, receive, send), own if own is not None else [0.0])
    return got["status"], json.loads(got["body"])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tokenizer = load_tokenizer("tiny")
    servers = StubServers(tokenizer, args.back_to_back, args.canonical)
    proxy = Proxy(servers, tokenizer, ProxySettings(max_sessions=1 << 20))
    app = build_app(proxy)
    context = context_text(tokenizer, args.context)

    async def agent(i: int, path: str, key: str, turns: int) -> None:
        task = f"task {i}: begin" + context
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for turn in range(turns):
            body = {"model": "atropos-tiny", "messages": messages, "max_tokens": 24}
            raw, own = json.dumps(body).encode(), [0.0]
            status, answer = await call(app, "POST", path, raw, key, own)
            if turn:
                CONTINUED[0] += own[0]
                CONTINUED[1] += 1
            assert status == 200, answer
            reply = answer["choices"][0]["message"]
            messages += [
                {"role": "assistant", "content": reply.get("content") or ""},
                {"role": "user", "content": f"task {i}: step {turn + 1}"},
            ]

    async def sessions(n: int) -> list[tuple[str, str]]:
        made = [await call(app, "POST", "/sessions", b"{}", None) for _ in range(n)]
        return [(f"/s/{m['id']}/v1/chat/completions", m["api_key"]) for _, m in made]

    warm = await sessions(8)
    await asyncio.gather(*(agent(i, p, k, 2) for i, (p, k) in enumerate(warm)))
    opened = await sessions(args.sessions)
    if args.memory:
        tracemalloc.start()
    profile = cProfile.Profile() if args.profile else None
    t0, app0, stub0 = time.process_time(), IN_APP[0], STUB[0]
    CONTINUED[:] = [0.0, 0]
    if profile is not None:
        profile.enable()
    await asyncio.gather(*(agent(i, p, k, args.turns) for i, (p, k) in enumerate(opened)))
    if profile is not None:
        profile.disable()
    used = time.process_time() - t0
    own = IN_APP[0] - app0 - (STUB[0] - stub0)
    held = tracemalloc.get_traced_memory()[0] if args.memory else 0
    if args.memory:  # what holds it: the largest allocation sites still alive
        for stat in tracemalloc.take_snapshot().statistics("lineno")[:12]:
            print(f"{stat.size / 1024 / args.sessions:7.2f} KiB/session  {stat.traceback}")
    tracemalloc.stop()
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        pstats.Stats(profile).sort_stats("cumtime").print_stats(args.profile)
    counts = {"window": 0, "whole": 0}
    for s in list(proxy.sessions.values())[8:]:
        for k in counts:
            counts[k] += s.template.counts[k] if s.template else 0
    requests = args.sessions * args.turns
    return {
        "requests": requests,
        "proxy_us_per_request": 1e6 * own / requests,
        "continued_us_per_request": 1e6 * CONTINUED[0] / max(CONTINUED[1], 1),
        "us_per_request": 1e6 * used / requests,
        "kib_per_session": held / 1024 / args.sessions if args.memory else None,
        "renders": counts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument(
        "--context", type=int, default=0, help="about this many tokens of text in the first message"
    )
    parser.add_argument("--profile", type=int, default=0, help="cProfile: print the top N")
    parser.add_argument("--memory", action="store_true", help="tracemalloc: KiB per session")
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="the stub never suspends (calls not interleaved)",
    )
    parser.add_argument(
        "--canonical",
        action="store_true",
        help="answers are text encoded by the tokenizer (canonical ids, as a model's mostly"
        " are), not the fake engine's random ids",
    )
    args = parser.parse_args()
    with FrozenHeap():  # as the app's lifespan holds one (`atropos.proxy.asgi`)
        print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
