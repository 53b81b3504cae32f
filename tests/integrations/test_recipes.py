"""The recipes of docs/integrations.md, checked with the conformance kit (no GPU).

Each test reproduces one integrator's documented call pattern in a small script: the fields
it registers, how it polls and backs off, its leases and acks, the versions it reports; as it
ships (raw HTTP, as the integrator does it: httpx in place of `requests`, same bodies, same
waits) and as the recipe sets it up (through `atropos.client` where the recipe uses it). The
kit (`atropos.testing.trainer_conformance`) plays the API and reports every rule broken.

Sources read for each pattern (stored snapshots, not live pages):

- axolotl: `axolotl-ai-cloud/plugin-atropos` @ 83fcafd (and its history),
  `src/plugin_atropos/plugin.py` (`post_trainer_create`), `src/plugin_atropos/datasets.py`
  (`get_dataset`), `examples/*.yaml`;
- verl: `verl-project/verl-recipe` @ 48ea0a7, `atropos/atropos_client.py`,
  `atropos/atropos_ray_trainer.py` (`fit`), `atropos/generate_proxy.py`;
- Tinker: `NousResearch/tinker-atropos`, `tinker_atropos/trainer.py` @ 0011b8a,
  `tinker_atropos/config.py` @ 74c6394;
- SkyRL: `NovaSky-AI/SkyRL` @ a956457 has no Atropos integration; its pattern for outside
  environment frameworks is a `GeneratorInterface` (`skyrl/train/generators/base.py`; the
  verifiers one in `examples/train_integrations/verifiers/verifiers_generator.py`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from atropos.client import AsyncTrainerClient, TrainerClient
from atropos.rewards.group import group_advantages
from atropos.testing.trainer_conformance import ConformanceApi, Report, check_trainer

GROUP = 4  # the kit's groups: generations per prompt


def raw_register(url: str, payload: dict[str, Any], swallow: bool = False) -> None:
    """`POST /register` with a JSON body, as `requests.post(url, json=payload)` sends it."""
    try:
        httpx.post(f"{url}/register", json=payload, timeout=10).raise_for_status()
    except httpx.HTTPError:
        if not swallow:  # axolotl prints the error and trains on
            raise


def raw_poll(url: str, sleep: float, stop: threading.Event | None = None) -> list[Any] | None:
    """A plain `GET /batch` until `batch` is not null, sleeping `sleep` s after each empty
    answer (axolotl: 1 s, Tinker: 1 s, verl: `poll_interval` 2 s)."""
    while stop is None or not stop.is_set():
        batch = httpx.get(f"{url}/batch", timeout=10).json().get("batch")
        if batch is not None:
            return list(batch)
        time.sleep(sleep)
    return None


# ----- axolotl: plugin-atropos ------------------------------------------------------------------


@dataclass
class AxolotlCfg:
    """The axolotl config keys the plugin reads (`cfg.trl.num_generations` as `num_generations`)."""

    num_generations: int = GROUP
    micro_batch_size: int = 2 * GROUP  # sequences per device per micro-step (TRL's batch)
    gradient_accumulation_steps: int = 2
    world_size: int = 1
    sequence_len: int = 2048
    max_steps: int = 2
    save_steps: int = 10
    output_dir: str = "./outputs"
    wandb_project: str | None = "atropos"
    wandb_run_group: str | None = None
    atropos_starting_step: int = 0

    @property
    def per_step(self) -> int:
        """Sequences one optimizer step trains on."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.world_size


# `post_trainer_create`'s batch_size: at f2d6cc5 and before (what docs/trainer-contract.md
# quotes), then from 87e066d to HEAD (83fcafd, 2025-07-17)
AXOLOTL_BATCH_SIZE = {
    "f2d6cc5": lambda cfg: cfg.num_generations,
    "83fcafd": lambda cfg: cfg.num_generations * cfg.gradient_accumulation_steps * cfg.world_size,
}


