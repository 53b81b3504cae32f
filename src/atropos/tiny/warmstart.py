"""Supervised warm start of the tiny policy on the `arithmetic` task, and its evaluation.

`warm_start()` trains a fresh tiny Llama on training-split items through the chat template
(loss on the answer and `<|im_end|>` only), imitating a sloppy tutor: most of the answers it
sees (60%) are one too many. The result answers in the right format and knows the sum, but
says it exactly only on part of the held-out items, so RL has something to fix.
`evaluate_policy()` measures a policy with plain transformers: greedy accuracy and the
temperature-1 pass rate on held-out items. Same seed and same torch: same weights.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atropos.environments.arithmetic import sample_items, score_answer

__all__ = [
    "WarmStartConfig",
    "evaluate_policy",
    "evaluate_samples",
    "policy_path",
    "save_policy",
    "train",
    "warm_start",
]


def policy_path() -> Path:
    """The directory of the shipped warm-start policy (HF format)."""
    return Path(__file__).resolve().parent / "policy"


@dataclass
class WarmStartConfig:
    """How the warm start trains (defaults: the shipped policy)."""

    seed: int = 0
    steps: int = 2000
    batch_size: int = 64
    lr: float = 3e-3  # peak; linear warmup, then cosine decay to a tenth
    warmup: int = 50
    weight_decay: float = 0.01
    sloppiness: float = 0.6  # share of answers shown one too many
    train_items: int | None = None  # None: the whole training split
    log_every: int = 100
    threads: int = 1  # torch threads; results are bit-identical only for the same count


def _prompt_ids(tokenizer: Any, item: dict[str, Any]) -> list[int]:
    from atropos.inference.tokenize import template_ids

    messages = [{"role": "user", "content": item["question"]}]
    return template_ids(tokenizer, messages, add_generation_prompt=True)


Example = tuple[list[int], list[int]]


def encode_example(tokenizer: Any, item: dict[str, Any], answer: int | None = None) -> Example:
    """(input ids, labels) of one training example: the chat prompt, then the answer (default:
    the item's) and `<|im_end|>`; labels are -100 on the prompt, so only the assistant's
    tokens are trained."""
    prompt = _prompt_ids(tokenizer, item)
    text = str(item["answer"] if answer is None else answer)
    reply = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    return prompt + reply, [-100] * len(prompt) + reply


def _batch(examples: Sequence[Example], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = [x + [pad_id] * (width - len(x)) for x, _ in examples]
    labels = [y + [-100] * (width - len(y)) for _, y in examples]
    mask = [[1] * len(x) + [0] * (width - len(x)) for x, _ in examples]
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor(labels),
        "attention_mask": torch.tensor(mask),
    }


def _lr_at(step: int, config: WarmStartConfig) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    config: WarmStartConfig, log: Callable[[str], None] | None = None, model: Any = None
) -> Any:
    """Supervised training of the tiny policy (a fresh one unless `model` is given).

    Each step draws `batch_size` training items; each is shown with its sum, or with probability
    `sloppiness` with the sum plus one. Returns the model in eval mode.
    """
    import torch

    from atropos.tiny.model import build_model

    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return _train(config, log, model if model is not None else build_model(config.seed))
    finally:
        torch.set_num_threads(threads)


def _train(config: WarmStartConfig, log: Callable[[str], None] | None, model: Any) -> Any:
    import torch

    from atropos.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    items = sample_items("train", config.train_items, seed=config.seed)
    right = [encode_example(tokenizer, item) for item in items]
    sloppy = [encode_example(tokenizer, item, item["answer"] + 1) for item in items]
    model.train()
    params = list(model.named_parameters())
    groups: list[dict[str, Any]] = [
        {"params": [p for _, p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
        {"params": [p for _, p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98))
    rng = random.Random(config.seed)
    start, seen = time.monotonic(), 0.0
    for step in range(config.steps):
        picks = rng.sample(range(len(items)), config.batch_size)
        shown = [sloppy[i] if rng.random() < config.sloppiness else right[i] for i in picks]
        batch = _batch(shown, tokenizer.pad_token_id)
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, config)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seen += loss.item()
        if log and ((step + 1) % config.log_every == 0 or step + 1 == config.steps):
            n = (step % config.log_every) + 1
            log(
                f"step {step + 1}/{config.steps}  loss {seen / n:.3f}"
                f"  lr {_lr_at(step, config):.2e}  {time.monotonic() - start:.0f} s"
            )
            seen = 0.0
    model.eval()
    return model


def save_policy(model: Any, out: str | Path, config: WarmStartConfig | None = None) -> Path:
    """Write `model` and the tiny tokenizer's files to `out` (loadable by `from_pretrained`)."""
    from atropos.tiny import tokenizer_path

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for file in Path(tokenizer_path()).iterdir():
        if file.is_file():
            shutil.copyfile(file, folder / file.name)
    for file in folder.iterdir():
        file.chmod(0o644)  # (safetensors writes its file owner-only)
    if config is not None:
        (folder / "warmstart.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
    return folder


def warm_start(
    out: str | Path, config: WarmStartConfig | None = None, log: Callable[[str], None] | None = None
) -> Path:
    """Train the warm-start policy with `config` and save it to `out`."""
    config = config or WarmStartConfig()
    model = train(config, log=log)
    return save_policy(model, out, config)


def _generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], temperature: float, samples: int
) -> list[str]:
    """`samples` completions of each prompt, in prompt order (greedy when `temperature` is 0)."""
    import torch

    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            num_return_sequences=samples,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
            **sampling,
        )
    return [tokenizer.decode(row[width:], skip_special_tokens=True) for row in out]


