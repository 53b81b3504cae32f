"""An `mt_grpo` group, pushed to a real trajectory API, trains one step of the reference trainer
on its per-turn advantages: the loss gets them, turn by turn, in place of GRPO's one value per
sequence (the trainer's own code untouched; the `policy_loss` its step calls is watched)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")

import atropos.trainer.step  # noqa: E402
from atropos.api.app import create_app  # noqa: E402
from atropos.environments.mt_grpo import MTGRPO, demo_responder, load_tasks  # noqa: E402
from atropos.testing import FakeInferenceServer, serve_in_thread  # noqa: E402
from atropos.trainer.train import TrainConfig, train  # noqa: E402

from .helpers import make_env  # noqa: E402

SIZE = 4


def a_group() -> dict[str, Any]:
    """A group of `SIZE` episodes (the demo responder: right and wrong calls mixed)."""
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make_env(MTGRPO, fake.base_url, group_size=SIZE)

        async def main() -> Any:
            await env.setup()
            try:
                for task in load_tasks("train"):
                    group, _ = await env.collect_trajectories(task)
                    if group is not None:
                        return group
                raise AssertionError("no group with a signal")
            finally:
                await env.aclose()

        return dict(asyncio.run(main()))


def test_the_groups_turn_advantages_reach_the_loss(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    group = a_group()
    longest = max(len(t) for t in group["tokens"])
    seen: list[tuple[Any, Any]] = []
    real = atropos.trainer.step.policy_loss

    def watched(logp: Any, old: Any, advantages: Any, mask: Any, *args: Any) -> Any:
        seen.append((advantages.detach().clone(), mask.detach().clone()))
        return real(logp, old, advantages, mask, *args)

    monkeypatch.setattr(atropos.trainer.step, "policy_loss", watched)  # the name the step calls
    with serve_in_thread(create_app()) as url:
        answer = httpx.post(f"{url}/scored_data", json=group)
        assert answer.status_code == 200, answer.text
        config = TrainConfig(
            model=str(tiny_model_dir), api_url=url, out_dir=tmp_path / "run", batch_size=SIZE,
            micro_batch_size=SIZE, seq_len=longest, lr=1e-3, sync="none", patience=10.0, steps=1,
        )  # fmt: skip
        assert train(config)["step"] == 1
    [(advantages, mask)] = seen
    for row, (masks, per_token) in enumerate(zip(group["masks"], group["advantages"], strict=True)):
        n = len(masks) - 1  # the trainer predicts token j + 1 at position j
        trained = [m != -100 for m in masks[1:]]
        assert mask[row, :n].tolist() == trained
        expected = [a if t else 0.0 for a, t in zip(per_token[1:], trained, strict=True)]
        got = (advantages[row, :n] * mask[row, :n]).tolist()
        assert got == pytest.approx(expected)
    # turn-level credit: one sequence holds several advantages, which GRPO's cannot
    assert any(len({a for a, m in zip(r, g, strict=True) if m != -100}) > 1
               for r, g in zip(group["advantages"], group["masks"], strict=True))  # fmt: skip
