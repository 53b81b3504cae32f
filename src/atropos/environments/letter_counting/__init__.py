"""`letter_counting`: count letters in words and random strings, with a 10-tier curriculum.

Items are generated at the current tier (`letters.TIERS`): tiers 1-5 pick a word of the tier's
length from the shipped word list (`data/letter_counting/words.txt`, 95% of it after a seed-42
shuffle), tiers 6-10 a random a-z string. One letter or several are asked for, biased towards
letters present in the text. The answer goes in `<answer>N</answer>`, or `<answer>{JSON}</answer>`
for several letters, after exactly one `<think>...</think>`. Score 1.0/0.0; a truncated
completion scores 0. The tier moves on a rolling window of group means at the current tier
(`letters.Curriculum`); groups with a mean above 0.8 or below 0.2 are not trained on but still
count for it. Evaluation: the shipped eval set, or `NousResearch/Letter-Counting-Eval`.
Details: docs/text_tasks.md.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from pydantic import Field

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.letter_counting.letters import (
    Curriculum,
    make_item,
    parse_answer,
    parse_expected,
    read_words,
    score_answer,
    split_words,
)
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message
from atropos.rewards.group import MIN_TRAINED_TOKENS

__all__ = ["LetterCounting", "LetterCountingConfig", "demo_responder"]


class LetterCountingConfig(BaseEnvConfig):
    """`letter_counting`'s settings."""

    starting_difficulty_level: int = Field(default=3, ge=1, le=10, description="first tier")
    min_difficulty_level: int = Field(default=1, ge=1, le=10, description="lowest tier")
    max_difficulty_level: int = Field(default=10, ge=1, le=10, description="highest tier")
    difficulty_window_size: int = Field(default=150, ge=1, description="groups in the window")
    difficulty_increase_threshold: float = Field(
        default=0.8, description="window mean above which the tier rises (and groups are skipped)"
    )
    difficulty_decrease_threshold: float = Field(
        default=0.2, description="window mean below which the tier falls (and groups are skipped)"
    )
    word_list: str | None = Field(default=None, description="word file (unset: the shipped one)")
    eval_dataset_name: str | None = Field(
        default=None, description="hub eval set, e.g. NousResearch/Letter-Counting-Eval"
    )
    eval_temperature: float = Field(default=0.6, ge=0, description="sampling temperature of eval")
    seed: int = Field(default=42, description="seed of the word split and the item generator")


