"""Groups are stamped with the lowest `policy_version` the inference server reported for them.

The fake inference server reports a version when asked to (`policy_version=`), as our local
server does; without one, serve mode falls back to the trainer step at the rollout's start and
process mode stamps nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.runner.serve import ServeRunner
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.testing import FakeInferenceServer, serve_in_thread

from .arith import Addition, solver
from .ported_env import PortedEnv
from .test_runner import Trainer


def make(
    url: str,
    mode: str = "process",
    server: dict | None = None,
    manager: dict | None = None,
    env_cls: type = Addition,
    **env,
):
    config = BaseEnvConfig(
        tokenizer_name="tiny", group_size=4, use_wandb=False, max_token_length=256, **env
    )
    servers = [
        APIServerConfig(
            base_url=url, server_type="vllm", model_name="atropos-tiny", **(server or {})
        )
    ]
    resolved = ResolvedConfig(
        config,
        servers,
        ServerManagerConfig(**(manager or {})),
        mode,  # type: ignore[arg-type]
    )
    return env_cls(config, servers, manager=resolved.manager), resolved


def process(env, resolved, out) -> list[dict]:
    assert asyncio.run(ProcessRunner(env, resolved).run(show_progress=False)) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("token_api", ["generate", "completions"])
def test_process_groups_carry_the_servers_version(tmp_path, token_api):
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=solver, policy_version=7) as fake:
        env, resolved = make(
            fake.base_url,
            server={"vllm_token_api": token_api},
            total_steps=3,
            data_path_to_save_groups=str(out),
            ensure_scores_are_not_same=False,
        )
        groups = process(env, resolved, out)
    assert len(groups) == 3 and all(g["policy_version"] == 7 for g in groups)


def test_process_without_a_reported_version_stamps_none(tmp_path):
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=solver) as fake:
        env, resolved = make(
            fake.base_url,
            total_steps=2,
            data_path_to_save_groups=str(out),
            ensure_scores_are_not_same=False,
        )
        groups = process(env, resolved, out)
    assert len(groups) == 2 and all("policy_version" not in g for g in groups)


def test_a_group_split_over_requests_gets_the_lowest_version(tmp_path):
    """n=4 with max_n_completions=2: two requests, answered by versions 11 then 10."""
    versions = itertools.count(11, -1)
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=solver, policy_version=lambda: next(versions)) as fake:
        env, resolved = make(
            fake.base_url,
            manager={"max_n_completions": 2},
            total_steps=1,
            max_num_workers=1,
            data_path_to_save_groups=str(out),
            ensure_scores_are_not_same=False,
        )

        async def rollouts() -> list:
            await env.setup()
            try:
                messages = env.prompt(await env.get_next_item())
                return await env.generate(messages, n=4)
            finally:
                await env.server.aclose()

        made = asyncio.run(rollouts())
        # each rollout: the lowest version of the call that made it (conservative: a call split
        # into several requests reports the oldest weights among them)
        assert [r.policy_version for r in made] == [10, 10, 10, 10]
        env, resolved = make(
            fake.base_url,
            manager={"max_n_completions": 2},
            total_steps=1,
            max_num_workers=1,
            data_path_to_save_groups=str(out),
            ensure_scores_are_not_same=False,
        )
        [group] = process(env, resolved, out)
    assert group["policy_version"] == 8  # this group's two requests got 9 and 8


def test_an_upstream_style_env_is_stamped_by_the_runner(tmp_path):
    """A BaseEnv that builds its own groups (no policy_version in them) through
    `managed_server`: the runner stamps what the server reported for the rollout's calls."""
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(policy_version=5) as fake:
        env, resolved = make(
            fake.base_url,
            env_cls=PortedEnv,
            total_steps=2,
            data_path_to_save_groups=str(out),
            ensure_scores_are_not_same=False,
        )
        groups = process(env, resolved, out)
    assert len(groups) == 2 and all(g["policy_version"] == 5 for g in groups)


def serve_until(fake_url: str, url: str, trainer, batches: int, tmp_path, poll: float, **env):
    """Serve an Addition env against the API at `url` (the fake server at `fake_url`) until
    `trainer` (a thread, started here) has `batches` batches; the trainer is stopped after.
    Returns the runner, ended."""
    trainer.start()
    env, resolved = make(
        fake_url,
        mode="serve",
        rollout_server_url=url,
        register_timeout=30,
        ensure_scores_are_not_same=False,
        **env,
    )
    runner = ServeRunner(env, resolved, tmp_path)
    runner.status_interval = poll

    async def main() -> int:
        task = asyncio.create_task(runner.run())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(trainer.batches) < batches:
            await asyncio.sleep(0.05)
        runner.stopping.set()
        return await task

    try:
        assert asyncio.run(main()) == 0
    finally:
        trainer.stop.set()
        trainer.join(5)
    return runner


def run_serve(fake_kwargs: dict, tmp_path) -> list[dict]:
    """Serve an Addition env against a real API until a few groups reached the trainer."""
    with FakeInferenceServer(responder=solver, **fake_kwargs) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            trainer = Trainer(url)
            serve_until(fake.base_url, url, trainer, 2, tmp_path, 0.05, max_num_workers=2)
    return [g for b in trainer.batches for g in b]


