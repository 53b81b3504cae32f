"""`text_reversal`: write a text backwards, character by character, in <reversed_text> tags.

The target is `text[::-1]`. With `thinking_mode` (on by default) a completion needs exactly
one `<think>...</think>` block and only what follows it is read. That part must hold exactly
one `<reversed_text>...</reversed_text>` block whose stripped content equals the target:
1.0, else 0.0. Groups holding a completion under 10 tokens, or (with
`ensure_scores_are_not_same`) equal scores, are dropped. Data: the shipped fixture, a hub
dataset (`--env.train_dataset NousResearch/TextReversalDataset`) or a local JSONL file with a
`text` field. Details: docs/text_tasks.md.

>>> score_reversal("<think>backwards</think><reversed_text>cba</reversed_text>", "abc")
1.0
>>> score_reversal("<reversed_text>cba</reversed_text>", "abc")  # thinking is required
0.0
>>> score_reversal("<reversed_text> cba </reversed_text>", "abc", thinking=False)
1.0
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.completions import THINKING_PROMPT
from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Message
from atropos.rewards.group import too_short
from atropos.rewards.text import split_think, tagged

__all__ = [
    "THINKING_PROMPT",
    "TextReversal",
    "TextReversalConfig",
    "demo_responder",
    "extract_reversal",
    "instruction",
    "load_texts",
    "score_reversal",
]


def instruction(text: str) -> str:
    """The user turn asking for `text` reversed."""
    return (
        "Reverse the characters of the following text, and wrap the reversed text in"
        f" <reversed_text> </reversed_text> tags.\n\nThe text to reverse:\n{text}"
    )


def extract_reversal(completion: str, thinking: bool = True) -> str | None:
    """The stripped content of the completion's one <reversed_text> block (after its one think
    block when `thinking`), or None when the format is broken."""
    body = split_think(completion) if thinking else completion
    if body is None or body.count("<reversed_text>") != 1:
        return None
    blocks = tagged(body, "reversed_text")
    return blocks[0].strip() if len(blocks) == 1 else None


def score_reversal(completion: str, text: str, thinking: bool = True) -> float:
    """1.0 when the completion's reversed text is exactly `text[::-1]` (both stripped)."""
    found = extract_reversal(completion, thinking)
    return 1.0 if found is not None and found == text[::-1].strip() else 0.0


def load_texts(source: str | None, split: str) -> list[dict[str, str]]:
    """Items (`{"text": ...}`) from the shipped fixture (`source` unset), a local JSONL file
    (the split is ignored), or a hub dataset's `split`; rows without text are skipped."""
    if not source:
        rows = read_jsonl(data_path("text_reversal", f"{split}.jsonl"))
    elif Path(source).is_file():
        rows = read_jsonl(source)
    else:
        rows = load_hub(source, split)
    return [{"text": str(r["text"])} for r in rows if str(r.get("text") or "").strip()]


class TextReversalConfig(BaseEnvConfig):
    """`text_reversal`'s settings (`thinking_mode` and `custom_thinking_prompt` are inherited)."""

    train_dataset: str | None = Field(
        default=None, description="hub dataset or local JSONL (unset: the shipped fixture)"
    )
    eval_dataset: str | None = Field(
        default=None, description="hub dataset or local JSONL for eval (unset: the fixture)"
    )
    train_split: str = Field(default="train", description="hub split for training")
    eval_split: str = Field(default="test", description="hub split for evaluation")
    custom_base_system_prompt: str | None = Field(
        default=None, description="system prompt text (after the thinking prompt, if any)"
    )
    eval_temperature: float = Field(default=0.6, ge=0, description="sampling temperature of eval")
    eval_max_tokens: int | None = Field(
        default=None, ge=1, description="completion length of eval (unset: max_token_length)"
    )


class TextReversal(Env[TextReversalConfig]):
    """Reverse a text character by character; 1.0 for an exact reversal, else 0.0."""

    name = "text_reversal"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "use_wandb": False, "thinking_mode": True
    }  # fmt: skip
    seed = 42  # upstream's shuffle seed

    def load(self) -> list[dict[str, str]]:
        return load_texts(self.config.train_dataset, self.config.train_split)

    def load_eval(self) -> list[dict[str, str]]:
        return load_texts(self.config.eval_dataset, self.config.eval_split)

    def prompt(self, item: Any) -> list[Message]:
        s = self.config
        parts = [s.custom_thinking_prompt or THINKING_PROMPT] if s.thinking_mode else []
        parts += [s.custom_base_system_prompt] if s.custom_base_system_prompt else []
        system: list[Message] = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
        return [*system, {"role": "user", "content": instruction(item["text"])}]

    def score(self, item: Any, completion: str) -> float:
        return score_reversal(completion, item["text"], self.config.thinking_mode)

    def score_group(
        self, item: Any, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        if too_short([r.trained_tokens for r in rollouts]):
            self.drop("too_short")
            return None
        self.record_mean("train/percent_correct", scores)
        thinking = self.config.thinking_mode
        formatted = [extract_reversal(r.text, thinking) is not None for r in rollouts]
        self.record_mean("train/format_compliance", (float(ok) for ok in formatted))
        return self.unless_all_equal(scores)

    def eval_params(self) -> dict[str, Any]:
        """`eval_temperature`, and `eval_max_tokens` when set."""
        most = self.config.eval_max_tokens
        return {**super().eval_params(), **({"max_tokens": most} if most else {})}

    def eval_sample(self, item: Any, r: Rollout, score: float) -> dict[str, Any]:
        found = extract_reversal(r.text, self.config.thinking_mode)
        return {"text": item["text"], "completion": r.text, "reversed": found, "score": score,
                "finish_reason": r.finish_reason}  # fmt: skip

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """One sample per eval text: accuracy, format compliance and mean answer length."""
        n = len(samples)
        return {
            "eval/percent_correct": sum(x["score"] for x in samples) / n,
            "eval/format_compliance": sum(x["reversed"] is not None for x in samples) / n,
            "eval/avg_response_chars": sum(len(x["completion"]) for x in samples) / n,
        }


_demo_turns = itertools.count()
_TEXT = re.compile(r"The text to reverse:\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos: the exact reversal on every other
    call and one character too many on the others (mixed groups); None (random text) for
    other prompts. `python -m atropos.testing.fake_server --port 9001 --responder
    atropos.environments.text_reversal:demo_responder`."""
    found = _TEXT.findall(prompt_text)
    if not found:
        return None
    reversed_text = found[-1].strip()[::-1]
    if next(_demo_turns) % 2:
        reversed_text += reversed_text[-1:]
    thinking = "I read the text from its last character back to its first one."
    return f"<think>{thinking}</think>\n<reversed_text>{reversed_text}</reversed_text>"
