"""Session-affine routing over real loopback servers (`FakeInferenceServer`): a session's turns
stay on one server, new sessions spread, a server killed mid-conversation re-homes only its
sessions, the load ratio re-homes, and the engines' session hints are sent."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
FAST = {"retry_backoff": 0.01, "retry_backoff_max": 0.05, "health_check_interval": 0.05}
HINTS = (b"x-session-id", b"x-smg-routing-key")


class Spy:
    """An ASGI wrapper that records the session hints of every generation request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hints: list[dict[str, str]] = []  # per generation request: hint header -> value

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = dict(scope["headers"])
            self.hints.append({k.decode(): headers[k].decode() for k in HINTS if k in headers})
        await self.app(scope, receive, send)


@contextlib.contextmanager
def fleet(count: int, latency: float = 0.0) -> Iterator[list[tuple[FakeInferenceServer, Spy]]]:
    """`count` fake servers, each with a `Spy` on its requests."""
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(count):
            server = FakeInferenceServer(latency=latency)
            spy = Spy(server.app)
            server.app = spy  # served from start(): the spy sees every request
            out.append((stack.enter_context(server), spy))
        yield out


def manager(
    servers: list[tuple[FakeInferenceServer, Spy]],
    server_type: str = "vllm",
    slots: int = 16,
    **settings: Any,
) -> ServerManager:
    configs = [
        APIServerConfig(
            base_url=s.base_url,
            server_type=server_type,
            model_name="m",
            num_max_requests_at_once=slots,
        )
        for s, _ in servers
    ]
    return ServerManager(configs, ServerManagerConfig(**{**FAST, **settings}), tokenizer=TOK)


async def converse(m: ServerManager, turns: int, **session: Any) -> tuple[list[int], str]:
    """One conversation through a `ManagedServer`: the server of each turn, and its key."""
    used: list[int] = []
    messages: list[dict[str, str]] = [{"role": "user", "content": "hello"}]
    async with m.managed_server(TOK, **session) as managed:
        for turn in range(turns):
            reply = await managed.chat_completion(messages=messages, max_tokens=4)
            used.append(managed.server.slot.index)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"and {turn}?"},
            ]
        return used, managed.server.session


def test_turns_of_one_session_stay_on_one_server_with_its_hint() -> None:
    with fleet(3) as servers:

        async def main() -> tuple[list[int], str]:
            async with manager(servers) as m:
                return await converse(m, 6)

        used, key = asyncio.run(main())
    assert len(set(used)) == 1
    home = used[0]
    assert [len(spy.hints) for _, spy in servers] == [6 if i == home else 0 for i in range(3)]
    assert servers[home][1].hints == [{"x-session-id": key}] * 6


def test_new_sessions_spread_and_each_keeps_its_server() -> None:
    with fleet(3, latency=0.02) as servers:

        async def main() -> list[tuple[list[int], str]]:
            # room for all 30 on any one server: spread by load, the homes can come out
            # uneven on a loaded machine (a server whose sessions sit between turns looks
            # idle), and a full home would rightly move a session; this asserts stickiness
            async with manager(servers, slots=32) as m:
                results = await asyncio.gather(*(converse(m, 4) for _ in range(30)))
                assert len(m.homes) == 0  # generated keys are forgotten when a session ends
                return results

        results = asyncio.run(main())
    assert all(len(set(used)) == 1 for used, _ in results)
    per_server = [sum(used[0] == i for used, _ in results) for i in range(3)]
    assert min(per_server) >= 7, per_server  # 10 each when evenly spread; never all on one
    for index, (_, spy) in enumerate(servers):  # every request a server saw is of its sessions
        mine = {key for used, key in results if used[0] == index}
        assert {hint["x-session-id"] for hint in spy.hints} == mine


def test_a_server_killed_mid_conversation_rehomes_its_sessions_only() -> None:
    with fleet(3) as servers:

        async def main() -> tuple[dict[str, list[int]], int, int]:
            async with manager(servers) as m:
                keys = [f"rollout-{i}" for i in range(9)]
                trail: dict[str, list[int]] = defaultdict(list)

                async def turn(key: str, text: str) -> None:
                    await m.chat_completion(
                        messages=[{"role": "user", "content": text}], max_tokens=4, session=key
                    )
                    trail[key].append(m.homes.get(key) or 0)

                for t in range(2):
                    await asyncio.gather(*(turn(k, f"{k} turn {t}") for k in keys))
                victim = trail[keys[0]][0]
                servers[victim][0].stop()  # gone: connections refused from now on
                for t in range(2, 5):
                    await asyncio.gather(*(turn(k, f"{k} turn {t}") for k in keys))
                return dict(trail), victim, m.homes.rehomed

        trail, victim, rehomed = asyncio.run(main())
    moved = [k for k, used in trail.items() if used[0] == victim]
    kept = [k for k, used in trail.items() if used[0] != victim]
    assert moved and kept
    for key in kept:  # the others keep theirs
        assert len(set(trail[key])) == 1
    for key in moved:  # one move, then the new home for the rest of the conversation
        after = trail[key][2:]
        assert victim not in after and len(set(after)) == 1
    assert rehomed == len(moved)


