"""The trainer's step on a real (tiny) Llama: chunked log-probabilities against the plain
cross-entropy, a packed step against a padded one, and no value read back from the device
between the first forward and the optimizer step."""

from __future__ import annotations

import random
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from atropos.client.samples import Sample  # noqa: E402
from atropos.client.tensors import IGNORE  # noqa: E402
from atropos.trainer.loss import token_logprobs  # noqa: E402
from atropos.trainer.ranks import Ranks  # noqa: E402
from atropos.trainer.step import StepSettings, train_step  # noqa: E402

VOCAB = 97


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    flat = F.cross_entropy(
        logits.double().reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=IGNORE, reduction="none",
    )  # fmt: skip
    return -flat.view(targets.shape)


@pytest.mark.parametrize("chunk_elements", [VOCAB, 3 * VOCAB, 1 << 24])  # 1, 3 rows, all
def test_chunked_logprobs_and_their_gradient_equal_cross_entropys(chunk_elements: int) -> None:
    torch.manual_seed(0)
    logits = (torch.randn(3, 7, VOCAB) * 4).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (3, 7))
    targets[0, :2] = IGNORE
    targets[2, 6] = IGNORE
    weights = torch.randn(3, 7)
    got = token_logprobs(logits, targets, chunk_elements)
    (got * weights).sum().backward()
    mine = logits.grad.clone()
    logits.grad = None
    ref = _reference(logits, targets)
    (ref * weights.double()).sum().backward()
    assert torch.allclose(got.double(), ref, atol=1e-5)
    assert got[0, 0] == 0.0 and got[2, 6] == 0.0
    assert torch.allclose(mine.double(), logits.grad.double(), atol=1e-6)
    assert mine[0, :2].abs().sum() == 0.0  # an ignored target gets no gradient


def test_chunked_logprobs_of_bf16_logits_keep_their_dtype_and_the_float32_numbers() -> None:
    torch.manual_seed(1)
    logits = (torch.randn(2, 5, VOCAB) * 3).bfloat16().requires_grad_(True)
    targets = torch.randint(0, VOCAB, (2, 5))
    got = token_logprobs(logits, targets, 2 * VOCAB)
    got.sum().backward()
    assert got.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    ref = _reference(logits.detach().float(), targets)
    assert torch.allclose(got.double(), ref, atol=1e-5)
    expected = torch.softmax(logits.detach().double(), -1).neg()
    expected.scatter_add_(-1, targets.unsqueeze(-1), torch.ones(2, 5, 1, dtype=torch.double))
    assert torch.allclose(logits.grad.double(), expected, atol=1e-2)


def _model() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _samples(n: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(2, 6))]
        answer = [rng.randrange(VOCAB) for _ in range(rng.randrange(2, 12))]
        tokens = prompt + answer
        masks = [IGNORE] * len(prompt) + answer
        logprobs = [1.0] * len(prompt) + [-rng.uniform(1, 6) for _ in answer]
        advantage = 1.0 if i % 2 else -0.5
        out.append(Sample(tokens, masks, logprobs, [advantage] * len(tokens), 1.0, i % 3, None))
    return out