def axolotl_registration(cfg: AxolotlCfg, commit: str = "83fcafd") -> dict[str, Any]:
    """`AtroposPlugin.post_trainer_create`'s body at `commit`."""
    return {
        "wandb_group": cfg.wandb_run_group or "default",
        "wandb_project": cfg.wandb_project,
        "batch_size": AXOLOTL_BATCH_SIZE[commit](cfg),
        "max_token_len": cfg.sequence_len,
        "starting_step": cfg.atropos_starting_step,
        "checkpoint_dir": cfg.output_dir,
        "save_checkpoint_interval": cfg.save_steps,
        "num_steps": cfg.max_steps,
    }


def run_axolotl(url: str, cfg: AxolotlCfg, commit: str, done: threading.Event) -> None:
    """Register (errors printed, not raised), then the data provider's loop: `get_data` polls a
    plain `GET /batch`, sleeping 1 s after an empty answer; the worker waits `fetch_delay` 0.5 s
    between fetches. No lease, no ack, no `POST /policy_version`."""
    raw_register(url, axolotl_registration(cfg, commit), swallow=True)
    while not done.is_set():
        if raw_poll(url, sleep=1.0, stop=done) is None:
            return
        time.sleep(0.5)


def check_axolotl(cfg: AxolotlCfg, commit: str = "83fcafd") -> Report:
    options = {"expect_batch_size": cfg.per_step, "require_publish": False, "empty_polls": 1}
    with ConformanceApi(batches=2, group_size=cfg.num_generations, **options) as api:
        run_axolotl(api.url, cfg, commit, api.done)
        return api.report()


@pytest.mark.parametrize(("commit", "sent"), [("f2d6cc5", 4), ("83fcafd", 8)])
def test_axolotl_batch_size_is_flagged_unless_micro_batch_is_one_group(
    commit: str, sent: int
) -> None:
    """micro_batch_size 8 (two prompts' groups of 4) x gradient_accumulation_steps 2: 16
    sequences per optimizer step; the plugin registers 4 (early) or 8 (HEAD)."""
    report = check_axolotl(AxolotlCfg(), commit)
    assert report.broken == {"batch_size"}, report
    (violation,) = report.violations
    assert f"batch_size {sent}, expected 16" in violation.message
    assert violation.call is not None and violation.call.path == "/register"


def test_axolotl_recipe_micro_batch_of_one_group_conforms() -> None:
    """The recipe: micro_batch_size = trl.num_generations (as every shipped example sets it),
    so HEAD's num_generations x gradient_accumulation_steps x world_size is the sequences per
    optimizer step."""
    cfg = AxolotlCfg(micro_batch_size=GROUP)
    report = check_axolotl(cfg)
    assert report.ok, report
    assert report.batches_served == 2
    sizes = {c.body["batch_size"] for c in report.calls if c.path == "/register"}
    assert sizes == {cfg.per_step} == {8}


def test_axolotl_without_wandb_project_is_never_registered() -> None:
    """`wandb_project` unset sends null: the API refuses the body (422), the plugin only prints
    it, and every `GET /batch` then comes before a registration."""
    cfg = AxolotlCfg(wandb_project=None)
    with ConformanceApi(batches=1, require_publish=False) as api:
        raw_register(api.url, axolotl_registration(cfg), swallow=True)
        answer = httpx.get(f"{api.url}/batch", timeout=10).json()
        report = api.report()
    assert answer["batch"] == [] and answer["status"] == "error"
    assert report.broken == {"valid_body", "register_first"}, report


# ----- verl: verl-recipe's atropos recipe -----------------------------------------------------


@dataclass
class VerlCfg:
    """The Hydra keys `RayAtroposTrainer.fit` reads to register."""

    train_batch_size: int = 2  # prompts per step (data.train_batch_size)
    rollout_n: int = GROUP  # actor_rollout_ref.rollout.n (GROUP_SIZE)
    max_prompt_length: int = 512
    max_response_length: int = 1536
    total_training_steps: int = 2
    save_freq: int = 10
    default_local_dir: str = "checkpoints/verl-atropos"
    project_name: str = "verl-atropos"
    poll_interval: float = 2.0  # AtroposClient.poll_batch's default


def verl_registration(cfg: VerlCfg) -> dict[str, Any]:
    return {
        "wandb_group": "default",
        "wandb_project": cfg.project_name,
        "batch_size": cfg.train_batch_size * cfg.rollout_n,  # prompts x group_size
        "max_token_len": cfg.max_prompt_length + cfg.max_response_length + 1,
        "checkpoint_dir": cfg.default_local_dir,
        "save_checkpoint_interval": cfg.save_freq,
        "starting_step": 0,
        "num_steps": cfg.total_training_steps,
    }


