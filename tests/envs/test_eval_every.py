"""`atropos env serve --env.eval_every N`: each N-th policy version the trainer publishes is
evaluated while rollouts go on, one evaluation at a time (a version due meanwhile is skipped and
counted), and the results reach the API stamped with the version (`/stats`, `/metrics`)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx

from atropos.api import ApiConfig, create_app
from atropos.envs.runner.evaluate import VersionEvals
from atropos.envs.runner.serve import ServeRunner
from atropos.inference.base import note_policy_version
from atropos.testing import FakeInferenceServer, serve_in_thread

from .arith import Addition, solver
from .test_policy_version import make
from .test_runner import REGISTRATION


class EvalDuringRollouts(Addition):
    """An evaluation that lasts until two more groups were handed to the sender (at most
    20 s): it can end early only if rollouts go on while it runs."""

    runner: ServeRunner

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        runner = self.runner
        start, deadline = runner.submitted, time.monotonic() + 20
        while runner.submitted < start + 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        metrics = await super().evaluate()  # on the servers' eval budget
        return {**metrics, "groups_during": float(runner.submitted - start)}


def wait_for(check: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def fake_trainer(url: str, runner: ServeRunner, versions: int, every: int) -> None:
    """Take a batch, publish its version, and go on once the env's poll has seen it (and,
    at a multiple of `every`, once that version's evaluation is in, taking batches meanwhile:
    the env's off-policy budget is a few groups here, `max_batches_offpolicy * batch_size /
    group_size` less those queued, and rollouts made between the trainer's last batch and the
    evaluation's start could fill it, leaving none for the evaluation to wait for: a run on a
    loaded machine once saw fewer than two groups during one)."""
    with httpx.Client(base_url=url, timeout=10) as c:
        c.post("/register", json=REGISTRATION)
        c.get("/batch")  # the trainer's first /batch opens env registration
        evals = lambda: runner.version_evals  # noqa: E731

        def draining(check: Any) -> bool:
            c.get("/batch")  # frees the env's off-policy budget (max_batches_offpolicy)
            return bool(check())

        wait_for(
            lambda: draining(lambda: evals() is not None and 0 in evals().done),
            "the baseline's evaluation",
        )
        for v in range(1, versions + 1):
            wait_for(lambda: c.get("/batch").json()["batch"] is not None, f"batch {v}")
            c.post("/policy_version", json={"version": v})
            wait_for(lambda: evals() is not None and evals().last == v, f"env seeing {v}")  # noqa: B023
            if v % every == 0:
                wait_for(lambda: draining(lambda: v in evals().done), f"evaluation of {v}")  # noqa: B023


def test_each_nth_version_is_evaluated_while_rollouts_go_on(tmp_path) -> None:
    with FakeInferenceServer(responder=solver) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            env, resolved = make(
                fake.base_url,
                mode="serve",
                env_cls=EvalDuringRollouts,
                rollout_server_url=url,
                register_timeout=30,
                ensure_scores_are_not_same=False,
                max_num_workers=2,
                eval_every=2,
                steps_per_eval=1,  # replaced by eval_every: never runs
            )
            runner = ServeRunner(env, resolved, tmp_path)
            runner.status_interval = 0.02
            env.runner = runner
            trainer = threading.Thread(target=fake_trainer, args=(url, runner, 6, 2), daemon=True)

            async def main() -> int:
                task = asyncio.create_task(runner.run())
                trainer.start()
                while trainer.is_alive():
                    await asyncio.sleep(0.05)
                runner.stopping.set()
                return await task

            assert asyncio.run(main()) == 0
            trainer.join(5)
            doc = httpx.get(f"{url}/stats").json()["envs"]["0"]
            text = httpx.get(f"{url}/metrics").text
    assert runner.version_evals is not None and runner.version_evals.done == [0, 2, 4, 6]
    evals = doc["evals"]
    assert [e["policy_version"] for e in evals] == [0, 2, 4, 6]  # the untrained one, then each 2nd
    assert all(e["metrics"]["groups_during"] >= 2 for e in evals)  # rollouts went on
    assert all({"eval/accuracy", "eval/mean_score"} <= set(e["metrics"]) for e in evals)
    assert all(e["skipped"] == 0 and e["seconds"] > 0 for e in evals)
    assert 'atropos_env_eval_policy_version{env="0"} 6' in text
    assert 'atropos_env_eval{env="0",metric="groups_during"}' in text
    assert 'atropos_env_evals_skipped_total{env="0"} 0' in text


class Gate:
    """An env whose evaluation waits for the test to open `gate`, and an API that keeps posts."""

    def __init__(self) -> None:
        self.env_id = 0
        self.last_eval_metrics: dict[str, Any] | None = None
        self.gate = asyncio.Event()
        self.report: int | None = None
        self.posts: list[tuple[int, dict[str, float], int]] = []

    async def evaluate(self) -> None:
        await self.gate.wait()
        if self.report is not None:  # the servers say which weights answered
            note_policy_version({"policy_version": self.report})
        self.last_eval_metrics = {"accuracy": 0.75, "note": "text is left out"}

    async def post_eval(
        self, env_id: int, version: int, metrics: dict[str, float], seconds: float, skipped: int
    ) -> None:
        self.posts.append((version, metrics, skipped))


def test_the_untrained_policy_is_evaluated_once_at_the_first_poll() -> None:
    async def main() -> list[int]:
        fake = Gate()
        fake.gate.set()
        evals = VersionEvals(fake, fake, every=3)
        evals.seen(0)  # the first poll, before the trainer published anything: the baseline
        await asyncio.wait_for(evals.task, 5)  # type: ignore[arg-type]
        for version in (0, 1, 2, 3):
            evals.seen(version)
        await asyncio.wait_for(evals.task, 5)  # type: ignore[arg-type]
        return evals.done

    assert asyncio.run(main()) == [0, 3]


def test_one_evaluation_at_a_time_the_rest_skipped_and_counted() -> None:
    async def main() -> tuple[VersionEvals, Gate]:
        fake = Gate()
        evals = VersionEvals(fake, fake, every=2)
        evals.seen(1)  # the first poll: nothing published since
        evals.seen(2)  # due: starts
        evals.seen(3)
        evals.seen(4)  # due while 2 runs: skipped
        evals.seen(9)  # jumps over 6 and 8: one more, skipped too
        fake.gate.set()
        await asyncio.wait_for(evals.task, 5)  # type: ignore[arg-type]
        evals.seen(10)  # due, none running: starts
        await asyncio.wait_for(evals.task, 5)  # type: ignore[arg-type]
        evals.seen(10)  # the same version again: nothing
        fake.report = 11  # the servers answered with older weights than the version published
        evals.seen(12)
        await asyncio.wait_for(evals.task, 5)  # type: ignore[arg-type]
        return evals, fake

    evals, fake = asyncio.run(main())
    assert evals.done == [2, 10, 11] and evals.skipped == 2  # stamped with what answered
    # (the first poll saw 1, not the untrained policy: an env started mid-run waits for 2)
    assert fake.posts[:2] == [(2, {"accuracy": 0.75}, 2), (10, {"accuracy": 0.75}, 2)]
