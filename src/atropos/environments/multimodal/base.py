"""`VisionEnv`: what the multimodal environments share (items, prompt, sampling, groups, metrics).

An env of the family says how to make an item from a seed (`make_item`) and draw it
(`draw`), how to read a row of its hub dataset (`hub_item`), and how to judge an answer
(`judge`); this class does the rest:

- **Items.** Generated from seeds `seed ..` for training and `10**9 + seed ..` for evaluation,
  or read from `--env.dataset_name` (`hub_rows` rows of `train`, `eval_size` of `eval_split`).
  An item id is the env's `kind` and its seed (`clock-17`), or its split and row
  (`clock-test-3`).
- **Prompt.** A system turn saying how to answer (`<answer>` tags or `\\boxed{}`), then a user
  turn holding the picture (an `image_url` data URL) and the question with an `[item ID]` tag
  that the offline demo responder reads.
- **Sampling.** `common.vision.ImageEnv`'s: every server type gets the conversation, picture
  included, through its chat completions; the trainer's tokens are the text-only copy
  retokenized (`token_source: "retokenized"`, the picture as `<image>`), and the group's
  `images` holds the base64 PNG once per sequence. TRL's text-only `/generate/` is refused at
  setup.
- **Scores.** `judge` gives a `Verdict`: +1 right, -1 otherwise (upstream's rule; no format
  term, as upstream had none), whether an answer was read, and numbers worth averaging. Groups
  whose scores are all equal are dropped; `train/percent_correct`, `train/answered`, the
  share right per question `category` and the env's measures are logged, and the same with
  `eval/` for an evaluation.

Items whose picture cannot be had (a dead URL) give no group (`dropped/image_unavailable`,
`ImageEnv`'s rule), never a stand-in question. Details: docs/multimodal.md.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field
from typing_extensions import TypeVar

from atropos.environments.common.data_loading import load_hub
from atropos.environments.common.vision import (
    ImageEnv,
    ImageUnavailable,
    image_part,
    png_base64,
    text_only,
    to_png_base64,
)
from atropos.environments.multimodal.answers import AnswerStyle, read_answer, same_answer
from atropos.environments.multimodal.images import fetch_url
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Rollout
from atropos.envs.types import Item, Message

__all__ = ["EVAL_SEEDS", "KINDS", "LOADED", "Verdict", "VisionConfig", "VisionEnv", "item_tag"]

EVAL_SEEDS = 10**9  # evaluation items use seeds from here on; training ones lie below
KINDS: dict[str, type[VisionEnv[Any]]] = {}  # item id prefix -> the env class that makes them
LOADED: dict[str, dict[str, Any]] = {}  # item id -> item, every item loaded in this process


def item_tag(item_id: str) -> str:
    """The tag that ends a question, naming its item for the offline demo responder."""
    return f"[item {item_id}]"


@dataclass(frozen=True)
class Verdict:
    """How one completion fared: its `score`, whether an answer could be read at all, and
    numbers the env averages into metrics (`{"minute_error": 3.0}`)."""

    score: float
    answered: bool
    measures: Mapping[str, float] = field(default_factory=dict)


class VisionConfig(BaseEnvConfig):
    """The settings every multimodal environment has."""

    train_size: int = Field(default=10_000, ge=1, lt=EVAL_SEEDS, description="training pictures")
    eval_size: int = Field(default=100, ge=1, description="held-out pictures (or hub eval rows)")
    seed: int = Field(default=0, ge=0, description="first picture seed (train and eval)")
    answer_format: AnswerStyle = Field(
        default="tags", description="how to answer: tags (<answer>), boxed (\\boxed{}) or either"
    )
    dataset_name: str | None = Field(
        default=None, description="hub dataset to read instead of generated pictures"
    )
    dataset_config: str | None = Field(default=None, description="the hub dataset's config")
    hub_rows: int = Field(default=2000, ge=1, description="training rows read from the hub")
    eval_split: str = Field(
        default="test",
        description="hub split to evaluate on (train: the eval_size rows after the training rows)",
    )
    image_cache: int = Field(default=512, ge=1, description="pictures kept encoded in memory")


VisionConfigT = TypeVar("VisionConfigT", bound=VisionConfig, default=VisionConfig)


class VisionEnv(ImageEnv[VisionConfigT]):
    """A question about a picture, answered in `<answer>` tags or `\\boxed{}`; +1 right, else -1."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = VisionConfig  # the generic default's
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    kind: ClassVar[str] = ""  # the prefix of generated item ids (`clock`)
    task: ClassVar[str] = "You answer questions about a picture."  # the system turn's opening
    example: ClassVar[str] = "3"  # an answer, shown in the system turn
    synonyms: ClassVar[Mapping[str, str]] = {}  # normalised word -> the word it means
    hub_fields: ClassVar[tuple[str, ...]] = ()  # the hub columns `hub_item` reads

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            KINDS[cls.kind] = cls

    # ----- what each env says ----------------------------------------------------------------

    @classmethod
    @abstractmethod
    def make_item(cls, config: VisionConfigT, seed: int) -> dict[str, Any]:
        """What the item of `seed` holds besides its id and seed: `question`, `answer`,
        `category` and whatever `draw` needs (JSON values), from the settings in `config`."""

    @classmethod
    def generated_item(cls, config: VisionConfigT, seed: int) -> dict[str, Any]:
        """The item of `seed`: its id (`clock-17`), its seed, and what `make_item` gives."""
        return {"id": f"{cls.kind}-{seed}", "seed": seed, **cls.make_item(config, seed)}

    @classmethod
    @abstractmethod
    def draw(cls, item: Mapping[str, Any]) -> Any:
        """The picture of a generated item (a PIL image)."""

    def hub_item(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The items of one hub row (`question`, `answer`, `category`, and an `image`,
        `image_b64` or `image_url` with its `image_sha256` when known); none to skip the row.
        Default: no hub dataset can be read."""
        raise ValueError(f"{self.name} reads no hub dataset")

    def judge(self, item: Mapping[str, Any], answer: str | None) -> Verdict:
        """The verdict on `answer` (None: none could be read). Default: +1 when it says the
        item's answer (`answers.same_answer`, with the env's `synonyms`), else -1."""
        right = answer is not None and same_answer(answer, item["answer"], self.synonyms)
        return Verdict(1.0 if right else -1.0, answer is not None)

    @classmethod
    def wrong_answer(cls, item: Mapping[str, Any]) -> str:
        """A plausible wrong answer, for the demo responder: a count one too high, yes for no
        (and no for yes), else "I cannot tell"."""
        gold = str(item["answer"])
        if gold.isdigit():
            return str(int(gold) + 1)
        flipped = {"yes": "no", "no": "yes"}.get(gold.lower())
        return flipped or "I cannot tell"

    # ----- items -----------------------------------------------------------------------------

    def _hub_rows(self, split: str) -> tuple[list[dict[str, Any]], str, int]:
        """(rows, their split, the index of the first): `hub_rows` rows of train, or
        `eval_size` rows of `eval_split`, which follow the training rows when it is train."""
        s = self.config
        name, config = str(s.dataset_name), s.dataset_config
        if split == "train":
            return load_hub(name, f"train[:{s.hub_rows}]", config), "train", 0
        if s.eval_split == "train":  # a dataset with one split: hold out the rows after
            end = s.hub_rows + s.eval_size
            return load_hub(name, f"train[{s.hub_rows}:{end}]", config), "train", s.hub_rows
        return load_hub(name, f"{s.eval_split}[:{s.eval_size}]", config), s.eval_split, 0

    def _from_hub(self, split: str) -> list[dict[str, Any]]:
        rows, hub_split, first = self._hub_rows(split)
        items = []
        for n, row in enumerate(rows, first):
            missing = [f for f in self.hub_fields if f not in row]
            if missing:
                raise ValueError(
                    f"{self.config.dataset_name} {hub_split} row {n}: no field {missing[0]!r}"
                    f" (has {sorted(row)}); {self.name} reads {', '.join(self.hub_fields)}"
                )
            found = self.hub_item(row)
            for k, item in enumerate(found):
                suffix = f"-{k}" if len(found) > 1 else ""
                items.append({"id": f"{self.kind}-{hub_split}-{n}{suffix}", **item})
        return items

    def _items(self, split: str) -> list[dict[str, Any]]:
        s = self.config
        if s.dataset_name:
            items = self._from_hub(split)
        else:
            first = s.seed + (EVAL_SEEDS if split == "eval" else 0)
            size = s.eval_size if split == "eval" else s.train_size
            items = [self.generated_item(s, seed) for seed in range(first, first + size)]
        LOADED.update((str(item["id"]), item) for item in items)  # for the demo responder
        return items

    def load(self) -> list[dict[str, Any]]:
        return self._items("train")

    def load_eval(self) -> list[dict[str, Any]]:
        pending = self.__dict__.pop("_eval_items", None)  # set by `evaluate`: pictures at hand
        return pending if pending is not None else self._items("eval")

    def image_base64(self, item: dict[str, Any]) -> str:
        """The item's picture as base64 PNG: drawn from its seed, converted from the hub, or
        downloaded (ImageUnavailable when that fails); the last `image_cache` are kept, and
        worker threads may ask at once."""
        cache: collections.OrderedDict[str, str] = self.__dict__.setdefault(
            "_images", collections.OrderedDict()
        )
        lock: threading.Lock = self.__dict__.setdefault("_images_lock", threading.Lock())
        key = str(item["id"])
        held: dict[str, str] = self.__dict__.get("_eval_images", {})
        if key in held:
            return held[key]
        with lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        b64 = self.make_image(item)
        with lock:
            cache[key] = b64
            while len(cache) > self.config.image_cache:
                cache.popitem(last=False)
        return b64

    def make_image(self, item: dict[str, Any]) -> str:
        """The item's picture as base64 PNG, made afresh (see `image_base64`)."""
        if "seed" in item:
            return png_base64(self.draw(item))
        if item.get("image_b64"):
            return str(item["image_b64"])
        if item.get("image") is not None:
            source, raw = "its hub image", item["image"]
        elif item.get("image_url"):
            source = str(item["image_url"])
            raw = fetch_url(source, item.get("image_sha256"))
        else:
            raise ImageUnavailable(f"item {item['id']} has no picture")
        try:
            return to_png_base64(raw)
        except Exception as e:  # Pillow's UnidentifiedImageError, a truncated file ...
            raise ImageUnavailable(f"item {item['id']}: {source} is not an image ({e})") from e

    # ----- prompt and scores -----------------------------------------------------------------

    def system_prompt_text(self) -> str:
        """The system turn: the task, then how to give the answer."""
        if self.config.answer_format == "boxed":
            form = f"give only the final answer inside \\boxed{{}}, e.g. \\boxed{{{self.example}}}"
        else:
            form = (
                "give only the final answer inside <answer> </answer> tags, e.g."
                f" <answer>{self.example}</answer>"
            )
        return f"{self.task} You may think briefly inside <think> </think> tags; then {form}."

    def prompt(self, item: Item) -> list[Message]:
        parts = [
            image_part(self.image_base64(item)),
            {"type": "text", "text": f"{item['question']}\n{item_tag(item['id'])}"},
        ]
        return [
            {"role": "system", "content": self.system_prompt_text()},
            {"role": "user", "content": parts},
        ]

    def verdict(self, item: Mapping[str, Any], completion: str) -> Verdict:
        """`judge` of the answer read from `completion` in the configured form."""
        return self.judge(item, read_answer(completion, self.config.answer_format))

    def score(self, item: Item, completion: str) -> float:
        return self.verdict(item, completion).score

    def _record(self, prefix: str, item: Mapping[str, Any], verdicts: Sequence[Verdict]) -> None:
        right = [1.0 if v.score > 0 else 0.0 for v in verdicts]
        self.record_mean(f"{prefix}/percent_correct", right)
        self.record_mean(f"{prefix}/percent_correct_{item['category']}", right)
        self.record_mean(f"{prefix}/answered", (1.0 if v.answered else 0.0 for v in verdicts))
        for v in verdicts:
            for key, value in v.measures.items():
                self.record_mean(f"{prefix}/{key}", [value])

    def score_group(
        self, item: Item, rollouts: list[Rollout], scores: list[float]
    ) -> list[float] | None:
        self._record("train", item, [self.verdict(item, r.text) for r in rollouts])
        return self.unless_all_equal(scores)

    # ----- evaluation ------------------------------------------------------------------------

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """`Env.evaluate`, with each item's picture had first (items without one are left out
        and counted in `eval/images_unavailable`)."""
        items = list(self.load_eval())
        held: dict[str, str] = {}  # this evaluation's pictures, whatever the cache drops
        kept = await asyncio.gather(*(self._hold_image(i, held) for i in items))
        self.__dict__["_eval_missing"] = sum(1 for k in kept if not k)
        self.__dict__["_eval_items"] = [i for i, k in zip(items, kept, strict=True) if k]
        self.__dict__["_eval_images"] = held
        try:
            return await super().evaluate(*args, **kwargs)
        finally:
            self.__dict__.pop("_eval_images", None)

    async def _hold_image(self, item: dict[str, Any], held: dict[str, str]) -> bool:
        """Whether the eval item's picture could be had (then kept in `held`)."""
        try:
            held[str(item["id"])] = await asyncio.to_thread(self.image_base64, item)
        except ImageUnavailable:
            return False
        return True

    def eval_sample(self, item: dict[str, Any], rollout: Rollout, score: float) -> dict[str, Any]:
        verdict = self.verdict(item, rollout.text)
        return {
            "id": item["id"],
            "category": item["category"],
            "messages": text_only(self.prompt(item)),
            "completion": rollout.text,
            "gold": item["answer"],
            "finish_reason": rollout.finish_reason,
            "score": score,
            "answered": verdict.answered,
            "measures": dict(verdict.measures),
        }

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """`eval/percent_correct`, `eval/mean_score`, `eval/answered`, the share right per
        category (`eval/percent_correct_<category>`) and the mean of each measure."""
        groups: dict[str, list[float]] = collections.defaultdict(list)
        for s in samples:
            right = 1.0 if s["score"] > 0 else 0.0
            groups["percent_correct"].append(right)
            groups[f"percent_correct_{s['category']}"].append(right)
            groups["mean_score"].append(float(s["score"]))
            groups["answered"].append(1.0 if s["answered"] else 0.0)
            for key, value in s["measures"].items():
                groups[key].append(float(value))
        metrics = {f"eval/{key}": sum(v) / len(v) for key, v in groups.items()}
        metrics["eval/images_unavailable"] = float(self.__dict__.get("_eval_missing", 0))
        return metrics