def run_verl_as_merged(url: str, cfg: VerlCfg) -> None:
    """`fit`: register, then per step one `poll_batch` (plain `GET /batch`, 2 s after an empty
    answer); weights go to verl's internal vLLM by `update_weights()`, never reported."""
    raw_register(url, verl_registration(cfg))
    for _ in range(cfg.total_training_steps):
        raw_poll(url, sleep=cfg.poll_interval)


def run_verl_recipe(url: str, cfg: VerlCfg) -> None:
    """The recipe: the same registration through `TrainerClient`; the initial
    `update_weights()` reported as version 0; per step a leased batch, the step's
    `update_weights()` reported as its step, the batch acknowledged once a checkpoint covers
    it (at `save_freq` and on the last step)."""
    with TrainerClient(url, patience=10) as client:
        client.wait_ready()
        client.register(**verl_registration(cfg))
        client.published(0)  # after the first checkpoint_manager.update_weights()
        unacked: list[str] = []
        for step in range(1, cfg.total_training_steps + 1):
            batch = client.next_batch(lease=3600, within=30)
            assert batch is not None and batch.batch_id is not None
            assert sum(len(g.tokens) for g in batch.groups) == cfg.train_batch_size * cfg.rollout_n
            unacked.append(batch.batch_id)
            # ... sleep_replicas(), old/ref logprobs, GRPO update, then update_weights():
            client.published(step)
            if step % cfg.save_freq == 0 or step == cfg.total_training_steps:
                for batch_id in unacked:  # _save_checkpoint() covered them
                    client.ack(batch_id)
                unacked.clear()


def test_verl_as_merged_conforms_but_never_reports_versions() -> None:
    cfg = VerlCfg()
    options = {"batches": cfg.total_training_steps, "empty_polls": 1}
    expected = cfg.train_batch_size * cfg.rollout_n
    shipped = check_trainer(
        lambda url: run_verl_as_merged(url, cfg), expect_batch_size=expected, **options
    )
    assert shipped.broken == {"publish"}, shipped
    quiet = check_trainer(
        lambda url: run_verl_as_merged(url, cfg), require_publish=False, **options
    )
    assert quiet.ok, quiet


def test_verl_recipe_through_the_client_conforms() -> None:
    cfg = VerlCfg(poll_interval=0.0)
    report = check_trainer(
        lambda url: run_verl_recipe(url, cfg),
        batches=cfg.total_training_steps,
        expect_batch_size=cfg.train_batch_size * cfg.rollout_n,
        expect_max_token_len=cfg.max_prompt_length + cfg.max_response_length + 1,
        require_lease=True,
    )
    assert report.ok, report
    assert report.versions == [0, 1, 2]


