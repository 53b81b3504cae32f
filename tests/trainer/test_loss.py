"""The GRPO loss against numbers worked out by hand, and the batch-to-tensor alignment."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from atropos.client.samples import samples_from_groups  # noqa: E402
from atropos.client.tensors import collate  # noqa: E402
from atropos.rewards.group import group_advantages  # noqa: E402
from atropos.trainer.loss import policy_loss, token_logprobs  # noqa: E402
from atropos.wire import Group  # noqa: E402

LN = math.log


def test_clipped_loss_by_hand_including_negative_advantage_outside_the_clip_range() -> None:
    # ratios: seq 0 (A=+1) 1.5 and 0.5; seq 1 (A=-1) 1.5 and 0.5, plus a masked junk token.
    old = torch.zeros(2, 3)
    logp = torch.tensor([[LN(1.5), LN(0.5), 0.0], [LN(1.5), LN(0.5), 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.tensor([[1.0], [-1.0]])
    loss, stats = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # seq 0: -min(1.5, 1.2) = -1.2 ; -min(0.5, 0.8) = -0.5        -> mean -0.85
    # seq 1: -min(-1.5, -1.2) = 1.5 ; -min(-0.5, -0.8) = 0.8       -> mean  1.15
    # (atroposlib's max for A < 0 would give 1.2 and 0.5 here)
    assert float(loss.detach()) == pytest.approx((-0.85 + 1.15) / 2)
    loss.backward()
    # d/dlogp of -ratio*A is -A*ratio where the unclipped term is the min, else 0;
    # then / 2 tokens / 2 sequences.
    expected = torch.tensor([[0.0, -0.5 / 4, 0.0], [1.5 / 4, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    assert stats.clip_fraction == pytest.approx(1.0)
    assert stats.mean_ratio == pytest.approx(1.0)
    assert stats.tokens == 4


def test_on_policy_ratio_is_one_and_kl_to_itself_is_zero() -> None:
    logp = torch.tensor([[-0.3, -1.2]], requires_grad=True)
    loss, stats = policy_loss(
        logp, logp.detach(), torch.tensor([[2.0]]), torch.ones(1, 2),
        ref_logp=logp.detach(), kl_coef=0.5,
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(-2.0)
    assert stats.kl == pytest.approx(0.0) and stats.clip_fraction == 0.0
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))


def test_kl_penalty_is_the_k3_estimator() -> None:
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    loss, stats = policy_loss(logp, logp, torch.zeros(1, 1), torch.ones(1, 1), 0.2, ref, 1.0)
    assert stats.kl == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)
    assert float(loss.detach()) == pytest.approx(stats.kl)


def test_group_advantages() -> None:
    assert group_advantages([1.0, 0.0]) == [1.0, -1.0]
    assert group_advantages([3.0, 3.0, 3.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.7]) == [0.7]
    a = group_advantages([1.0, 0.0, 0.0, 0.0])
    assert sum(a) == pytest.approx(0.0) and a[0] == pytest.approx(math.sqrt(3))


def test_token_logprobs_equal_log_softmax_and_zero_where_ignored() -> None:
    logits = torch.randn(2, 3, 7)
    targets = torch.tensor([[1, 2, -100], [6, -100, 0]])
    got = token_logprobs(logits, targets)
    ref = torch.log_softmax(logits, -1)
    assert got[0, 0] == pytest.approx(float(ref[0, 0, 1]), abs=1e-6)
    assert got[1, 2] == pytest.approx(float(ref[1, 2, 0]), abs=1e-6)
    assert got[0, 2] == 0.0 and got[1, 1] == 0.0


def test_collate_aligns_targets_logprobs_and_advantages() -> None:
    group = {
        "tokens": [[5, 6, 7, 8], [5, 6, 9]],
        "masks": [[-100, -100, 7, 8], [-100, -100, 9]],
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0, 1.0, -0.5, -0.25], [1.0, 1.0, -9999.0]],
        "overrides": [{}, {"set_advantage_to_zero": True}],
        "policy_version": 3,
    }
    samples = samples_from_groups([Group(**group)], max_len=16)
    assert [s.advantages[0] for s in samples] == [1.0, 0.0]
    mb = collate(samples, pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert mb.targets.tolist() == [[-100, 7, 8], [-100, 9, -100]]
    assert mb.old_logp[0].tolist() == [0.0, -0.5, -0.25]
    # the server's "no logprob" marker is not a behaviour logprob
    assert mb.has_old.tolist() == [[False, True, True], [False, False, False]]
    assert mb.advantages[1].tolist() == [0.0, 0.0, 0.0]
    assert mb.policy_versions == [3, 3]


def test_per_token_advantages_from_the_environment_win() -> None:
    group = {
        "tokens": [[1, 2, 3]], "masks": [[-100, 2, 3]], "scores": [0.0],
        "advantages": [[0.0, 0.5, -0.5]],
    }  # fmt: skip
    mb = collate(samples_from_groups([Group(**group)], 8))
    assert mb.advantages.tolist() == [[0.5, -0.5]]
