"""Fail fast, say why: fatal errors stop a run at the first one; drops are reported while running;
serve stops when the trainer is done and sends its drop counts with its status polls."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import Counter

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from atropos.api import ApiConfig, create_app
from atropos.envs.runner.control import ControlClient
from atropos.envs.runner.groups import JsonlSink
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.runner.serve import ServeRunner
from atropos.envs.runner.watch import DropReport, FailureLog
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.errors import (
    FatalError,
    InferenceError,
    UnsupportedOperation,
    fatal_reason,
)
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing import free_port, serve_in_thread

from .synth import SynthEnv, resolved
from .test_runner import REGISTRATION


def test_configuration_errors_are_fatal_and_per_request_ones_are_not():
    assert InferenceError.from_status(404, "model 'x' not found").fatal
    assert "--openai.model_name" in str(InferenceError.from_status(404, "no such model"))
    assert InferenceError.from_status(401, "bad key").fatal
    assert not InferenceError.from_status(400, "prompt too long").fatal  # one item's prompt
    assert not InferenceError.from_status(503, "busy").fatal
    assert UnsupportedOperation("no token ids").fatal
    assert fatal_reason(ModuleNotFoundError("pip install 'atropos-rl[envs]'")) is not None
    wrapped = RuntimeError("scoring failed")
    wrapped.__cause__ = FatalError("no tokenizer")
    assert fatal_reason(wrapped) == "no tokenizer"
    assert fatal_reason(RuntimeError("item 3 broke")) is None


def test_a_tokenizer_that_cannot_load_is_fatal(tmp_path):
    try:
        load_tokenizer(str(tmp_path / "nothing-here"))
    except ValueError as err:
        assert fatal_reason(err) is not None and "--env.tokenizer_name" in str(err)
    else:
        raise AssertionError("loaded a tokenizer from an empty path")


def test_a_failure_is_logged_once_per_message_with_one_traceback_per_type(caplog):
    counts: Counter[str] = Counter()
    failures = FailureLog(counts)
    for i in range(50):
        try:
            raise RuntimeError(f"item {i % 2} broke")
        except RuntimeError as err:
            assert failures.record(err) is False
    records = [r for r in caplog.records if "broke" in r.getMessage()]
    assert counts["RuntimeError"] == 50
    assert len(records) == 2  # two distinct messages
    assert records[0].exc_info is not None and records[1].exc_info is None


def test_drop_report_speaks_at_the_first_crossing_then_every_30_s(caplog):
    now = [0.0]
    report = DropReport(clock=lambda: now[0])
    drops: Counter[str] = Counter()
    drops["identical_scores"] = 5
    assert report.check(drops, Counter(), 1) is None  # too few to judge
    drops["identical_scores"] = 40
    drops["too_short"] = 3
    now[0] = 2.0
    line = report.check(drops, Counter(), 2)
    assert line is not None and "dropped 96% of groups" in line
    assert "identical_scores 40" in line and "sent 2" in line
    drops["identical_scores"] += 100
    now[0] = 10.0
    assert report.check(drops, Counter(), 2) is None  # rate-limited
    now[0] = 33.0
    line = report.check(drops, Counter(), 3)
    assert line is not None and "identical_scores 100" in line and "last 31 s" in line
    drops["identical_scores"] += 1  # a healthy window: silence
    now[0] = 70.0
    assert report.check(drops, Counter(), 200) is None


def test_the_jsonl_file_is_created_with_the_first_group(tmp_path):
    sink = JsonlSink(tmp_path / "out.jsonl")
    sink.close()
    assert not (tmp_path / "out.jsonl").exists()
    sink = JsonlSink(tmp_path / "out.jsonl")
    sink.write({"tokens": [[1]]})
    sink.close()
    assert (tmp_path / "out.jsonl").read_text() == '{"tokens":[[1]]}\n'


class MissingExtra(SynthEnv):
    async def collect_trajectories(self, item):
        await asyncio.sleep(0.01)
        raise ImportError("the math rewards need math-verify: pip install 'atropos-rl[envs]'")


def test_process_stops_at_the_first_fatal_error_with_one_message(tmp_path, caplog):
    out = tmp_path / "synth.jsonl"
    cfg = resolved("process", total_steps=100, data_path_to_save_groups=str(out))
    env = MissingExtra(cfg.env, cfg.servers, manager=cfg.manager)
    runner = ProcessRunner(env, cfg)
    started = time.monotonic()
    assert asyncio.run(runner.run(show_progress=False)) == 1
    assert time.monotonic() - started < 5
    assert runner.failures["ImportError"] <= cfg.env.max_num_workers  # not 100 of them
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "pip install 'atropos-rl[envs]'" in errors[0].getMessage()
    assert errors[0].exc_info is None  # no traceback
    assert not out.exists()  # nothing made: no empty file


def test_process_summary_says_1_group(tmp_path, caplog):
    out = tmp_path / "synth.jsonl"
    cfg = resolved("process", total_steps=1, data_path_to_save_groups=str(out))
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
    assert asyncio.run(ProcessRunner(env, cfg).run(show_progress=False)) == 0
    assert f"wrote 1 group to {out}" in caplog.text


def test_a_server_never_reached_fails_the_call_after_server_wait():
    port = free_port()
    server = APIServerConfig(base_url=f"http://127.0.0.1:{port}/v1", server_type="vllm")
    config = ServerManagerConfig(server_wait=0.5, retry_backoff=0.01, health_check_interval=0.1)

    async def main() -> InferenceError:
        async with ServerManager([server], config) as manager:
            try:
                await manager.completion(prompt="hi", max_tokens=1)
            except InferenceError as err:
                return err
        raise AssertionError("the call succeeded")

    started = time.monotonic()
    err = asyncio.run(main())
    assert time.monotonic() - started < 5
    assert err.fatal and err.kind == "unavailable"
    assert "--openai.base_url" in str(err) and f":{port}/v1" in str(err)


def test_status_polls_carry_the_drop_and_failure_counts():
    bodies: list[dict] = []

    async def status_env(request: Request) -> JSONResponse:
        bodies.append(json.loads(await request.body()))
        return JSONResponse({"current_step": 0, "queue_size": 0})

    app = Starlette(routes=[Route("/status-env", status_env, methods=["GET"])])
    with serve_in_thread(app) as url:

        async def main() -> None:
            async with ControlClient(url) as api:
                await api.status(3)
                await api.status(3, Counter(identical_scores=7), Counter(timeout=1))

        asyncio.run(main())
    assert bodies == [
        {"env_id": 3},
        {"env_id": 3, "dropped": {"identical_scores": 7}, "failed": {"timeout": 1}},
    ]


def test_serve_stops_by_itself_when_the_trainer_reaches_its_last_step(tmp_path, caplog):
    with serve_in_thread(create_app(ApiConfig())) as url, httpx.Client(base_url=url) as c:
        c.post("/register", json={**REGISTRATION, "num_steps": 3})
        cfg = resolved(rollout_server_url=url, register_timeout=30)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ServeRunner(env, cfg, tmp_path)
        runner.status_interval = 0.05

        async def main() -> int:
            task = asyncio.create_task(runner.run())
            end = time.monotonic() + 20
            while not task.done() and time.monotonic() < end:
                await asyncio.to_thread(c.get, "/batch")  # a trainer taking batches
                await asyncio.sleep(0.05)
            return await asyncio.wait_for(task, 10)

        assert asyncio.run(main()) == 0
    # the trainer's num_steps (3) ends the run, not the env's total_steps (1000); the trainer
    # here keeps asking for batches, so a poll on a loaded machine may first see step 4
    reached = re.search(r"last step \((\d+) of 3\)", runner.ended)
    assert (reached and int(reached[1]) >= 3) or "its 3 steps need" in runner.ended
    assert "stopped (" in caplog.text