def complete_tiny(base: str, max_tokens: int) -> None:
    body = {"model": "atropos-tiny", "prompt": "hi", "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(f"{base}/completions", json={**body, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text


def test_verl_proxy_pause_is_met_by_client_paused() -> None:
    """verl's trainer posts the generate proxy's `/pause` before `sleep_replicas()` (in-flight
    requests drain first, new ones wait) and `/resume` in a `finally` after `update_weights()`.
    `TrainerClient.paused()` does the same on the servers: a request in flight when the block
    starts is drained, not held; one started inside completes only after the block;
    an error inside still resumes generation."""
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server(max_model_len=512) as server:
        client = TrainerClient("http://127.0.0.1:1", servers=server)
        complete_tiny(server, 2)  # warm: the first request pays for the model's first steps
        finished: dict[str, float] = {}

        def ask(name: str, max_tokens: int) -> None:
            complete_tiny(server, max_tokens)
            finished[name] = time.monotonic()

        before = threading.Thread(target=ask, args=("in flight", 200))
        before.start()
        time.sleep(0.3)  # generating by now: 200 tokens take seconds on the CPU
        asked = time.monotonic()
        with client.paused(timeout=60):  # sleep_replicas() ... update_weights()
            entered = time.monotonic()
            inside = threading.Thread(target=ask, args=("started inside", 2))
            inside.start()
            time.sleep(0.5)
            assert "started inside" not in finished  # held while the GPU is the trainer's
            left = time.monotonic()
        before.join(60)
        inside.join(60)
        # nothing completes while the GPU is the trainer's: the request in flight when the pause
        # was asked was drained before the block began (paused() waited for it), or, when a
        # loaded machine had not started it yet, it was held like a new one until the block left
        # (an idle machine may even finish it before the pause is asked: nothing to drain then).
        # `finished` is when its thread read the answer, which may come a moment after the
        # server finished it and `paused()` returned (a full run here saw 0.25 ms): drained
        # means read within 0.2 s of the block's start, held means read after its end (0.5 s)
        drained = finished["in flight"] <= entered + 0.2
        assert drained or finished["in flight"] >= left, (asked, entered, left, finished)
        assert finished["started inside"] >= left  # completed only after the block
        with pytest.raises(RuntimeError, match="training crashed"), client.paused(timeout=60):
            raise RuntimeError("training crashed")
        complete_tiny(server, 2)  # resumed on the error path, as verl's `finally`
        client.close()


# ----- Tinker: tinker-atropos and Tinker-style clients -------------------------------------------


@dataclass
class TinkerCfg:
    """`TinkerAtroposConfig`'s fields the trainer registers with (`env.*`, `tinker.*`)."""

    batch_size: int = 2 * GROUP  # env.batch_size: sequences (default 128 with group_size 16)
    group_size: int = GROUP
    max_token_trainer_length: int = 2048
    checkpoint_dir: str = "./temp/"
    save_checkpoint_interval: int = 0
    total_steps: int = 2
    wandb_project: str = "atropos-tinker"
    wandb_group: str = "tinker-run"


def tinker_registration(cfg: TinkerCfg) -> dict[str, Any]:
    return {
        "wandb_project": cfg.wandb_project,
        "wandb_group": cfg.wandb_group,
        "batch_size": cfg.batch_size,
        "max_token_len": cfg.max_token_trainer_length,
        "starting_step": 0,
        "checkpoint_dir": cfg.checkpoint_dir,
        "save_checkpoint_interval": cfg.save_checkpoint_interval,
        "num_steps": cfg.total_steps,
    }


def run_tinker_as_shipped(url: str, cfg: TinkerCfg) -> None:
    """`setup` registers; each `train_step` calls `get_data` (plain `GET /batch`, 1 s after an
    empty answer), then forward_backward, optim_step and a new sampling client; no version is
    reported."""
    raw_register(url, tinker_registration(cfg))
    for _ in range(cfg.total_steps):
        raw_poll(url, sleep=1.0)


def run_tinker_recipe(url: str, cfg: TinkerCfg, seen: list[Any]) -> None:
    """The recipe for Tinker-style clients (the trainer serves inference itself): register,
    report version 0 once the step-0 sampling client serves, lease each batch, report step + 1
    once `create_sampling_client` serves the new weights, ack (Tinker saves every step)."""
    with TrainerClient(url, patience=10) as client:
        client.register(**tinker_registration(cfg))
        client.published(0)  # save_weights_for_sampler("step_0") -> create_sampling_client
        for step in range(cfg.total_steps):
            batch = client.next_batch(lease=600, within=30)
            assert batch is not None and batch.batch_id is not None
            seen.append(batch.samples())  # tokens, targets, inference logprobs, advantages
            # ... forward_backward_async(datums), optim_step_async(adam) ...
            client.published(step + 1)  # save_weights_for_sampler(f"step_{step+1}") served
            client.ack(batch.batch_id)


def test_tinker_as_shipped_conforms_but_never_reports_versions() -> None:
    cfg = TinkerCfg()
    report = check_trainer(
        lambda url: run_tinker_as_shipped(url, cfg),
        batches=cfg.total_steps,
        empty_polls=1,
        expect_batch_size=cfg.batch_size,
    )
    assert report.broken == {"publish"}, report


def test_tinker_style_recipe_through_the_client_conforms() -> None:
    cfg = TinkerCfg()
    seen: list[Any] = []
    report = check_trainer(
        lambda url: run_tinker_recipe(url, cfg, seen),
        batches=cfg.total_steps,
        expect_batch_size=cfg.batch_size,
        require_lease=True,
    )
    assert report.ok, report
    assert report.versions == [0, 1, 2]
    # the contract's advantages, not tinker-atropos' `scores - mean` (no division by the std)
    first = seen[0][0]
    scores = [1.0, 0.0, 1.0, 0.0]  # the kit's group 0
    assert max(first.advantages) == pytest.approx(group_advantages(scores)[0]) == 1.0


# ----- SkyRL: a GeneratorInterface pulling Atropos batches ---------------------------------------


class AtroposGenerator:
    """The recipe's SkyRL generator (`skyrl.train.generators.base.GeneratorInterface`'s one
    method, without importing SkyRL): each `generate` reports the weights SkyRL synced before
    it, acknowledges the batch the last step trained on, leases the next one and returns it as
    a `GeneratorOutput` (prompt / response split at the first trained token)."""

    def __init__(self, client: AsyncTrainerClient, lease: float = 3600) -> None:
        self.client, self.lease = client, lease
        self.trained: str | None = None  # the batch handed out by the last generate

    async def generate(self, input_batch: dict[str, Any]) -> dict[str, Any]:
        step = input_batch["batch_metadata"]["global_step"]
        await self.client.published(step - 1)  # SkyRL synced step - 1's weights before this
        if self.trained is not None:
            await self.client.ack(self.trained)
        batch = await self.client.next_batch(lease=self.lease, within=30)
        assert batch is not None
        self.trained = batch.batch_id
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt_token_ids", "response_ids", "loss_masks", "rewards", "logprobs")
        }
        for group in batch.groups:
            for i, tokens in enumerate(group.tokens):
                mask = group.masks[i]
                start = next((t for t, m in enumerate(mask) if m != -100), len(tokens))
                out["prompt_token_ids"].append(tokens[:start])
                out["response_ids"].append(tokens[start:])
                out["loss_masks"].append([int(m != -100) for m in mask[start:]])
                out["rewards"].append(group.scores[i])
                old = group.inference_logprobs
                out["logprobs"].append(old[i][start:] if old is not None else None)
        return {
            "prompt_token_ids": out["prompt_token_ids"],
            "response_ids": out["response_ids"],
            "rewards": out["rewards"],
            "loss_masks": out["loss_masks"],
            "stop_reasons": None,
            "rollout_metrics": None,
            "rollout_logprobs": out["logprobs"],
        }

    async def finish(self) -> None:
        """After the last step's checkpoint: acknowledge its batch."""
        if self.trained is not None:
            await self.client.ack(self.trained)


