"""`Batch.tensors`: padded and packed layouts against small examples worked out by hand; GRPO
advantages from the scores, the group's own per-token advantages, overrides, teacher logprobs."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from atropos import wire  # noqa: E402
from atropos.client import Batch  # noqa: E402
from atropos.client.samples import MISSING  # noqa: E402

IGN = -100


def group(**extra: Any) -> wire.Group:
    """Two sequences (a 2-token prompt, then 2 and 1 completion tokens), scores 1 and 0."""
    fields: dict[str, Any] = dict(
        tokens=[[5, 6, 7, 8], [5, 6, 9]], masks=[[IGN, IGN, 7, 8], [IGN, IGN, 9]],
        scores=[1.0, 0.0], inference_logprobs=[[1.0, 1.0, -0.5, -0.25], [1.0, 1.0, -2.0]],
        policy_version=3,
    )  # fmt: skip
    fields.update(extra)
    return wire.Group(**fields)


def batch(*groups: wire.Group) -> Batch:
    return Batch(list(groups), step=1, batch_id="b")


def rows(t: Any) -> list[list[float]]:
    return [[round(float(x), 6) for x in row] for row in t.tolist()]


def test_padded_tensors_follow_the_trainers_alignment() -> None:
    t = batch(group()).tensors(layout="padded", pad_id=0)
    assert t.input_ids.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert t.targets.tolist() == [[IGN, 7, 8], [IGN, 9, IGN]]
    assert t.attention_mask is not None and t.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert t.mask.tolist() == [[False, True, True], [False, True, False]]
    assert rows(t.inference_logprobs) == [[0.0, -0.5, -0.25], [0.0, -2.0, 0.0]]
    assert t.has_old.tolist() == [[False, True, True], [False, True, False]]
    # GRPO from the scores: mean 0.5, population std 0.5 -> +1, -1 on every token
    assert rows(t.advantages) == [[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]
    assert t.policy_versions == [3, 3] and t.scores is not None and t.scores.tolist() == [1, 0]
    assert t.teacher is None and t.position_ids is None and t.cu_seqlens is None


def test_packed_tensors_are_the_padded_rows_end_to_end() -> None:
    t = batch(group()).tensors(layout="packed", pad_id=99)
    assert t.input_ids.tolist() == [[5, 6, 7, 5, 6]]
    assert t.targets.tolist() == [[IGN, 7, 8, IGN, 9]]
    assert t.position_ids is not None and t.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert t.cu_seqlens is not None and t.cu_seqlens.tolist() == [0, 3, 5]
    assert t.cu_seqlens.dtype == torch.int32 and t.attention_mask is None
    assert rows(t.old_logp) == [[0.0, -0.5, -0.25, 0.0, -2.0]]
    assert rows(t.advantages) == [[1.0, 1.0, 1.0, -1.0, -1.0]]


def test_the_groups_own_advantages_and_overrides_come_first() -> None:
    own = [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7]]
    t = batch(group(advantages=own)).tensors()
    assert rows(t.advantages) == [[0.2, 0.3, 0.4], [0.6, 0.7, 0.0]]  # shifted like the targets
    zeroed = [{}, {"set_advantage_to_zero": True}]
    t = batch(group(advantages=own, overrides=zeroed)).tensors()
    assert rows(t.advantages) == [[0.2, 0.3, 0.4], [0.0, 0.0, 0.0]]
    t = batch(group(overrides=zeroed)).tensors()  # over the GRPO advantage too
    assert rows(t.advantages) == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_a_missing_logprob_is_no_logprob_and_max_len_cuts() -> None:
    t = batch(group(inference_logprobs=[[1.0, 1.0, MISSING, -0.25], [1.0, 1.0, -2.0]])).tensors(
        max_len=2
    )
    assert t.input_ids.tolist() == [[5, 6], [5, 6]]  # cut to max_len + 1 tokens
    assert t.has_old.tolist() == [[False, False], [False, True]]


def test_teacher_logprobs_come_when_every_group_has_them() -> None:
    g = wire.Group(
        tokens=[[5, 6, 7]], masks=[[IGN, 6, 7]], scores=[0.5],
        distill_token_ids=[[[0], [6, 1], [7, 2]]],
        distill_logprobs=[[[-9.0], [-0.1, -2.0], [-0.2, -1.5]]],
    )  # fmt: skip
    assert batch(g).has_teacher and not batch(g, group()).has_teacher
    t = batch(g).tensors()
    assert rows(t.advantages) == [[0.5, 0.5]]  # a group of one keeps its score
    assert t.teacher is not None
    assert t.teacher.ids.tolist() == [[[6, 1], [7, 2]]]
    assert t.teacher.valid.tolist() == [[[True, True], [True, True]]]
    packed = batch(g).tensors(layout="packed")
    assert packed.teacher is not None and packed.teacher.logprobs.shape == (1, 2, 2)
    assert batch(g).tensors(teacher=False).teacher is None


def test_an_unknown_layout_is_named() -> None:
    with pytest.raises(ValueError, match="layout 'ragged'"):
        batch(group()).tensors(layout="ragged")  # type: ignore[arg-type]
