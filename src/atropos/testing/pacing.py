"""A long-tailed rollout workload under `--max-staleness`, with pacing or with discarding only.

One run, all on loopback: a `FakeInferenceServer` that reports the trainer's published version
on every answer (so a rollout whose calls straddle a publication spans two versions, as with
`keep`-mode weight transfer), the trajectory API with `--max-staleness N`, a scripted trainer
in a thread (takes a batch, "trains" for `train_seconds`, publishes the next version, again),
and a `ServeRunner` driving `LongTail`: a dataset where one item in `long_every` is long (its
rollout takes `long_seconds`, the others `short_seconds`, slept in the env), each rollout making
`turns` calls to the server, each followed by its share of the time (a turn's tool calls,
the scoring): the tokens of a long rollout are generated early, by weights that age while it
runs, as in an agent's rollout.

`run(scenario, pace)` returns what was trained: the share of long tasks among the trained
groups against their share in the data, what the API discarded for age, how long the env was
paced, and each trained group's staleness (its batch's step minus 1, the trainer's weights
then, minus its version). Used by `tests/envs/test_pacing.py` and `benchmarks/pacing.py`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from atropos.api import ApiConfig, create_app
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.envs.runner.serve import ServeRunner
from atropos.envs.simple import Env
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.base import PolicyVersions
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.testing.serve import serve_in_thread

LONG_MARK = "(long)"


@dataclass
class Scenario:
    """The workload's knobs (defaults: a test-sized run of a few seconds)."""

    max_staleness: int = 2
    batch_size: int = 8
    group_size: int = 2
    long_every: int = 4  # one item in this many is long
    long_seconds: float = 0.5
    short_seconds: float = 0.01
    turns: int = 1  # calls to the server per rollout
    train_seconds: float = 0.04
    workers: int = 32
    batches: int = 40  # trained batches to wait for
    deadline: float = 120.0  # seconds the run may take at most


@dataclass
class Outcome:
    """What one run trained and discarded."""

    pace: bool
    groups: list[dict[str, Any]]  # trained groups, with "step" (their batch's step) added
    data_long_share: float
    api_drops: dict[str, int]
    paced_seconds: float
    paced_count: int
    seconds: float
    batch_times: list[float]  # when each trained batch came (time.monotonic())
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # group_id: first, last

    @property
    def long_trained(self) -> int:
        return sum(1 for g in self.groups if is_long(g))

    @property
    def long_share(self) -> float:
        return self.long_trained / len(self.groups) if self.groups else 0.0

    @property
    def batches_per_second(self) -> float:
        """Trained batches per second, from the first batch to the last."""
        times = self.batch_times
        return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0

    @property
    def staleness(self) -> list[int]:
        """Per trained group: the trainer's weights when it was trained minus its version."""
        return [g["step"] - 1 - g["policy_version"] for g in self.groups]


def is_long(group: dict[str, Any]) -> bool:
    return LONG_MARK in json.dumps(group.get("messages") or [])


class LongTail(Env):
    """Sums, one in `long_every` marked long; a rollout sleeps by its item's class and makes
    `turns` calls. Records the versions its calls reported, by group id (`spans`)."""

    name = "long_tail"
    system_prompt = "Answer with the number only."
    scenario = Scenario()
    spans: dict[str, tuple[int, int]]  # set per instance by `_env`

    def load(self) -> list[Item]:
        every = self.scenario.long_every
        return [
            {
                "question": f"What is {i} + {i % 7}?" + (f" {LONG_MARK}" if i % every == 0 else ""),
                "answer": i + i % 7,
            }
            for i in range(every * 8)
        ]

    def score(self, item: Item, completion: str) -> float:
        return 1.0 if completion.strip() == str(item["answer"]) else -1.0

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        s = self.scenario
        seconds = s.long_seconds if LONG_MARK in item["question"] else s.short_seconds
        first: int | None = None
        for _ in range(s.turns - 1):  # earlier turns: a call, then the rest of the turn
            with PolicyVersions() as seen:
                await self.generate(self.prompt(item), n=1)
            first = seen.lowest if first is None else first
            await asyncio.sleep(seconds / s.turns)
        group, more = await super().collect_trajectories(item)
        await asyncio.sleep(seconds / s.turns)  # the last turn's tools, scoring, ...
        if group is not None:
            gid = uuid.uuid4().hex
            group["group_id"] = gid
            last = group.get("policy_version")
            if isinstance(last, int):
                self.spans[gid] = (last if first is None else first, last)
        return group, more