@pytest.mark.parametrize(
    ("occupied", "ratio", "moves"),
    [(3, 2.0, False), (9, 2.0, True), (9, 8.0, True), (9, 16.0, False)],
)
def test_the_load_ratio_rehomes_a_session(occupied: int, ratio: float, moves: bool) -> None:
    """Home s0 with `occupied` other requests in flight (cap 16), s1 idle: the next turn moves
    when home would be at least half full and (occupied + 1) / 16 over `ratio` times 1 / 16:
    3 others is under half; 9 (10 / 16 with the call) is over 2.0 and 8.0, not 16.0."""
    with fleet(2) as servers:

        async def main() -> tuple[int, int]:
            async with manager(servers, rehome_load_ratio=ratio) as m:
                await m.chat_completion(messages=[{"role": "user", "content": "a"}], session="s")
                home = m.homes.get("s")
                assert home is not None
                pool, loop = m._pool, asyncio.get_running_loop()
                held = [
                    await pool.acquire("train", loop.time() + 5, prefer=pool.slots[home])
                    for _ in range(occupied)
                ]
                assert all(slot.index == home for slot in held)
                await m.chat_completion(messages=[{"role": "user", "content": "b"}], session="s")
                for slot in held:
                    await pool.release(slot, "train")
                after = m.homes.get("s")
                assert after is not None
                return home, after

        before, after = asyncio.run(main())
    assert (before != after) is moves


def test_least_loaded_does_not_keep_a_home() -> None:
    with fleet(2) as servers:

        async def main(policy: str) -> set[int]:
            async with manager(servers, routing=policy) as m:
                pool, loop = m._pool, asyncio.get_running_loop()
                seen = set()
                for busy in (0, 1, 0, 1):  # one request held on each server in turn
                    held = await pool.acquire("train", loop.time() + 5, prefer=pool.slots[busy])
                    async with m.managed_server(TOK) as managed:
                        await managed.chat_completion(messages=[{"role": "user", "content": "x"}])
                        seen.add(managed.server.slot.index)
                    await pool.release(held, "train")
                return seen

        assert asyncio.run(main("least_loaded")) == {0, 1}  # always the idle one


def test_sglang_servers_get_the_gateway_routing_key_and_single_calls_no_hint() -> None:
    with fleet(1) as servers:

        async def main() -> None:
            async with manager(servers, server_type="sglang") as m:
                await m.tokens_and_logprobs_completion(input_ids=[5, 6, 7], max_tokens=2)
                await m.tokens_and_logprobs_completion(
                    input_ids=[5, 6, 7], max_tokens=2, session="agent-7"
                )

        asyncio.run(main())
    assert servers[0][1].hints == [{}, {"x-smg-routing-key": "agent-7"}]


def test_a_named_session_finds_its_home_again() -> None:
    """A proxy session or an agent rollout that opens a new `ManagedServer` with its key goes
    back to the server that holds its conversation."""
    with fleet(3) as servers:

        async def main() -> list[list[int]]:
            async with manager(servers) as m:
                await asyncio.gather(*(converse(m, 1) for _ in range(2)))  # others' traffic
                first, _ = await converse(m, 2, session="agent-1")
                second, _ = await converse(m, 2, session="agent-1")
                return [first, second]

        first, second = asyncio.run(main())
    assert set(first) == set(second) and len(set(first)) == 1


def test_a_single_turn_is_a_session_s_turn_without_a_session() -> None:
    """`single_turn` (a single-turn env's group) gives what a session's first `chat_turn` gives,
    holds nothing, sends no session hint and goes to the least-loaded server each call."""
    messages = [{"role": "user", "content": "hello"}]
    with fleet(2, latency=0.05) as servers:

        async def main() -> None:
            async with manager(servers) as m:
                async with m.managed_server(TOK) as managed:
                    held = await managed.chat_turn(messages=messages, n=3, max_tokens=4, seed=1)
                single = await m.single_turn(TOK, messages=messages, n=3, max_tokens=4, seed=1)
                assert single.contents == held.contents
                assert [n.tokens for n in single.nodes] == [n.tokens for n in held.nodes]
                assert [n.masked_tokens for n in single.nodes] == [
                    n.masked_tokens for n in held.nodes
                ]
                assert [n.logprobs for n in single.nodes] == [n.logprobs for n in held.nodes]
                assert m._single.nodes == [] and len(m.homes) == 0  # nothing held
                assert all(node.messages is None for node in single.nodes)
                # two at once: the second goes to the other (idle) server
                await asyncio.gather(*(m.single_turn(TOK, messages=messages) for _ in range(2)))

        asyncio.run(main())
    hints = [spy.hints for _, spy in servers]
    assert sum(map(len, hints)) == 4
    assert [len(h) for h in hints] != [4, 0] and [len(h) for h in hints] != [0, 4]
    assert [hint for h in hints for hint in h].count({}) == 3  # only the session's call had one