def test_skyrl_generator_recipe_conforms() -> None:
    train_batch_size, n_samples_per_prompt, steps = 2, GROUP, 2
    outputs: list[dict[str, Any]] = []

    async def run(url: str) -> None:
        async with AsyncTrainerClient(url, patience=10) as client:
            await client.register(
                wandb_group="skyrl",
                wandb_project="skyrl-atropos",
                batch_size=train_batch_size * n_samples_per_prompt,
                max_token_len=2048,  # generator.max_input_length + max_generate_length
                checkpoint_dir="ckpts",
                save_checkpoint_interval=1,
                starting_step=0,
                num_steps=steps,
            )
            generator = AtroposGenerator(client)
            for step in range(1, steps + 1):
                meta = {"global_step": step, "training_phase": "train"}
                outputs.append(await generator.generate({"batch_metadata": meta}))
            await generator.finish()

    report = check_trainer(
        lambda url: asyncio.run(run(url)),
        batches=steps,
        expect_batch_size=train_batch_size * n_samples_per_prompt,
        require_lease=True,
    )
    assert report.ok, report
    assert report.versions == [0, 1]
    out = outputs[0]
    assert len(out["response_ids"]) == train_batch_size * n_samples_per_prompt
    for prompt, response, mask, logprobs in zip(
        out["prompt_token_ids"],
        out["response_ids"],
        out["loss_masks"],
        out["rollout_logprobs"],
        strict=True,
    ):
        assert len(prompt) == 3 and len(mask) == len(response) == len(logprobs) == 4
        assert set(mask) == {1} and 1.0 not in logprobs  # trained positions, real logprobs