def test_serve_groups_carry_the_servers_version_not_the_step(tmp_path):
    groups = run_serve({"policy_version": 42}, tmp_path)
    assert groups and all(g["policy_version"] == 42 for g in groups)


def test_serve_falls_back_to_the_step_when_the_server_reports_none(tmp_path):
    groups = run_serve({}, tmp_path)
    steps = [g["policy_version"] for g in groups]  # the trainer step when each rollout started
    assert steps and all(isinstance(v, int) and 0 <= v <= len(groups) for v in steps)
    assert min(steps) == 0


def test_versions_from_tasks_started_inside_the_block_are_collected():
    from atropos.inference.base import PolicyVersions, note_policy_version

    async def call(version: int) -> None:
        await asyncio.sleep(0)
        note_policy_version({"policy_version": version})

    async def main() -> tuple[int | None, int | None]:
        note_policy_version({"policy_version": 1})  # outside any block: ignored
        with PolicyVersions() as seen:
            await asyncio.gather(call(4), call(3), call(9))
            note_policy_version({"policy_version": True})  # not an int version
            note_policy_version([{"policy_version": 6}, {"other": 1}])
        with PolicyVersions() as empty:
            note_policy_version({"choices": []})
        return seen.lowest, empty.lowest

    assert asyncio.run(main()) == (3, None)


def test_threads_do_not_see_each_others_versions():
    from atropos.inference.base import PolicyVersions, note_policy_version

    seen: dict[str, int | None] = {}

    def worker(name: str, version: int) -> None:
        with PolicyVersions() as box:
            note_policy_version({"policy_version": version})
            time.sleep(0.01)
        seen[name] = box.lowest

    threads = [threading.Thread(target=worker, args=(n, v)) for n, v in (("a", 5), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": 5, "b": 2}


class SlowSyncTrainer(threading.Thread):
    """A trainer that publishes like ours: after each batch it trains, then takes `sync` seconds
    to put the new weights on the server (`weights["v"]`), then says so (`POST /policy_version`).
    Every answer of the server names the weights that wrote it (`v<N>`), so each group's true
    version can be read back from its tokens."""

    def __init__(self, url: str, weights: dict[str, int], sync: float, announce: bool) -> None:
        super().__init__(daemon=True)
        self.url, self.weights, self.sync, self.announce = url, weights, sync, announce
        self.batches: list[list[dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from .test_runner import REGISTRATION

        with httpx.Client(base_url=self.url, timeout=10) as c:
            c.post("/register", json=REGISTRATION).raise_for_status()
            if self.announce:
                c.post("/policy_version", json={"version": 0}).raise_for_status()
            while not self.stop.is_set():
                answer = c.get("/batch").json()
                if answer["batch"] is None:
                    time.sleep(0.02)
                    continue
                self.batches.append(answer["batch"])
                step = len(self.batches)
                time.sleep(self.sync)  # the step and the sync: old weights serve meanwhile
                self.weights["v"] = step
                if self.announce:
                    c.post("/policy_version", json={"version": step}).raise_for_status()


def true_versions(tmp_path, announce: bool) -> list[tuple[int, int]]:
    """(stamped, generated-by) for every group a serve run sent while a slow trainer synced."""
    from atropos.inference.tokenizer import load_tokenizer

    weights = {"v": 0}
    with FakeInferenceServer(responder=lambda prompt: f"v{weights['v']}", latency=0.02) as fake:
        with serve_in_thread(create_app(ApiConfig())) as url:
            trainer = SlowSyncTrainer(url, weights, sync=0.4, announce=announce)
            # a short queue (max_batches_offpolicy 1): later batches hold later rollouts
            serve_until(fake.base_url, url, trainer, 6, tmp_path, 0.02, max_num_workers=4,
                        max_batches_offpolicy=1)  # fmt: skip
    tokenizer = load_tokenizer("tiny")
    found = []
    for group in (g for b in trainer.batches for g in b):
        texts = [tokenizer.decode(t, skip_special_tokens=True) for t in group["tokens"]]
        made_by = min(int(v) for text in texts for v in re.findall(r"v(\d+)", text))
        found.append((group["policy_version"], made_by))
    return found


def test_no_group_is_stamped_ahead_of_the_weights_that_generated_it(tmp_path):
    """The server reports no version (as vLLM): groups get the version the trainer last
    published when their rollout started, never the step of a batch whose weights are not on
    the server yet."""
    found = true_versions(tmp_path, announce=True)
    assert len(found) >= 8
    ahead = [(stamped, made) for stamped, made in found if stamped > made]
    assert not ahead, f"groups stamped ahead of their weights (stamped, generated by): {ahead}"
    assert max(made for _, made in found) >= 2  # the weights did move during the run


def test_a_trainer_that_never_publishes_leaves_upstreams_step(tmp_path):
    """atroposlib's trainer never says what it published: the API's step is all there is, and
    it runs ahead of the weights during a sync (why our trainer says)."""
    found = true_versions(tmp_path, announce=False)
    assert len(found) >= 8
    assert any(stamped > made for stamped, made in found)
