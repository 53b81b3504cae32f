"""Proxy sessions and the ServerManager's sticky routing: a session's id is its routing key, so
every call of a session goes to one inference server, and sessions spread over the servers."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.proxy.app import Proxy, ProxySettings, build_app
from atropos.testing import FakeInferenceServer, serve_in_thread


async def agents(url: str, manager: ServerManager, count: int) -> list[set[str]]:
    """`count` agents at once, three calls each; the servers each one's answers came from."""
    async with httpx.AsyncClient(timeout=60) as client:
        made = [(await client.post(f"{url}/sessions")).json() for _ in range(count)]

        async def agent(session: dict[str, Any]) -> set[str]:
            head = {"authorization": f"Bearer {session['api_key']}"}
            messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
            answers = set()
            for turn in range(3):
                body = {"messages": messages, "max_tokens": 8}
                url = f"{session['base_url']}/chat/completions"
                reply = await client.post(url, json=body, headers=head)
                assert reply.status_code == 200, reply.text
                content = reply.json()["choices"][0]["message"]["content"]
                answers.add(content)
                messages += [
                    {"role": "assistant", "content": content},
                    {"role": "user", "content": f"more {turn}"},
                ]
            return answers

        seen = await asyncio.gather(*(agent(s) for s in made))
        for session in made:
            assert manager.homes.get(session["id"]) is not None  # keyed by the session's id
            head = {"authorization": f"Bearer {session['api_key']}"}
            await client.delete(f"{url}/sessions/{session['id']}", headers=head)
            assert manager.homes.get(session["id"]) is None  # forgotten with the session
    return list(seen)


def test_every_call_of_a_session_goes_to_one_server_and_sessions_spread() -> None:
    with (
        FakeInferenceServer(responder=lambda prompt: "server A", latency=0.2) as a,
        FakeInferenceServer(responder=lambda prompt: "server B", latency=0.2) as b,
    ):
        configs = [
            APIServerConfig(base_url=s.base_url, server_type="vllm", model_name="atropos-tiny")
            for s in (a, b)
        ]
        manager = ServerManager(configs, ServerManagerConfig(routing="sticky_least_loaded"))
        proxy = Proxy(manager, load_tokenizer("tiny"), ProxySettings(model="atropos-tiny"))
        with serve_in_thread(build_app(proxy)) as url:
            seen = asyncio.run(agents(url, manager, 8))
    assert all(len(answers) == 1 for answers in seen)  # one server per session
    assert set().union(*seen) == {"server A", "server B"}  # and both servers used