def _load(model: str | Path | Any) -> Any:
    """A model in eval mode: loaded from a directory (None: the shipped policy) or as given."""
    loaded: Any = model
    if model is None or isinstance(model, str | Path):
        from atropos.inference.tokenizer import quiet_progress_bars

        transformers = quiet_progress_bars()
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(model or policy_path()))
    loaded.eval()
    return loaded


def _completions(
    model: Any, items: list[dict[str, Any]], temperature: float, samples: int, batch_size: int
) -> list[list[str]]:
    from atropos.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    out: list[list[str]] = []
    for i in range(0, len(items), batch_size):
        chunk = items[i : i + batch_size]
        prompts = [_prompt_ids(tokenizer, item) for item in chunk]
        texts = _generate(model, tokenizer, prompts, temperature, samples)
        out += [texts[j * samples : (j + 1) * samples] for j in range(len(chunk))]
    return out


def evaluate_samples(
    model: str | Path | Any = None, n_items: int = 200, seed: int = 0, batch_size: int = 256
) -> list[dict[str, Any]]:
    """Greedy completions of `n_items` held-out items, one row each: `question`, `answer`,
    `completion`, `correct` (a saved policy directory or a loaded model; None: the shipped one).
    """
    model = _load(model)
    items = sample_items("eval", n_items, seed=seed)
    rows = []
    for item, [text] in zip(items, _completions(model, items, 0.0, 1, batch_size), strict=True):
        rows.append({**item, "completion": text, "correct": score_answer(item, text) > 0})
    return rows


def evaluate_policy(
    model_dir: str | Path | Any = None,
    n_items: int = 200,
    seed: int = 0,
    samples: int = 8,
    batch_size: int = 256,
) -> dict[str, float]:
    """Held-out accuracy of a policy with plain transformers (batched, left-padded).

    Args:
        model_dir: a saved policy directory, or a loaded model (default: the shipped policy).
        n_items: held-out `arithmetic` items to score.
        seed: which held-out items (and the sampling seed).
        samples: completions per item at temperature 1 (0: skip sampling).
        batch_size: prompts per `generate` call.

    Returns:
        `items` and `greedy_accuracy`; when `samples`, also `pass_rate` (mean reward at
        temperature 1), `pass_at_k` (items with a right sample) and `mixed_groups` (items whose
        samples get both rewards: the groups GRPO learns from).
    """
    import torch

    model = _load(model_dir)
    rows = evaluate_samples(model, n_items, seed, batch_size)
    result = {
        "items": float(len(rows)),
        "greedy_accuracy": sum(r["correct"] for r in rows) / len(rows),
    }
    if samples:
        torch.manual_seed(seed)
        items = [{"question": r["question"], "answer": r["answer"]} for r in rows]
        texts = _completions(model, items, 1.0, samples, max(1, batch_size // samples))
        groups = [[score_answer(i, t) for t in g] for i, g in zip(items, texts, strict=True)]
        result["pass_rate"] = sum(map(sum, groups)) / (len(groups) * samples)
        result["pass_at_k"] = sum(1 for g in groups if max(g) > 0) / len(groups)
        result["mixed_groups"] = sum(1 for g in groups if 0 < sum(g) < samples) / len(groups)
    return result
