"""The sender: batching, idempotent retries, spooling through an API outage, replay."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from atropos.api import ApiConfig, create_app
from atropos.envs.runner.sender import Sender
from atropos.testing import free_port, serve_in_thread


def group(tag: int) -> dict:
    return {
        "tokens": [[tag, 1, 2]] * 2,
        "masks": [[-100, 1, 2]] * 2,
        "scores": [1.0, 0.0],
        "group_id": uuid.uuid4().hex,
    }


def registered(url: str) -> None:
    httpx.post(
        f"{url}/register",
        json={
            "wandb_group": "g",
            "wandb_project": "p",
            "batch_size": 2,
            "max_token_len": 64,
            "checkpoint_dir": "c",
            "save_checkpoint_interval": 1,
            "starting_step": 0,
            "num_steps": 10,
        },
    )


def drain(url: str) -> list[int]:
    tags = []
    while (batch := httpx.get(f"{url}/batch").json()["batch"]) is not None:
        tags += [g["tokens"][0][0] for g in batch]
    return tags


def test_groups_are_batched_and_delivered(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        registered(url)

        async def main() -> Sender:
            sender = Sender(url, tmp_path / "spool.jsonl", linger=0.02)
            await sender.start()
            for t in range(50):
                sender.submit(group(t))
            await sender.close()
            return sender

        sender = asyncio.run(main())
        assert sender.stats.sent == 50 and sender.stats.spooled == 0
        assert sender.stats.attempts < 50  # batched, not one request per group
        assert sorted(drain(url)) == list(range(50))


def test_an_api_outage_loses_nothing_and_duplicates_nothing(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spool = tmp_path / "spool.jsonl"
    app = create_app(ApiConfig())

    async def during_outage() -> Sender:
        sender = Sender(url, spool, retries=1, backoff=0.01, replay_every=3600)
        await sender.start()
        for t in range(20):
            sender.submit(group(t))
        await sender.flush()
        return sender

    async def after_outage(sender: Sender) -> int:
        await sender.start()
        sent = await sender.replay_once()
        await sender.close()
        return sent

    async def run() -> None:
        sender = await during_outage()
        assert sender.stats.spooled == 20 and len(sender.spool) == 20
        await sender.close()
        with serve_in_thread(app, port=port):
            registered(url)
            assert await after_outage(sender) == 20
            # a second replay finds nothing; the API stored every group once
            assert len(sender.spool) == 0
            tags = await asyncio.to_thread(drain, url)
            assert sorted(tags) == list(range(20))

    asyncio.run(run())


def test_rejected_groups_are_dropped_not_retried(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        registered(url)

        async def main() -> Sender:
            sender = Sender(url, tmp_path / "spool.jsonl")
            await sender.start()
            bad = group(1)
            bad["scores"] = [1.0]  # one score for two sequences
            sender.submit(bad)
            await sender.close()
            return sender

        sender = asyncio.run(main())
        assert sender.stats.rejected == 1 and sender.stats.attempts == 1
        assert sender.stats.spooled == 0


def test_a_retried_send_that_had_landed_is_stored_once(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        registered(url)
        g = group(7)

        async def main() -> Sender:
            sender = Sender(url, tmp_path / "spool.jsonl")
            await sender.start()
            sender.submit(g)
            await sender.flush()
            sender.submit(dict(g))  # the same group again, as a retry after a lost answer
            await sender.close()
            return sender

        sender = asyncio.run(main())
        assert sender.stats.sent == 1 and sender.stats.duplicates == 1
        assert drain(url) == [7]
