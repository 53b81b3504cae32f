"""Samples to training tensors: `collate` (right-padded rows) or `pack` (one row, sequences end
to end), both as a `MicroBatch`.

Alignment, for one sequence of ``n`` tokens with masks ``m`` (token id where trained, -100 where
not) and inference logprobs ``q`` (1.0 where not generated)::

    input_ids[j] = tokens[j]        j = 0 .. n-2
    targets[j]   = m[j + 1]         the token predicted at position j, or -100 (`IGNORE`)
    old_logp[j]  = q[j + 1]         the server's logprob of that same token (0 where none)
    advantages[j] = A[j + 1]        the advantage of that same token

Teacher logprobs (`--loss opd`) are shifted like the targets::

    teacher.ids[j, k] = distill_token_ids[j + 1][k]      the teacher's top-k for targets[j]

Padded (`collate`): ``[B, L]`` tensors, ``L`` the longest ``n - 1``, padding on the right
(`pad_id`, targets `IGNORE`), and ``attention_mask`` 1 on real positions. Packed (`pack`):
``[1, T]`` tensors, ``T = sum(n_i - 1)``, with ``position_ids`` restarting at 0 for each
sequence and ``cu_seqlens`` (``[B + 1]``, int32: where each sequence starts, then ``T``), the
form flash-attention's variable-length kernels take.

This module needs torch and `samples.py` alone (no inference imports), so a benchmark on a bare
GPU machine builds the trainer's real micro-batches from it (benchmarks/trainer_gpu.py).
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from atropos.client.samples import MISSING, Sample

IGNORE = -100
"""The label of a position that is not trained (prompt, padding)."""

Layout = Literal["padded", "packed"]


@dataclass
class TeacherTopK:
    """The teacher's top-k at each target position of a micro-batch, ``[B, T, K]`` each: token
    ids, their logprobs, and which entries are real (`valid`; padding where a position has
    fewer than K, and wherever the target is `IGNORE`)."""

    ids: torch.Tensor
    logprobs: torch.Tensor
    valid: torch.Tensor

    def to(self, device: torch.device | str) -> TeacherTopK:
        """The same tensors on `device`."""
        return TeacherTopK(self.ids.to(device), self.logprobs.to(device), self.valid.to(device))


@dataclass
class MicroBatch:
    """Tensors of a few samples (``[B, L]`` padded, ``[1, T]`` packed) plus per-sample metadata.

    `old_logp` are the inference server's logprobs of the targets, `has_old` where there is one
    (and the target is trained); `advantages` are per target; `scores` ``[B]``. Padded batches
    have `attention_mask`; packed ones `position_ids` and `cu_seqlens`."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    old_logp: torch.Tensor
    has_old: torch.Tensor  # bool: the server gave a logprob for this target
    advantages: torch.Tensor
    policy_versions: list[int | None]
    teacher: TeacherTopK | None = None  # with teacher logprobs asked for
    attention_mask: torch.Tensor | None = None  # padded: 1 on real positions
    position_ids: torch.Tensor | None = None  # packed: 0.. within each sequence
    cu_seqlens: torch.Tensor | None = None  # packed: int32 [B + 1] sequence boundaries
    scores: torch.Tensor | None = None  # [B]: each sequence's score

    @property
    def mask(self) -> torch.Tensor:
        """Where a target is trained (bool, the shape of `targets`)."""
        return self.targets != IGNORE

    @property
    def inference_logprobs(self) -> torch.Tensor:
        """`old_logp` by the name the protocol gives it."""
        return self.old_logp