class LetterCounting(Env[LetterCountingConfig]):
    """Count letters; a curriculum of ten tiers follows the policy's success rate."""

    name = "letter_counting"
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}

    @property
    def curriculum(self) -> Curriculum:
        """The curriculum state (created at the starting tier on first use)."""
        if "_curriculum" not in self.__dict__:
            s = self.config
            self.__dict__["_curriculum"] = Curriculum(
                s.starting_difficulty_level,
                s.difficulty_window_size,
                s.difficulty_increase_threshold,
                s.difficulty_decrease_threshold,
                s.min_difficulty_level,
                s.max_difficulty_level,
            )
        return cast(Curriculum, self.__dict__["_curriculum"])

    def load(self) -> list[str]:
        """The training words (items are generated from them)."""
        return split_words(read_words(self.config.word_list), self.config.seed)[0]

    def load_eval(self) -> list[dict[str, Any]]:
        name = self.config.eval_dataset_name
        where = name or str(data_path("letter_counting", "eval.jsonl"))
        rows = load_hub(name, "train") if name else read_jsonl(where)
        items = []
        for number, row in enumerate(rows, 1):
            try:
                expected = parse_expected(row["Answer"])
            except (KeyError, ValueError) as e:
                raise ValueError(f"{where} row {number}: {e}") from None
            level = int(row.get("DifficultyLevel") or 0)
            items.append({"prompt": row["Prompt"], "expected": expected, "level": level})
        return items

    async def setup(self) -> None:
        self.words = self.load()
        if not self.words:
            raise ValueError("letter_counting: the word list is empty")
        self._rng = random.Random(self.config.seed)
        self.iter = getattr(self, "iter", 0)

    async def get_next_item(self) -> dict[str, Any]:
        self.iter += 1
        return make_item(self.curriculum.level, self.words, self._rng)

    def prompt(self, item: Any) -> list[Message]:
        return [{"role": "user", "content": item["prompt"]}]  # upstream: no system prompt

    def score(self, item: Any, completion: str) -> float:
        return score_answer(completion, item["expected"])

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        scores = [
            0.0 if r.finish_reason == "length" else s for r, s in zip(rollouts, scores, strict=True)
        ]
        trained = [r.trained_tokens for r in rollouts]
        kept = [s for s, n in zip(scores, trained, strict=True) if n >= MIN_TRAINED_TOKENS]
        multiple = isinstance(item["expected"], Mapping)
        self.record_mean(
            "errors/format_error_rate",
            (float(parse_answer(r.text, multiple) is None) for r in rollouts),
        )
        if not kept:
            self.drop("too_short")
            return None
        self.record_mean("train/percent_correct", kept)
        mean = sum(kept) / len(kept)
        self.curriculum.record(mean, item["level"])  # before any skip: every group counts
        s = self.config
        if len(kept) < len(scores):  # a near-empty completion drops the group
            self.drop("too_short")
            return None
        if mean > s.difficulty_increase_threshold:
            self.drop("too_easy")
            return None
        if mean < s.difficulty_decrease_threshold:
            self.drop("too_hard")
            return None
        return self.unless_all_equal(scores)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(metrics or {})
        c = self.curriculum
        metrics["curriculum/difficulty_level"] = c.level
        metrics["curriculum/samples_in_window"] = len(c.scores)
        if c.success_rate is not None:
            metrics["curriculum/recent_success_rate"] = c.success_rate
        await super().wandb_log(metrics)

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "iter": getattr(self, "iter", 0),
            "level": self.curriculum.level,
            "recent_scores": list(self.curriculum.scores),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        self.iter = int(state.get("iter", 0))
        self.curriculum.level = int(state.get("level", self.curriculum.level))
        self.curriculum.scores = [float(s) for s in state.get("recent_scores", [])]

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        score = score_answer(r.text, item["expected"])
        return {**item, "completion": r.text, "finish_reason": r.finish_reason, "score": score}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Overall and per-tier accuracy."""
        found = {"eval/percent_correct": sum(s["score"] for s in samples) / len(samples)}
        for level in sorted({s["level"] for s in samples}):
            at = [s["score"] for s in samples if s["level"] == level]
            found[f"eval/percent_correct_L{level}"] = sum(at) / len(at)
        return found


_demo_turns = itertools.count()
_SINGLE = re.compile(r"How many ([a-z])s are in the string ([a-z]+)\?")
_MULTI = re.compile(r"Count the occurrences of the letters (.+?) in the string ([a-z]+)\n")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: the right count on every other call
    and one too many on the others (mixed groups); None (random text) for other prompts.
    `python -m atropos.testing.fake_server --port 9001 --responder
    atropos.environments.letter_counting:demo_responder`."""
    if m := _SINGLE.search(prompt_text):
        letters, text = [m.group(1)], m.group(2)
    elif m := _MULTI.search(prompt_text):
        letters, text = re.findall(r"'([a-z])'", m.group(1)), m.group(2)
    else:
        return None
    counts = {letter: text.count(letter) for letter in letters}
    if next(_demo_turns) % 2:
        counts[letters[0]] += 1
    answer = json.dumps(counts) if len(letters) > 1 else str(counts[letters[0]])
    thinking = "I go through the string one letter at a time and keep a tally for each letter."
    return f"<think>{thinking}</think>\n<answer>{answer}</answer>"
