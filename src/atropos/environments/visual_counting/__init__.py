"""`visual_counting`: count coloured shapes in a picture; +1 for the exact count, else -1.

Upstream's "multimodal DPO" environments in one: a +-1 exact-match GRPO env whose question comes
with an image. The shipped data is generated (`shapes` in this package): a seeded 128x128 PNG
of circles, squares and triangles in four colours, and a question such as "How many red circles are
in the image?". The answer goes in `<answer>N</answer>`. A hub VQA dataset can be used instead
(`--env.dataset_name howard-hou/OCR-VQA`). Images need Pillow (the `vision` extra). Details, and
what the trainer's tokens are: docs/visual_counting.md. Sampling with the picture and the
text-only copy the trainer gets are `common.vision.ImageEnv`'s, shared with the multimodal
family.

>>> parse_answer("<think>one, two</think> <answer> 2 </answer>")
'2'
>>> score_answer("<ANSWER>Red  Car</ANSWER>", "red car"), score_answer("2 or 3", "2")
(1.0, -1.0)
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.data_loading import load_hub
from atropos.environments.common.vision import (
    ImageEnv,
    image_part,
    png_base64,
    text_only,
    to_png_base64,
)
from atropos.environments.visual_counting.shapes import MAX_SHAPES, make_task, render_png
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Rollout
from atropos.envs.types import Item, Message

__all__ = [
    "EVAL_SEEDS",
    "SYSTEM_PROMPT",
    "VisualCounting",
    "VisualCountingConfig",
    "demo_responder",
    "generated_items",
    "hub_items",
    "image_base64",
    "parse_answer",
    "score_answer",
]

SYSTEM_PROMPT = (
    "You answer questions about an image. You may think briefly inside <think> </think> tags;"
    " then give only the final answer inside <answer> </answer> tags, e.g. <answer>3</answer>."
)
EVAL_SEEDS = 10**9  # evaluation scenes use seeds from here on; training ones lie below
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_DEMO_ANSWERS: dict[str, str] = {}  # item id -> answer, for `demo_responder`


def parse_answer(completion: str) -> str | None:
    """The text of the completion's one `<answer>` block after its last `</think>`, stripped;
    None when there is none, more than one, or the thinking is never closed."""
    if "</think>" in completion.lower():
        completion = re.split(r"</think>", completion, flags=re.IGNORECASE)[-1]
    elif "<think>" in completion.lower():
        return None
    found = _ANSWER.findall(completion)
    return found[0].strip() if len(found) == 1 else None


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def score_answer(completion: str, gold: str) -> float:
    """1.0 when the one answer equals `gold` up to case and whitespace, else -1.0."""
    answer = parse_answer(completion)
    return 1.0 if answer is not None and _normal(answer) == _normal(gold) else -1.0


# ----- data ------------------------------------------------------------------------------------


def generated_items(seeds: range, max_shapes: int) -> list[dict[str, Any]]:
    """Counting items for `seeds` (their pictures are drawn when first needed)."""
    items = []
    for seed in seeds:
        task = make_task(seed, max_shapes)
        items.append(
            {
                "id": str(seed),
                "question": task.question,
                "answer": task.answer,
                "seed": seed,
                "max_shapes": max_shapes,
            }
        )
    return items


def _first(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return value[0] if value else None
    return value


def hub_items(
    name: str,
    split: str,
    config: str | None = None,
    limit: int | None = None,
    fields: tuple[str, str, str] = ("image", "questions", "answers"),
) -> list[dict[str, Any]]:
    """Items from a hub VQA dataset: its (image, question, answer) `fields`, the first of each
    list (OCR-VQA keeps several questions per picture); `limit` rows of `split`."""
    image_field, question_field, answer_field = fields
    rows = load_hub(name, f"{split}[:{limit}]" if limit else split, config)
    items = []
    for n, row in enumerate(rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{name} {split} row {n}: no field {missing[0]!r} (has {sorted(row)})")
        question, answer = _first(row[question_field]), _first(row[answer_field])
        if question is None or answer is None or row[image_field] is None:
            continue
        item_id = f"{split}-{n}"
        items.append(
            {
                "id": item_id,
                "question": str(question),
                "answer": str(answer),
                "image": row[image_field],
            }
        )
    return items


@functools.lru_cache(maxsize=512)
def _rendered(seed: int, max_shapes: int) -> str:
    return png_base64(render_png(make_task(seed, max_shapes).scene))


def image_base64(item: dict[str, Any]) -> str:
    """The item's picture as base64 PNG (drawn from its seed, or converted once from the hub)."""
    if "seed" in item:
        return _rendered(item["seed"], item["max_shapes"])
    if "image_b64" not in item:
        item["image_b64"] = to_png_base64(item["image"])
    return str(item["image_b64"])


