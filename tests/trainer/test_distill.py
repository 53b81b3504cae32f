"""On-policy distillation's loss (`--loss opd`) against numbers worked out by hand: both modes,
the reward-coefficient mix, the top-k floor, and the teacher rows lined up with the targets."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from atropos.client.samples import MissingTeacher, samples_from_groups  # noqa: E402
from atropos.client.tensors import TeacherTopK, collate  # noqa: E402
from atropos.trainer.distill import opd_loss, teacher_logprob_of  # noqa: E402
from atropos.trainer.loss import IGNORE  # noqa: E402
from atropos.wire import Group  # noqa: E402

LN = math.log

# One sequence, three target positions (the first not trained), a vocabulary of 4.
#   position 1: target 2; the teacher's top-2 is {2: 0.6, 0: 0.3}  -> the target is in it
#   position 2: target 1; the teacher's top-2 is {3: 0.5, 0: 0.25} -> it is not: floor ln 0.25
TARGETS = torch.tensor([[IGNORE, 2, 1]])
MASK = TARGETS != IGNORE
OLD = torch.tensor([[0.0, LN(0.4), LN(0.2)]])  # the inference server's logprobs


def teacher() -> TeacherTopK:
    ids = torch.tensor([[[0, 0], [2, 0], [3, 0]]])
    lps = torch.tensor([[[-9999.0, -9999.0], [LN(0.6), LN(0.3)], [LN(0.5), LN(0.25)]]])
    valid = torch.tensor([[[False, False], [True, True], [True, True]]])
    return TeacherTopK(ids, lps, valid)


def test_the_teacher_logprob_of_the_target_with_the_top_k_floor() -> None:
    logprob, found, known = teacher_logprob_of(TARGETS.clamp(min=0), teacher())
    assert logprob[0, 1:].tolist() == pytest.approx([LN(0.6), LN(0.25)])
    assert found.tolist() == [[False, True, False]] and known.tolist() == [[False, True, True]]


def test_reverse_mode_by_hand_with_and_without_the_reward() -> None:
    a1, a2 = LN(0.6) - LN(0.4), LN(0.25) - LN(0.2)  # A_t = log p_T(y_t) - log p_old(y_t)
    for coef, env_adv in [(0.0, 0.0), (0.5, 1.0), (2.0, -1.0)]:
        logp = OLD.clone().requires_grad_(True)  # on policy: ratio 1, no clipping
        loss, stats = opd_loss(
            "reverse", logits=torch.zeros(1, 3, 4), logp=logp, old_logp=OLD,
            env_advantages=torch.tensor([[env_adv]]), targets=TARGETS, mask=MASK,
            teacher=teacher(), reward_coef=coef,
        )  # fmt: skip
        advantages = [a1 + coef * env_adv, a2 + coef * env_adv]
        # -mean_t(ratio * A_t) over the two trained tokens
        assert float(loss.detach()) == pytest.approx(-sum(advantages) / 2)
        loss.backward()
        assert logp.grad.tolist()[0] == pytest.approx([0.0, -advantages[0] / 2, -advantages[1] / 2])
        assert stats.tokens == 2 and stats.mean_ratio == pytest.approx(1.0)
        assert stats.extra["reverse_kl"] == pytest.approx(-(a1 + a2) / 2)
        assert stats.extra["teacher_topk_share"] == pytest.approx(0.5)


def test_reverse_mode_is_clipped_like_grpo() -> None:
    # the student already likes the first token 1.5x more than when it sampled it: with a
    # positive advantage the clipped term (1.2 * A) wins and the token gets no gradient
    logp = (OLD + torch.tensor([[0.0, LN(1.5), 0.0]])).requires_grad_(True)
    loss, stats = opd_loss(
        "reverse", logits=torch.zeros(1, 3, 4), logp=logp, old_logp=OLD,
        env_advantages=torch.zeros(1, 1), targets=TARGETS, mask=MASK, teacher=teacher(),
    )  # fmt: skip
    loss.backward()
    assert logp.grad[0, 1] == 0.0 and stats.clip_fraction == pytest.approx(0.5)


def test_topk_forward_mode_by_hand_with_the_reward() -> None:
    # student logits: position 1 prefers token 2 three to one over token 0; position 2 is flat
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 2] = LN(3.0)
    logits.requires_grad_(True)
    # teacher renormalised over its top-2: [2/3, 1/3] at both positions
    # student over the same ids: position 1 [3/4, 1/4] (ids 2, 0); position 2 [1/2, 1/2]
    kl1 = 2 / 3 * LN((2 / 3) / (3 / 4)) + 1 / 3 * LN((1 / 3) / (1 / 4))
    kl2 = 2 / 3 * LN((2 / 3) / (1 / 2)) + 1 / 3 * LN((1 / 3) / (1 / 2))
    for coef in (0.0, 0.5):
        logits.grad = None
        loss, stats = opd_loss(
            "topk_forward", logits=logits, logp=OLD.clone(), old_logp=OLD,
            env_advantages=torch.tensor([[1.0]]), targets=TARGETS, mask=MASK,
            teacher=teacher(), reward_coef=coef,
        )  # fmt: skip
        # the forward KL's mean, plus the policy-gradient term of coef * A_env at ratio 1
        assert float(loss.detach()) == pytest.approx((kl1 + kl2) / 2 - coef * 1.0)
        assert stats.extra["forward_kl"] == pytest.approx((kl1 + kl2) / 2)
        loss.backward()
        # d L_t / d z_k = pS_k - pT_k over the top-k ids; / 2 trained tokens
        grad = logits.grad[0]
        assert grad[1, 2] == pytest.approx((3 / 4 - 2 / 3) / 2)
        assert grad[1, 0] == pytest.approx((1 / 4 - 1 / 3) / 2)
        assert grad[2, 3] == pytest.approx((1 / 2 - 2 / 3) / 2)
        assert grad[2, 0] == pytest.approx((1 / 2 - 1 / 3) / 2)
        assert float(grad[0].abs().sum()) == 0.0 and grad[1, 1] == 0.0 and grad[1, 3] == 0.0


def test_topk_forward_is_zero_when_the_student_matches_the_teacher_on_its_top_k() -> None:
    logits = torch.tensor([[[0.0] * 4, [LN(0.3), -5.0, LN(0.6), 9.0], [LN(0.25), 0, 0, LN(0.5)]]])
    loss, _ = opd_loss(
        "topk_forward", logits=logits, logp=OLD, old_logp=OLD, env_advantages=torch.zeros(1, 1),
        targets=TARGETS, mask=MASK, teacher=teacher(),
    )  # fmt: skip
    assert float(loss.detach()) == pytest.approx(
        0.0, abs=1e-6
    )  # renormalised: the rest of V is ignored


GROUP = {
    "tokens": [[5, 6, 7, 8], [5, 6, 9]],
    "masks": [[-100, -100, 7, 8], [-100, -100, 9]],
    "scores": [1.0, 0.0],
    "inference_logprobs": [[1.0, 1.0, -0.5, -0.25], [1.0, 1.0, -0.75]],
    "distill_token_ids": [[[], [6], [7, 1], [3, 8]], [[], [6, 2], [4]]],
    "distill_logprobs": [[[], [-0.1], [-0.2, -2.0], [-0.3, -1.5]], [[], [-0.4, -1.1], [-0.6]]],
}


def test_collate_lines_the_teacher_up_with_the_targets() -> None:
    mb = collate(samples_from_groups([Group(**GROUP)], max_len=16, teacher=True))
    assert mb.teacher is not None
    assert mb.targets.tolist() == [[-100, 7, 8], [-100, 9, -100]]
    # the teacher's entries at token j + 1 go with targets[j]; only trained positions are kept
    assert mb.teacher.ids.tolist() == [[[0, 0], [7, 1], [3, 8]], [[0, 0], [4, 0], [0, 0]]]
    assert mb.teacher.valid.tolist() == [
        [[False, False], [True, True], [True, True]],
        [[False, False], [True, False], [False, False]],
    ]
    assert mb.teacher.logprobs[0, 2].tolist() == pytest.approx([-0.3, -1.5])
    plain = collate(samples_from_groups([Group(**GROUP)], max_len=16))
    assert plain.teacher is None  # grpo leaves them alone


def test_groups_without_teacher_logprobs_are_refused_by_name() -> None:
    bare = {k: v for k, v in GROUP.items() if not k.startswith("distill")}
    with pytest.raises(MissingTeacher, match=r"--loss opd: a group from env 3 has no teacher"):
        samples_from_groups([Group(**bare, env_id=3)], max_len=16, teacher=True)
    short = {**GROUP, "distill_token_ids": [[[], [6]], [[], [6, 2], [4]]]}
    with pytest.raises(MissingTeacher, match=r"sequence 0 has 4 tokens but 2 distill_token_ids"):
        samples_from_groups([Group(**short)], max_len=16, teacher=True)