def collate(samples: Sequence[Sample], pad_id: int = 0) -> MicroBatch:
    """Pad samples on the right into one `MicroBatch` (see the module docstring for alignment).

    Each field is converted once, the samples' values end to end (`_joined`), and scattered
    into its rows by a length mask (`masked_scatter_`): a `torch.tensor` per row and field
    took 196 ms of CPU for 512 sequences of 512 to 1024 tokens, this 151 ms, the same tensors
    (most of what is left is Python's numbers becoming C's, once each)."""
    lengths = [max(len(s.tokens) - 1, 0) for s in samples]
    width, b = max(lengths), len(samples)
    real = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)

    def rows(values: Iterator[Sequence[float]], fill: float, kind: str) -> torch.Tensor:
        dtype = torch.long if kind == "q" else torch.float32
        full = torch.full((b, width), fill, dtype=dtype)
        return full.masked_scatter_(real, _joined(values, kind))

    input_ids = rows((s.tokens[:-1] for s in samples), pad_id, "q")
    targets = rows((s.masks[1:] for s in samples), IGNORE, "q")
    adv = rows((s.advantages[1:] for s in samples), 0.0, "f")
    q = rows((_logprobs(s, n) for s, n in zip(samples, lengths, strict=True)), 1.0, "f")
    ok = (q <= 0.0) & (q > MISSING)  # 1.0 (none), the marker and anything below it: no logprob
    old = torch.where(ok, q, torch.zeros_like(q))
    has_old = ok & (targets != IGNORE)
    return MicroBatch(
        input_ids=input_ids,
        targets=targets,
        old_logp=old,
        has_old=has_old,
        advantages=adv,
        policy_versions=[s.policy_version for s in samples],
        teacher=collate_teacher(samples, targets),
        attention_mask=real.long(),
        scores=torch.tensor([s.score for s in samples], dtype=torch.float32),
    )


def _joined(rows: Iterator[Sequence[float]], kind: str) -> torch.Tensor:
    """The rows end to end as one tensor: int64 (`kind` "q") or float32 ("f"), through an
    `array.array` (4x faster than `torch.tensor` of a list)."""
    flat: list[float] = []
    for row in rows:
        flat += row  # a list extended in C, then converted in one pass
    values = array.array(kind, flat)
    if not values:
        return torch.empty(0, dtype=torch.long if kind == "q" else torch.float32)
    return torch.frombuffer(values, dtype=torch.long if kind == "q" else torch.float32)


def _logprobs(sample: Sample, n: int) -> list[float]:
    """A sample's inference logprobs shifted like its targets; 1.0 (none) without them."""
    return sample.old_logprobs[1 : n + 1] if sample.old_logprobs is not None else [1.0] * n


def pack(samples: Sequence[Sample], pad_id: int = 0) -> MicroBatch:
    """The samples end to end in one row (``[1, T]``), with `position_ids` and `cu_seqlens`
    (module docstring); the same values as `collate`'s rows without their padding (`unpadded`
    for the ids, targets and boundaries; every other field joined the same way)."""
    padded = collate(samples, pad_id)
    row = unpadded(padded)
    real = row.back < row.input_ids.shape[1]  # the real positions of the padded rows

    def joined(t: torch.Tensor) -> torch.Tensor:
        return t[real].unsqueeze(0)

    teacher = padded.teacher
    if teacher is not None:
        teacher = TeacherTopK(joined(teacher.ids), joined(teacher.logprobs), joined(teacher.valid))
    return replace(
        padded,
        input_ids=row.input_ids,
        targets=row.targets,
        old_logp=joined(padded.old_logp),
        has_old=joined(padded.has_old),
        advantages=joined(padded.advantages),
        teacher=teacher,
        attention_mask=None,
        position_ids=row.position_ids,
        cu_seqlens=row.cu_seqlens,
    )


@dataclass
class Unpadded:
    """A padded micro-batch's real positions end to end in one row (``[1, T]``), for a model
    that takes packed rows (`position_ids` restarting at 0 for each sequence: flash-attention's
    variable-length kernels, flex attention, or transformers' block mask), and `back`, which
    lays a value per packed position out as the padded batch again (`padded`), so a trainer
    runs the model packed and keeps every other tensor of the `MicroBatch` as it is."""

    input_ids: torch.Tensor  # [1, T]
    targets: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    back: torch.Tensor  # [B, L]: each padded position's index in the row; T for padding
    cu_seqlens: torch.Tensor  # int32 [B + 1]: where each sequence starts, then T
    longest: int  # the longest sequence's positions

    def attention_kwargs(self) -> dict[str, object]:
        """What a transformers model's forward takes to run flash-attention's variable-length
        kernel on this row without working the boundaries out from `position_ids` (which
        reads them back from the GPU in every layer); other attentions ignore them."""
        cu, n = self.cu_seqlens, self.longest
        return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": n, "max_length_k": n}

    def padded(self, values: torch.Tensor) -> torch.Tensor:
        """`values` (``[1, T, ...]``) as ``[B, L, ...]``, 0 at padding; differentiable, and no
        value is read back to the host (an index, not a mask)."""
        rows = values.reshape(values.shape[1], *values.shape[2:])
        return torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])[self.back]