def _step(model: Any, samples: list[Sample], **settings: Any) -> tuple[float, Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-1)  # an update proportional to the gradient
    return train_step(
        model, opt, params, samples, StepSettings(micro_batch_size=3, **settings), Ranks(),
        step=1, reference=None,
    )  # fmt: skip


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_packed_step_trains_exactly_what_a_padded_step_trains(checkpointing: bool) -> None:
    from atropos.trainer.fsdp import checkpoint_activations

    samples = _samples(7)
    padded, packed = _model(), _model()
    if checkpointing:  # the blocks recomputed in backward get the packed row's arguments too
        checkpoint_activations(packed)
    norm_a, tally_a = _step(padded, samples, layout="padded")
    norm_b, tally_b = _step(packed, samples, layout="packed")
    assert norm_b == pytest.approx(norm_a, rel=1e-4)
    assert tally_b.loss == pytest.approx(tally_a.loss, rel=1e-4, abs=1e-6)
    trained = sum(m != IGNORE for s in samples for m in s.masks[1:])
    assert tally_b.tokens == tally_a.tokens == trained
    assert tally_b.ratio == pytest.approx(tally_a.ratio, rel=1e-4)
    assert tally_b.gaps_all == pytest.approx(tally_a.gaps_all, rel=1e-4)
    assert len(tally_a.gaps_on) == 2  # policy_version 1: samples 1 and 4
    for a, b in zip(padded.parameters(), packed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


READS = {"_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero"}


class _Reads(TorchDispatchMode):
    """Every op that reads a value back to the host (an `item`, a `bool`, a mask's indexing),
    with the innermost frame of ours or transformers' that made it, while `active`."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.seen: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if self.active and name in READS:
            frames = traceback.extract_stack()[:-1]  # not this method's own frame
            frames = [f for f in frames if "/torch/" not in f.filename]
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
            self.seen.append((name, where))
        return func(*args, **(kwargs or {}))


@contextmanager
def _reads_between_first_forward_and_optimizer(model: Any) -> Iterator[_Reads]:
    """Count `_Reads` from the model's first forward until the gradient is clipped."""
    mode = _Reads()
    hook = model.register_forward_pre_hook(lambda *_: setattr(mode, "active", True))
    clip = torch.nn.utils.clip_grad_norm_

    def clipped(*args: Any, **kwargs: Any) -> Any:
        mode.active = False
        return clip(*args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clipped
    try:
        with mode:
            yield mode
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
        hook.remove()


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_step_reads_nothing_back_between_its_passes(layout: str) -> None:
    """Our code reads nothing back from the model's first forward to the optimizer: the batch
    is on the device before, the step's numbers are read after (`Tally.settle`). Transformers'
    mask code checks once per forward whether the row holds packed sequences (a `.all()`);
    that read is theirs, and with flash-attention the step hands the layers the boundaries
    (`Unpadded.attention_kwargs`) so they need none of their own."""
    model = _model()
    with _reads_between_first_forward_and_optimizer(model) as reads:
        _, tally = _step(model, _samples(9), layout=layout)  # three passes
    ours = [where for _, where in reads.seen if "/src/atropos/" in where]
    assert ours == []
    assert all("/transformers/" in where for _, where in reads.seen)
    assert len(reads.seen) <= 3  # at most one per pass
    assert tally.tokens > 0 and tally.gaps_all  # and the numbers were read, after


def test_the_counter_sees_a_read_and_names_our_code_that_made_it() -> None:
    """What the test above would catch: a read in our code, as the step made per pass before
    (a `float` of the loss, of each stat, two per sequence for the logprob gaps)."""
    from atropos.trainer.fsdp import grad_norm_value

    with _reads_between_first_forward_and_optimizer(_model()) as reads:
        reads.active = True  # as from a first forward on
        grad_norm_value(torch.ones(2).sum())
    assert [name for name, _ in reads.seen] == ["_local_scalar_dense"]
    assert "/src/atropos/trainer/fsdp.py:" in reads.seen[0][1]


def _with_teacher(samples: list[Sample], k: int = 3) -> list[Sample]:
    rng = random.Random(5)
    for s in samples:
        s.teacher_ids = [rng.sample(range(VOCAB), k) for _ in s.tokens]
        s.teacher_logprobs = [sorted(-rng.uniform(0.1, 5) for _ in range(k)) for _ in s.tokens]
    return samples


@pytest.mark.parametrize("mode", ["reverse", "topk_forward"])
def test_a_packed_distillation_step_trains_what_a_padded_one_does(mode: str) -> None:
    samples = _with_teacher(_samples(5, seed=2))
    padded, packed = _model(), _model()
    opd = dict(loss="opd", opd_mode=mode, opd_reward_coef=0.5)
    norm_a, tally_a = _step(padded, samples, layout="padded", **opd)
    norm_b, tally_b = _step(packed, samples, layout="packed", **opd)
    assert norm_b == pytest.approx(norm_a, rel=1e-4)
    assert tally_b.extra == pytest.approx(tally_a.extra, rel=1e-4)
    assert "teacher_topk_share" in tally_a.extra
    for a, b in zip(padded.parameters(), packed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_auto_packs_only_for_an_attention_that_takes_packed_rows() -> None:
    from atropos.trainer.step import pass_layout

    model = _model()
    assert pass_layout("auto", model, "grpo") == "padded"  # sdpa: a dense mask over the row
    model.config._attn_implementation = "flash_attention_2"
    assert pass_layout("auto", model, "grpo") == "packed"
    assert pass_layout("auto", model, "opd") == "padded"
    assert pass_layout("padded", model, "grpo") == "padded"
    model.config._attn_implementation = "eager"
    assert pass_layout("packed", model, "opd") == "packed"


def test_an_attention_transformers_cannot_load_is_named_with_the_way_out(tmp_path: Any) -> None:
    from atropos.local.weights import WeightsError, load_fp32

    _model().save_pretrained(tmp_path)
    with pytest.raises(WeightsError, match="attention 'no_such_attention'.*sdpa, eager, or auto"):
        load_fp32(str(tmp_path), "no_such_attention")
    assert load_fp32(str(tmp_path), "eager").config._attn_implementation == "eager"
