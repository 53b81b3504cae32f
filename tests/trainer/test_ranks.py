"""The pieces around many processes that need no second process: torchrun's variables, the
micro-batch rounds of each rank, checkpoints of an earlier release, `atropos launch` with
trainer GPUs, and the step on a world of one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from atropos.client.samples import MISSING, Sample  # noqa: E402
from atropos.inference.base import MISSING_LOGPROB  # noqa: E402
from atropos.trainer.checkpoint import load_optimizer  # noqa: E402
from atropos.trainer.ranks import Ranks  # noqa: E402
from atropos.trainer.step import my_micro_batches  # noqa: E402


def sample(n: int) -> Sample:
    return Sample([1] * n, [-100] + [1] * (n - 1), None, [0.0] * n, 0.0, None, None)


def test_the_batch_tensors_use_the_inference_layers_missing_logprob_marker() -> None:
    assert MISSING == MISSING_LOGPROB


def test_without_torchrun_the_trainer_is_one_process_and_half_a_torchrun_is_named() -> None:
    ranks = Ranks.from_env("cpu", env={})
    assert (ranks.rank, ranks.world, ranks.distributed, ranks.main) == (0, 1, False, True)
    assert ranks.broadcast("x", "test") == "x" and ranks.any(True, "test")
    assert ranks.gather(3, "test") == [3]
    with pytest.raises(ValueError, match="MASTER_ADDR, MASTER_PORT is not: start the trainer"):
        Ranks.from_env("cpu", env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})


def test_every_rank_runs_as_many_passes_as_the_busiest() -> None:
    samples = [sample(n) for n in (9, 2, 2, 2, 2, 2, 2)]  # 21 tokens: 9 | 2 x 6
    first = my_micro_batches(samples, 2, Ranks(rank=0, world=2))
    second = my_micro_batches(samples, 2, Ranks(rank=1, world=2))
    assert len(first) == len(second) == 3  # the second rank's 5 sequences in 3 chunks
    assert [len(c) if c else 0 for c in first] == [2, 0, 0]  # the long one and a short one
    assert [len(c) if c else 0 for c in second] == [2, 2, 1]
    one = my_micro_batches(samples, 4, Ranks())
    assert [len(c) if c else 0 for c in one] == [4, 3]


def test_an_earlier_releases_checkpoint_resumes_in_one_process_and_says_how_to_shard_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    (tmp_path / "state.json").write_text(json.dumps({"step": 7, "batch_ids": ["b"]}))
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    resumed = load_optimizer(tmp_path, model, fresh, Ranks())
    assert (resumed.step, resumed.batch_ids, resumed.world) == (7, ["b"], 1)
    assert fresh.state_dict()["state"][0]["step"] == 1
    monkeypatch.setattr("atropos.trainer.checkpoint.is_sharded", lambda m: True)
    with pytest.raises(ValueError, match="resumes in one process only: run `atropos train` once"):
        load_optimizer(tmp_path, model, fresh, Ranks())


def test_launch_runs_a_trainer_with_several_gpus_under_torchrun(tmp_path: Path) -> None:
    from atropos.launch.config import RunFile
    from atropos.launch.plan import build

    base = {"envs": [{"name": "arithmetic"}], "trainer": {"model": "tiny"}}
    argv = build(RunFile.model_validate(base), tmp_path).get("trainer").argv
    assert argv[:4] == ["{python}", "-m", "atropos", "train"]
    base["trainer"] = {"model": "tiny", "gpus": 4}
    trainer = build(RunFile.model_validate(base), tmp_path).get("trainer")
    assert trainer.gpus == 4
    assert trainer.argv[:8] == [
        "{python}", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        "-m", "atropos.trainer",
    ]  # fmt: skip
    assert trainer.argv[8:10] == ["--model", "tiny"]
