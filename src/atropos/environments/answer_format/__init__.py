"""`answer_format`: answer a short question in the format the prompt asks for, one of twelve
(`formats.FORMATS`: `<answer>` tags, `\\boxed{}`, `[[...]]`, a `Final answer:` line, a
`## Answer` section, JSON, YAML, a code block, a bullet list, an XML element with attributes,
a CSV row, a markdown table), drawn per item with a seed.

Score: `(format_weight * compliant + answer_weight * right) / (format_weight + answer_weight)`,
where `compliant` is 1 when the answer part (after the one think block, with `thinking_mode`
on, the default) follows the format exactly, and `right` is 1 when it is compliant and the
answer it holds matches the gold one (`same_answer`: case, spacing, quotes and a final period
ignored; numbers compared as numbers; the row's `aliases` accepted). By default only the format
counts (`answer_weight` 0). Metrics per format: `train/format_compliance/<format>`,
`train/answer_accuracy/<format>`, and the same under `eval/`. Data: the shipped questions, or
any dataset with `--env.dataset_name` (its `question_field` and `answer_field`). Details:
docs/formats.md.
"""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from atropos.environments.answer_format.formats import FORMATS, Format
from atropos.environments.common.completions import THINKING_DEFAULTS, answer_part, conversation
from atropos.environments.common.data_loading import in_prompt
from atropos.environments.common.demo import Alternating, shipped_rows, with_thinking
from atropos.environments.common.held_out import HeldOutConfig, HeldOutEnv
from atropos.environments.common.selection import named_subset
from atropos.envs.simple import Rollout
from atropos.envs.types import Message

__all__ = [
    "FORMATS",
    "AnswerFormat",
    "AnswerFormatConfig",
    "Format",
    "demo_responder",
    "read_answer",
    "same_answer",
]


def _normal(text: str) -> str:
    text = re.sub(r"\s+", " ", text.strip().strip("\"'`*").strip()).rstrip(".").casefold()
    try:
        return str(Decimal(text.replace(",", "")).normalize())
    except InvalidOperation:
        return text


def same_answer(found: str, gold: str, aliases: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether `found` states `gold` or one of its `aliases` (case, spacing, quotes and a final
    period ignored; numbers compared as numbers).

    >>> same_answer(" paris. ", "Paris"), same_answer("1,000.0", "1000")
    (True, True)
    >>> same_answer("Lyon", "Paris"), same_answer("the Pacific", "Pacific Ocean", ["the Pacific"])
    (False, True)
    """
    return _normal(found) in {_normal(g) for g in (gold, *aliases)}


def read_answer(item: dict[str, Any], completion: str, thinking: bool) -> str | None:
    """The answer `completion` gives in `item`'s format, or None when it breaks the format."""
    body = answer_part(completion, thinking)
    return None if body is None else FORMATS[item["format"]].read(body, item["id"])


class AnswerFormatConfig(HeldOutConfig):
    """`answer_format`'s settings."""

    formats: list[str] = Field(
        default_factory=lambda: list(FORMATS),
        description="formats to draw from, as 'json,yaml,...' (unset: all twelve)",
    )
    format_weight: float = Field(default=1.0, ge=0, description="weight of following the format")
    answer_weight: float = Field(
        default=0.0, ge=0, description="weight of a right answer inside the format"
    )
    question_field: str = Field(default="question", description="the dataset's question field")
    answer_field: str = Field(default="answer", description="the dataset's answer field")

    @field_validator("formats", mode="before")
    @classmethod
    def _known_formats(cls, value: Any) -> list[str]:
        return named_subset(value, FORMATS, "format")

    @model_validator(mode="after")
    def _some_weight(self) -> AnswerFormatConfig:
        if self.format_weight + self.answer_weight <= 0:
            raise ValueError("format_weight + answer_weight must be above 0")
        return self


class AnswerFormat(HeldOutEnv[AnswerFormatConfig]):
    """Short questions, each to be answered in a format drawn from twelve."""

    name = "answer_format"
    config_defaults: ClassVar[dict[str, Any]] = {**THINKING_DEFAULTS}

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        s = self.config
        question, answer = row.get(s.question_field), row.get(s.answer_field)
        if not str(question or "").strip() or answer is None or not str(answer).strip():
            raise ValueError(f"{where}: needs a {s.question_field!r} and an {s.answer_field!r}")
        aliases = [str(a) for a in row.get("aliases") or []]
        key = str(row.get("id") or "q" + re.sub(r"\D", "", where.rsplit(" ", 1)[-1]))
        return {"id": key, "question": str(question), "answer": str(answer), "aliases": aliases}

    def load_eval(self) -> list[dict[str, Any]]:
        """The test questions, the formats taken in turn (each format as often as it can be)."""
        formats = itertools.cycle(self.config.formats)
        return [{**row, "format": next(formats)} for row in self.load_split("test")]

    async def setup(self) -> None:
        await super().setup()
        self._rng = random.Random(self.seed)

    async def get_next_item(self) -> dict[str, Any]:
        return {**self._passes.next(), "format": self._rng.choice(self.config.formats)}

    def prompt(self, item: Any) -> list[Message]:
        ask = FORMATS[item["format"]].ask(item["id"])
        return conversation(self.config, f"{item['question']}\n\n{ask}")

    def judge(self, item: dict[str, Any], completion: str) -> tuple[bool, bool]:
        """(compliant, right) for one completion."""
        found = read_answer(item, completion, self.config.thinking_mode)
        right = found is not None and same_answer(found, item["answer"], item["aliases"])
        return found is not None, right

    def score(self, item: Any, completion: str) -> float:
        s = self.config
        compliant, right = self.judge(item, completion)
        total = s.format_weight * compliant + s.answer_weight * right
        return total / (s.format_weight + s.answer_weight)

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        verdicts = [self.judge(item, r.text) for r in rollouts]
        for suffix in ("", f"/{item['format']}"):
            self.record_mean(f"train/format_compliance{suffix}", (float(c) for c, _ in verdicts))
            self.record_mean(f"train/answer_accuracy{suffix}", (float(r) for _, r in verdicts))
        return self.unless_all_equal(scores)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        compliant, right = self.judge(item, r.text)
        return {**item, "completion": r.text, "finish_reason": r.finish_reason, "score": score,
                "compliant": compliant, "right": right}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Mean score, compliance and accuracy, overall and per format."""
        found = {"eval/mean_score": sum(s["score"] for s in samples) / len(samples)}
        found.update(_rates(samples, ""))
        for name in sorted({s["format"] for s in samples}):
            found.update(_rates([s for s in samples if s["format"] == name], f"/{name}"))
        return found


def _rates(samples: list[dict[str, Any]], suffix: str) -> dict[str, float]:
    n = len(samples)
    return {
        f"eval/format_compliance{suffix}": sum(s["compliant"] for s in samples) / n,
        f"eval/answer_accuracy{suffix}": sum(s["right"] for s in samples) / n,
    }


_turns = Alternating()


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: on every other call the right answer
    in the asked format, on the others the bare answer (no format); None (random text) for
    prompts about no shipped question. `python -m atropos.testing.fake_server --port 9001
    --responder atropos.environments.answer_format:demo_responder`."""
    row = in_prompt(shipped_rows("answer_format", "question"), prompt_text)
    asked = [f for f in FORMATS.values() if f.ask(row["id"]) in prompt_text] if row else []
    if row is None or len(asked) != 1:
        return None
    body = asked[0].write(row["answer"], row["id"]) if _turns.right() else row["answer"]
    return with_thinking(prompt_text, "I recall the answer, then write it as asked.", body)