def unpadded(mb: MicroBatch) -> Unpadded:
    """`mb`'s (padded, from `collate`) real positions end to end: see `Unpadded`.

    >>> def sample(tokens):
    ...     return Sample(tokens, tokens, None, [0.0] * len(tokens), 0.0, None, None)
    >>> u = unpadded(collate([sample([5, 6, 7]), sample([8, 9])]))
    >>> u.input_ids.tolist(), u.position_ids.tolist(), u.back.tolist()
    ([[5, 6, 8]], [[0, 1, 0]], [[0, 1], [2, 3]])
    >>> u.padded(torch.tensor([[1.0, 2.0, 3.0]])).tolist()
    [[1.0, 2.0], [3.0, 0.0]]
    """
    if mb.attention_mask is None:
        raise ValueError("unpadded takes a padded MicroBatch (collate's), not a packed one")
    real = mb.attention_mask.bool()
    total = int(real.sum())
    back = torch.full(real.shape, total, dtype=torch.long)
    back[real] = torch.arange(total)
    positions = torch.arange(real.shape[1]).expand_as(real)[real]
    lengths = real.sum(dim=1)
    return Unpadded(
        input_ids=mb.input_ids[real].unsqueeze(0),
        targets=mb.targets[real].unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        back=back,
        cu_seqlens=torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32),
        longest=int(lengths.max()) if len(lengths) else 0,
    )


def to_tensors(samples: Sequence[Sample], layout: Layout = "padded", pad_id: int = 0) -> MicroBatch:
    """`collate` or `pack`, by `layout`."""
    if layout == "padded":
        return collate(samples, pad_id)
    if layout == "packed":
        return pack(samples, pad_id)
    raise ValueError(f"layout {layout!r}: expected 'padded' or 'packed'")


def collate_teacher(samples: Sequence[Sample], targets: torch.Tensor) -> TeacherTopK | None:
    """The samples' teacher top-k as ``[B, T, K]`` tensors aligned with `targets` (None when
    the samples carry none). K is the most entries any trained position has; an entry is
    valid where it exists, its target is trained and its logprob is a real one (above the
    "no logprob" marker)."""
    if not samples or any(s.teacher_ids is None or s.teacher_logprobs is None for s in samples):
        return None
    b, width = targets.shape
    trained = targets != IGNORE
    positions = [trained[row].nonzero().flatten().tolist() for row in range(b)]
    rows = [
        ([s.teacher_ids[j + 1] for j in at], [s.teacher_logprobs[j + 1] for j in at])
        for s, at in zip(samples, positions, strict=True)
        if s.teacher_ids is not None and s.teacher_logprobs is not None
    ]
    k = max((len(top) for top_ids, _ in rows for top in top_ids), default=1) or 1
    ids = torch.zeros((b, width, k), dtype=torch.long)
    lps = torch.full((b, width, k), MISSING, dtype=torch.float32)
    for row, (at, (top_ids, top_lps)) in enumerate(zip(positions, rows, strict=True)):
        if at:  # one tensor per row: the trained positions' entries, padded to k
            ids[row, at] = torch.tensor([t + [0] * (k - len(t)) for t in top_ids])
            lps[row, at] = torch.tensor([p + [MISSING] * (k - len(p)) for p in top_lps])
    valid = (lps > MISSING) & trained.unsqueeze(-1)
    return TeacherTopK(ids=ids, logprobs=lps, valid=valid)


def micro_batches(samples: Sequence[Sample], size: int, pad_id: int = 0) -> Iterator[MicroBatch]:
    """Consecutive chunks of `size` samples, each collated."""
    for start in range(0, len(samples), size):
        yield collate(samples[start : start + size], pad_id)
