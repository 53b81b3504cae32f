"""The runners with a synthetic env: serve against a real API, process to files."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.envs.runner import run_loop
from atropos.envs.runner.deadline import Deadlines
from atropos.envs.runner.heap import FrozenHeap
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.runner.serve import ServeRunner, _overrides_cleanup
from atropos.testing import free_port, serve_in_thread

from .synth import SynthEnv, resolved

REGISTRATION = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 8,
    "max_token_len": 64,
    "checkpoint_dir": "",
    "save_checkpoint_interval": 2,
    "starting_step": 0,
    "num_steps": 1000,
}


class Trainer(threading.Thread):
    """A trainer client in a thread: registers, then drains batches until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.batches: list[list[dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as c:
            c.post("/register", json=REGISTRATION)
            while not self.stop.is_set():
                try:
                    batch = c.get("/batch").json()["batch"]
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if batch is None:
                    time.sleep(0.02)
                else:
                    self.batches.append(batch)


def test_serve_sends_stamped_groups_and_stops_cleanly(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        trainer = Trainer(url)
        trainer.start()
        cfg = resolved(rollout_server_url=url, steps_per_eval=2, register_timeout=30)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ServeRunner(env, cfg, tmp_path)
        runner.status_interval = 0.05

        async def main() -> int:
            task = asyncio.create_task(runner.run())
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(
                g["policy_version"] >= 2 for b in list(trainer.batches) for g in b
            ):
                await asyncio.sleep(0.05)
            runner.stopping.set()  # what SIGTERM does
            return await task

        code = asyncio.run(main())
        trainer.stop.set()
        trainer.join(5)
        assert code == 0
        groups = [g for b in trainer.batches for g in b]
        assert all(sum(len(g["tokens"]) for g in b) == 8 for b in trainer.batches)
        assert all(g["env_id"] == 0 and len(g["group_id"]) == 32 for g in groups)
        assert all(isinstance(g["policy_version"], int) for g in groups)
        assert max(g["policy_version"] for g in groups) >= 1  # stamped with the step seen
        assert env.evals >= 2  # every 2 steps, never skipped
        stats = httpx.get(f"{url}/stats").json()["envs"]["0"]
        assert stats["connected"] is False  # disconnected at shutdown
        assert runner.sender.stats.spooled == 0


def test_serve_waits_for_the_trainer_with_a_deadline(tmp_path, caplog):
    with serve_in_thread(create_app(ApiConfig())) as url:
        cfg = resolved(rollout_server_url=url, register_timeout=1.5)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        code = asyncio.run(ServeRunner(env, cfg, tmp_path).run())
        assert code == 1
        assert "waiting to register" in caplog.text and "gave up registering" in caplog.text


def test_offpolicy_pacing_pauses_admission_without_cancelling(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        with httpx.Client(base_url=url) as c:
            c.post("/register", json=REGISTRATION)
            c.get("/batch")  # started, but no trainer drains
        cfg = resolved(rollout_server_url=url, max_batches_offpolicy=2)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ServeRunner(env, cfg, tmp_path)
        runner.status_interval = 0.05

        async def main() -> None:
            task = asyncio.create_task(runner.run())
            await asyncio.sleep(2.0)
            runner.stopping.set()
            await task

        asyncio.run(main())
        queued = httpx.get(f"{url}/status").json()["queue_size"]
        # budget: 2 batches x 8 sequences / group of 2 = 8 groups, plus what was in flight
        assert 8 <= queued <= 8 + 8
        assert runner.failures == {}


async def until(condition, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


def test_api_outage_mid_run_loses_nothing(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = f"sqlite:{tmp_path / 'api.db'}"
    cfg = resolved(rollout_server_url=url, max_batches_offpolicy=0)
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
    runner = ServeRunner(env, cfg, tmp_path)
    runner.status_interval = 0.05
    runner.sender.replay_every = 0.2
    runner.sender.retries = 1
    runner.sender.backoff = 0.01

    async def main() -> None:
        task = asyncio.create_task(runner.run())
        # the outage starts once groups flow (registering may itself wait for the API to bind)
        await until(lambda: runner.submitted > 0)
        down.set()
        await asyncio.to_thread(api_stopped.wait, 10)
        await until(lambda: runner.sender.stats.spooled > 0)  # rollouts go on: they spool
        up.set()
        await asyncio.to_thread(api_back.wait, 10)
        await until(lambda: runner.sender.stats.replayed > 0 and len(runner.sender.spool) == 0)
        runner.stopping.set()
        await task

    down, up = threading.Event(), threading.Event()
    api_stopped, api_back = threading.Event(), threading.Event()

    def api_lifecycle() -> None:
        with serve_in_thread(create_app(ApiConfig(store=store)), port=port):
            with httpx.Client(base_url=url) as c:
                c.post("/register", json={**REGISTRATION, "batch_size": 2})
                c.get("/batch")
            down.wait(30)
        api_stopped.set()
        up.wait(30)
        with serve_in_thread(create_app(ApiConfig(store=store)), port=port):
            api_back.set()
            done.wait(30)

    done = threading.Event()
    thread = threading.Thread(target=api_lifecycle, daemon=True)
    thread.start()
    asyncio.run(main())
    assert runner.sender.stats.spooled > 0 and runner.sender.stats.replayed > 0
    done.set()
    thread.join(10)
    with (
        serve_in_thread(create_app(ApiConfig(store=store))) as check,
        httpx.Client(base_url=check) as c,
    ):
        queued = c.get("/status").json()["queue_size"]
        ids = []
        while (batch := c.get("/batch").json()["batch"]) is not None:
            ids += [g["tokens"][0][0] for g in batch]
    sent_items = runner.sender.stats.sent
    assert queued == len(ids) == sent_items
    assert len(set(ids)) == len(ids)  # nothing twice
    assert set(range(1, max(ids) + 1)) <= set(ids)  # no item between was lost


def test_process_writes_jsonl_html_metrics_and_survives_a_bad_item(tmp_path):
    out = tmp_path / "out" / "synth.jsonl"
    cfg = resolved(
        "process", total_steps=12, data_path_to_save_groups=str(out), rollout_server_api_key="s3"
    )
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)

    async def main() -> int:
        await env.setup()
        env.fail_every = 5
        env.setup = _noop  # keep the failure setting
        return await ProcessRunner(env, cfg).run(show_progress=False)

    assert asyncio.run(main()) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 12
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert metrics["groups"] == 12 and metrics["failed"]["RuntimeError"] >= 2
    page = out.with_suffix(".html").read_text()
    assert "\\u003cb\\u003e1\\u003c/b\\u003e" in page and "<b>1</b>" not in page  # escaped
    saved = out.with_suffix(".config.yaml").read_text()
    assert "total_steps: 12" in saved and "s3" not in saved  # secrets never reach the disk


async def _noop() -> None:
    return None


def test_process_runs_backlog_items_before_new_ones(tmp_path):
    out = tmp_path / "synth.jsonl"
    cfg = resolved("process", total_steps=4, data_path_to_save_groups=str(out), max_num_workers=1)

    class FollowUps(SynthEnv):
        async def collect_trajectories(self, item):
            group, _ = await super().collect_trajectories(abs(item))
            return group, ([-item] if item > 0 else [])  # each item asks for a follow-up

    env = FollowUps(cfg.env, cfg.servers, manager=cfg.manager)
    assert asyncio.run(ProcessRunner(env, cfg).run(show_progress=False)) == 0
    firsts = [json.loads(line)["tokens"][0][0] for line in out.read_text().splitlines()]
    assert firsts == [1, 1, 2, 2]  # item 1, its follow-up, item 2, its follow-up


def test_process_stops_when_every_item_fails_instead_of_sampling_forever(tmp_path, caplog):
    out = tmp_path / "synth.jsonl"
    cfg = resolved("process", total_steps=5, data_path_to_save_groups=str(out), max_num_workers=2)
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
    runner = ProcessRunner(env, cfg)
    runner.barren_limit = 6

    async def main() -> int:
        await env.setup()
        env.fail_every = 1  # every item raises
        env.setup = _noop
        return await runner.run(show_progress=False)

    assert asyncio.run(main()) == 1
    assert runner.failures["RuntimeError"] >= 6
    assert "gave no group to write" in caplog.text


def test_a_sender_backlog_pauses_admission(tmp_path):
    cfg = resolved(rollout_server_url="http://127.0.0.1:9", max_batches_offpolicy=0)
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
    runner = ServeRunner(env, cfg, tmp_path)
    runner.last_status = time.monotonic()  # a fresh status: only the backlog may pause us
    runner.sender_backlog = 4
    assert runner.capacity() == cfg.env.max_num_workers
    for i in range(4):  # made faster than sent (the sender is not even started)
        runner.sender.submit({"tokens": [[i]]})
    assert runner.capacity() == 0  # wait for the sender instead of piling up groups


def test_a_rollout_past_worker_timeout_is_counted_and_dropped(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        trainer = Trainer(url)
        trainer.start()
        cfg = resolved(rollout_server_url=url, worker_timeout=0.05, register_timeout=30)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        env.rollout_seconds = 5.0
        runner = ServeRunner(env, cfg, tmp_path)
        runner.status_interval = 0.05

        async def main() -> int:
            task = asyncio.create_task(runner.run())
            await until(lambda: runner.failures["timeout"] >= 8)
            runner.stopping.set()
            return await task

        assert asyncio.run(main()) == 0
        trainer.stop.set()
        trainer.join(5)
    assert runner.sender.stats.sent == 0 and not trainer.batches


def test_frozen_heap_freezes_on_entry_and_once_more_when_settled():
    if gc.get_freeze_count():
        pytest.skip("something else froze the heap")
    threshold = gc.get_threshold()
    with FrozenHeap(young=5000) as heap:
        assert gc.get_threshold() == (max(threshold[0], 5000), *threshold[1:])
        frozen = gc.get_freeze_count()
        assert frozen > 0
        later = [[i] for i in range(1000)]  # what the first rollout loads lazily
        heap.settle()
        assert gc.get_freeze_count() >= frozen + len(later)
        more = [[i] for i in range(1000)]
        heap.settle()  # only once
        assert gc.get_freeze_count() < frozen + len(later) + len(more)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == threshold


@pytest.mark.parametrize("plain", [False, True])
def test_run_loop_prefers_uvloop(monkeypatch, plain):
    uvloop = pytest.importorskip("uvloop")
    monkeypatch.setenv("ATROPOS_ASYNCIO", "1" if plain else "0")

    async def main() -> int:
        loop = asyncio.get_running_loop()
        return 1 if isinstance(loop, uvloop.Loop) else 2

    assert run_loop(main()) == (2 if plain else 1)


def test_jsonl_sink_writes_one_flushed_utf8_line_per_group(tmp_path):
    from atropos.envs.runner.groups import JsonlSink

    sink = JsonlSink(tmp_path / "g.jsonl")
    groups = [
        {"tokens": [[1, 2]], "scores": [0.5], "messages": [[{"content": "é <b>"}]]},
        {"tokens": [[2**70]], "scores": [1.0]},  # too big for msgspec: json.dumps writes it
    ]
    for g in groups:
        sink.write(g)
        assert sink.path.read_bytes().count(b"\n") == sink.count  # flushed as written
    sink.close()
    raw = sink.path.read_bytes()
    assert "é <b>".encode() in raw
    assert [json.loads(line) for line in raw.splitlines()] == groups


def test_deadlines_time_out_late_awaits_with_one_timer_and_leave_other_cancels_alone():
    deadlines = Deadlines(0.05)

    async def one(forever: bool) -> str:
        task = asyncio.current_task()
        assert task is not None
        try:
            await deadlines.within(task, time.monotonic(), asyncio.sleep(3600 if forever else 0))
        except TimeoutError:
            return "timeout"
        return "done"

    async def main() -> None:
        watch = asyncio.create_task(deadlines.watch())
        started = time.monotonic()
        assert await asyncio.gather(one(True), one(False), one(True)) == [
            "timeout",
            "done",
            "timeout",
        ]
        assert time.monotonic() - started < 30  # a limit of 0.05 s, with a wide margin
        stopped = asyncio.create_task(one(True))
        await asyncio.sleep(0.01)
        stopped.cancel()  # a shutdown's cancel stays a cancel
        with pytest.raises(asyncio.CancelledError):
            await stopped
        watch.cancel()
        assert not deadlines._due and not deadlines._expired

    asyncio.run(main())


def test_serve_calls_cleanup_only_for_an_env_that_has_its_own():
    class Cleaning(SynthEnv):
        async def cleanup(self) -> None:
            return None

    assert not _overrides_cleanup(SynthEnv.__new__(SynthEnv))  # the base's no-op: skipped
    assert _overrides_cleanup(Cleaning.__new__(Cleaning))