class ScriptedTrainer(threading.Thread):
    """Registers, publishes version 0, then: take a batch, sleep `train_seconds`, publish the
    next version; until `stop` is set. `published` is what the servers serve."""

    def __init__(self, url: str, batch_size: int, train_seconds: float) -> None:
        super().__init__(daemon=True)
        self.url, self.batch_size, self.train_seconds = url, batch_size, train_seconds
        self.batches: list[list[dict[str, Any]]] = []
        self.times: list[float] = []  # when each batch came (time.monotonic())
        self.published = 0
        self.stop = threading.Event()

    def run(self) -> None:
        registration = {
            "wandb_group": "g",
            "wandb_project": "p",
            "batch_size": self.batch_size,
            "max_token_len": 2048,
            "checkpoint_dir": "",
            "save_checkpoint_interval": -1,
            "starting_step": 0,
            "num_steps": 1_000_000,
        }
        with httpx.Client(base_url=self.url, timeout=10) as c:
            c.post("/register", json=registration).raise_for_status()
            c.post("/policy_version", json={"version": 0}).raise_for_status()
            while not self.stop.is_set():
                batch = c.get("/batch").json()["batch"]
                if batch is None:
                    time.sleep(0.005)
                    continue
                self.batches.append(batch)
                self.times.append(time.monotonic())
                time.sleep(self.train_seconds)
                self.published = len(self.batches)  # the servers first, then the API
                c.post("/policy_version", json={"version": self.published}).raise_for_status()


def run(scenario: Scenario, pace: bool, run_dir: Path, server: str | None = None) -> Outcome:
    """One run of `scenario`, pacing on or off; see the module docstring. `server`: the base
    URL of a real vLLM-shaped server of the tiny policy ("atropos-tiny") to use instead of the
    fake one (it reports no versions: groups are stamped with the published version)."""
    from atropos.testing.fake_server import FakeInferenceServer

    trainer: ScriptedTrainer | None = None
    fake = FakeInferenceServer(responder=_answer, policy_version=lambda: _published(trainer))
    with fake, serve_in_thread(create_app(ApiConfig(max_staleness=scenario.max_staleness))) as url:
        trainer = ScriptedTrainer(url, scenario.batch_size, scenario.train_seconds)
        trainer.start()
        env, resolved = _env(scenario, pace, server or fake.base_url, url)
        runner = ServeRunner(env, resolved, run_dir)
        runner.status_interval = 0.05
        runner.drain_timeout = 5.0
        started = time.monotonic()

        async def main() -> int:
            task = asyncio.create_task(runner.run())
            end = started + scenario.deadline
            while time.monotonic() < end and len(trainer.batches) < scenario.batches:
                if task.done():
                    break
                await asyncio.sleep(0.05)
            runner.stopping.set()
            return await task

        try:
            code = asyncio.run(main())
        finally:
            trainer.stop.set()
            trainer.join(10)
        seconds = time.monotonic() - started
        if code != 0:
            raise RuntimeError(f"the env's serve ended with status {code}")
        drops = httpx.get(f"{url}/stats").json()["drops"]
    groups = [
        {**g, "step": step}
        for step, batch in enumerate(trainer.batches[: scenario.batches], start=1)
        for g in batch
    ]
    items = env.load()
    share = sum(1 for i in items if LONG_MARK in i["question"]) / len(items)
    return Outcome(
        pace,
        groups,
        share,
        drops,
        runner.pacer.paced_total(),
        runner.pacer.paced_count,
        seconds,
        trainer.times[: scenario.batches],
        dict(env.spans),
    )


def _env(scenario: Scenario, pace: bool, server: str, api: str) -> tuple[LongTail, ResolvedConfig]:
    config = BaseEnvConfig(
        tokenizer_name="tiny",
        group_size=scenario.group_size,
        use_wandb=False,
        max_token_length=256,
        rollout_server_url=api,
        register_timeout=30,
        max_num_workers=scenario.workers,
        ensure_scores_are_not_same=False,
        pace_staleness=pace,
        total_steps=1_000_000,
        worker_timeout=60,
    )
    servers = [APIServerConfig(base_url=server, server_type="vllm", model_name="atropos-tiny")]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "serve")
    env = LongTail(config, servers, manager=resolved.manager)
    env.scenario = scenario
    env.spans = {}
    return env, resolved


def _published(trainer: ScriptedTrainer | None) -> int:
    return 0 if trainer is None else trainer.published


def _answer(prompt: str) -> str:
    """Right about half the time, so groups have mixed scores."""
    return "4" if len(prompt) % 2 else "5"
