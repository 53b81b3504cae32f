"""`arithmetic`: add two numbers, the demo task a tiny model learns by RL on a laptop.

Items are "What is A + B?" with A and B in 0..99, answered with the sum and nothing else
(one to three tokens of the tiny tokenizer). Every pair is in exactly one split, fixed by a
hash of the pair, so the held-out items are never trained on. The reward is 1.0 when the whole
completion parses as the right number, else 0.0.

>>> item = make_item(12, 7)
>>> item["question"], score_answer(item, " 19"), score_answer(item, "19 apples")
('What is 12 + 7?', 1.0, 0.0)
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, ClassVar

from pydantic import Field

from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env

__all__ = [
    "Arithmetic",
    "ArithmeticConfig",
    "is_eval_pair",
    "make_item",
    "parse_answer",
    "sample_items",
    "score_answer",
]

MAX_OPERAND = 99
EVAL_SHARE = 0.2  # of all (A, B) pairs, held out
_NUMBER = re.compile(r"\s*(\d{1,4})\s*")


def is_eval_pair(a: int, b: int) -> bool:
    """Whether the pair (a, b) belongs to the held-out split (a stable hash, no seed)."""
    digest = hashlib.blake2b(f"{a}+{b}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") / 2**32 < EVAL_SHARE


def make_item(a: int, b: int) -> dict[str, Any]:
    """The item asking for `a + b`."""
    return {"question": f"What is {a} + {b}?", "answer": a + b}


def sample_items(split: str, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """`n` distinct items of `split` ("train" or "eval") in a seeded order (None: all of them)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    pairs = [
        (a, b)
        for a in range(MAX_OPERAND + 1)
        for b in range(MAX_OPERAND + 1)
        if is_eval_pair(a, b) == (split == "eval")
    ]
    random.Random(seed).shuffle(pairs)
    return [make_item(a, b) for a, b in pairs[:n]]


def parse_answer(completion: str) -> int | None:
    """The number the completion consists of (surrounding whitespace allowed), else None."""
    found = _NUMBER.fullmatch(completion)
    return int(found.group(1)) if found else None


def score_answer(item: dict[str, Any], completion: str) -> float:
    """1.0 when `completion` is exactly the right number, else 0.0."""
    return 1.0 if parse_answer(completion) == item["answer"] else 0.0


class ArithmeticConfig(BaseEnvConfig):
    """`arithmetic`'s settings: the base ones and the size of the held-out evaluation."""

    eval_items: int = Field(default=200, ge=1, description="held-out items per evaluation")


class Arithmetic(Env[ArithmeticConfig]):
    """Add two numbers below 100; reward 1 for exactly the right sum (the demo task)."""

    name = "arithmetic"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 64, "use_wandb": False, "steps_per_eval": 20,
    }  # fmt: skip
    temperature = 1.0
    max_tokens = 8  # an answer is at most 3 tokens and <|im_end|>

    def load(self) -> list[dict[str, Any]]:
        return sample_items("train", seed=self.seed)

    def load_eval(self) -> list[dict[str, Any]]:
        return sample_items("eval", self.config.eval_items, seed=self.seed)

    def score(self, item: dict[str, Any], completion: str) -> float:
        return score_answer(item, completion)