# ----- the environment -------------------------------------------------------------------------


class VisualCountingConfig(BaseEnvConfig):
    """`visual_counting`'s settings."""

    train_size: int = Field(default=10_000, ge=1, lt=EVAL_SEEDS, description="training scenes")
    eval_size: int = Field(default=100, ge=1, description="held-out scenes (or hub eval rows)")
    max_shapes: int = Field(default=8, ge=1, le=MAX_SHAPES, description="shapes per scene, at most")
    seed: int = Field(default=0, ge=0, description="first scene seed (train and eval)")
    dataset_name: str | None = Field(
        default=None, description="hub VQA dataset, e.g. howard-hou/OCR-VQA (unset: generated)"
    )
    dataset_config: str | None = Field(default=None, description="the hub dataset's config")
    hub_rows: int = Field(default=2000, ge=1, description="training rows read from the hub")
    eval_split: str = Field(default="test", description="hub split to evaluate on")
    image_field: str = Field(default="image", description="hub column holding the image")
    question_field: str = Field(default="questions", description="hub column of question(s)")
    answer_field: str = Field(default="answers", description="hub column of answer(s)")


class VisualCounting(ImageEnv[VisualCountingConfig]):
    """Answer a question about an image (count the shapes); +1 exact, else -1."""

    name = "visual_counting"
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    system_prompt = SYSTEM_PROMPT

    def _items(self, split: str) -> list[dict[str, Any]]:
        s = self.config
        if s.dataset_name:
            fields = (s.image_field, s.question_field, s.answer_field)
            name, config = s.dataset_name, s.dataset_config
            if split == "train":
                items = hub_items(name, "train", config, s.hub_rows, fields)
            else:
                items = hub_items(name, s.eval_split, config, s.eval_size, fields)
        else:
            first = s.seed + (EVAL_SEEDS if split == "eval" else 0)
            size = s.eval_size if split == "eval" else s.train_size
            items = generated_items(range(first, first + size), s.max_shapes)
        _DEMO_ANSWERS.update((i["id"], i["answer"]) for i in items)
        return items

    def load(self) -> list[dict[str, Any]]:
        return self._items("train")

    def load_eval(self) -> list[dict[str, Any]]:
        return self._items("eval")

    def image_base64(self, item: Item) -> str:
        return image_base64(item)

    def prompt(self, item: Item) -> list[Message]:
        parts = [
            image_part(image_base64(item)),
            {"type": "text", "text": f"{item['question']}\n[item {item['id']}]"},
        ]
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": parts},
        ]

    def score(self, item: Item, completion: str) -> float:
        return score_answer(completion, item["answer"])

    def score_group(
        self, item: Item, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        self.record_mean("train/percent_correct", (1.0 if s > 0 else 0.0 for s in scores))
        return self.unless_all_equal(scores)

    def eval_sample(self, item: dict[str, Any], r: Rollout, score: float) -> dict[str, Any]:
        return {
            "id": item["id"],
            "messages": text_only(self.prompt(item)),
            "completion": r.text,
            "gold": item["answer"],
            "finish_reason": r.finish_reason,
            "score": score,
        }

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """`eval/percent_correct` (the share exactly right) and `eval/mean_score`."""
        return {
            "eval/percent_correct": sum(s["score"] > 0 for s in samples) / len(samples),
            "eval/mean_score": sum(s["score"] for s in samples) / len(samples),
        }


_demo_turns = itertools.count()
_ITEM_TAG = re.compile(r"\[item ([\w.-]+)\]")


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos. It cannot see the image: it reads
    the prompt's `[item ID]` tag and looks the answer up (items this process loaded, else the
    default generated scene of seed ID); right on every other call, one too many on the others
    (mixed groups). None (random text) for other prompts. `python -m
    atropos.testing.fake_server --port 9001 --responder
    atropos.environments.visual_counting:demo_responder`."""
    found = _ITEM_TAG.findall(prompt_text)
    if not found:
        return None
    item_id = found[-1]
    answer = _DEMO_ANSWERS.get(item_id)
    if answer is None and item_id.isdigit():
        answer = make_task(int(item_id)).answer
    if answer is None:
        return None
    if next(_demo_turns) % 2:
        answer = str(int(answer) + 1) if answer.isdigit() else answer + " maybe"
    return f"<think>I look at each part of the picture in turn.</think>\n<answer>{answer}</answer>"
