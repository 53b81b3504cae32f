"""`pixmo_count`: count (or point at) the objects of one kind among others, PixMo-Count's way.

Upstream's `pixmo_count` (atroposlib 0.4.0's "multimodal DPO" family) asked "how many {label}
are in the image?" about `allenai/pixmo-count`'s web photos, fetched at run time. Here the
pictures are generated from a seed: a 256x256 picture with 0 to `max_count` icons of the asked
kind (stars, hearts, diamonds, crosses, hexagons, arrows) scattered among distractors of other
kinds, in mixed colours and sizes, never touching. Two tasks (`--env.task count|point|mix`):

- **count**: "How many stars are in the image?", answered `<answer>3</answer>`, compared
  numerically; `count_error` is the distance of the counts read;
- **point**: "Point to every star in the image." answered with Molmo's points, in per cent of
  the width and height, inside the answer tags: `<answer><points x1="12.5" y1="40.0" x2="61.0"
  y2="75.5" alt="stars">stars</points></answer>`. A point hits an icon when it lies on it (its
  radius, plus 2 pixels); each icon takes one point. With `--env.points_reward exact` (the
  default) it is +1 when every icon is hit once and no point misses, else -1; with `f1`,
  2 F1 - 1. `point_f1` and `count_error` (points given against icons shown) are measured.

The hub's rows read with `--env.dataset_name allenai/pixmo-count` (`image_url`, `image_sha256`,
`label`, `count`; count questions): each picture is downloaded when first needed and checked
against its hash; one that cannot be had drops its item (`dropped/image_unavailable`), where
upstream put a "2 + 2" question in its place.

>>> read_points('<points x1="10" y1="20.5" x2="30" y2="40" alt="stars">stars</points>')
[(10.0, 20.5), (30.0, 40.0)]
>>> read_points('<point x="50.0" y="50.0" alt="arrow">arrow</point>'), read_points("none")
([(50.0, 50.0)], [])
>>> points_text([(10.0, 20.5)], "stars")
'<points x1="10.0" y1="20.5" alt="stars">stars</points>'
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from atropos.environments.multimodal.answers import as_number
from atropos.environments.multimodal.base import Verdict, VisionConfig, VisionEnv
from atropos.environments.multimodal.drawing import ICON_KINDS, RGB, canvas, draw_icon, place

__all__ = ["PixmoConfig", "PixmoCount", "hits", "make_picture", "points_text", "read_points"]

SIZE = 256
PLURALS = {
    "star": "stars",
    "heart": "hearts",
    "diamond": "diamonds",
    "cross": "crosses",
    "hexagon": "hexagons",
    "arrow": "arrows",
}
BACKGROUNDS: tuple[RGB, ...] = ((250, 248, 240), (226, 238, 250), (236, 246, 228), (248, 232, 236))
PAINTS: tuple[RGB, ...] = (
    (200, 40, 40),
    (40, 90, 200),
    (30, 140, 60),
    (230, 160, 0),
    (130, 50, 170),
    (0, 150, 160),
)
SLACK = 2.0  # pixels beyond an icon's radius where a point still hits it
_POINT_TAG = re.compile(r"<points?\b([^>]*)>", re.IGNORECASE)
_COORD = re.compile(r"\b([xy])(\d*)\s*=\s*\"\s*([-+]?\d+(?:\.\d+)?)\s*\"", re.IGNORECASE)


class PixmoConfig(VisionConfig):
    """`pixmo_count`'s settings."""

    task: Literal["count", "point", "mix"] = Field(
        default="count", description="count the icons, point at them, or half of each"
    )
    max_count: int = Field(default=10, ge=1, le=20, description="icons of the asked kind, at most")
    max_distractors: int = Field(default=6, ge=0, le=12, description="other icons, at most")
    points_reward: Literal["exact", "f1"] = Field(
        default="exact", description="pointing: +1 only when exact, or 2 F1 - 1"
    )
    eval_split: str = Field(default="test", description="hub split to evaluate on")


def read_points(text: str) -> list[tuple[float, float]]:
    """The (x, y) points of every `<point x= y=>` or `<points x1= y1= ...>` tag, in order."""
    found: list[tuple[float, float]] = []
    for tag in _POINT_TAG.finditer(text):
        coords: dict[str, dict[str, float]] = {}
        for axis, index, value in _COORD.findall(tag.group(1)):
            coords.setdefault(index or "1", {})[axis.lower()] = float(value)
        for index in sorted(coords, key=int):
            if {"x", "y"} <= set(coords[index]):
                found.append((coords[index]["x"], coords[index]["y"]))
    return found


def points_text(points: Sequence[tuple[float, float]], label: str) -> str:
    """Points as Molmo writes them (per cent of width and height)."""
    pairs = " ".join(f'x{i}="{x:.1f}" y{i}="{y:.1f}"' for i, (x, y) in enumerate(points, 1))
    return f'<points {pairs} alt="{label}">{label}</points>'


def hits(points: Sequence[tuple[float, float]], icons: Sequence[Sequence[float]]) -> int:
    """How many icons (x, y, radius in pixels) a point lands on, each icon taken once, points
    given in per cent of the picture."""
    free = list(icons)
    count = 0
    for px, py in points:
        x, y = px * SIZE / 100, py * SIZE / 100
        near = [i for i in free if math.hypot(x - i[0], y - i[1]) <= i[2] + SLACK]
        if near:
            free.remove(min(near, key=lambda i: math.hypot(x - i[0], y - i[1])))
            count += 1
    return count


def make_picture(seed: int, config: PixmoConfig) -> dict[str, Any]:
    """The icons of `seed`: the asked kind, its count, and every icon (kind, colour, x, y, r)."""
    rng = random.Random(seed)
    kind = rng.choice(ICON_KINDS)
    count = rng.randint(0 if config.task == "count" else 1, config.max_count)
    others = [
        rng.choice([k for k in ICON_KINDS if k != kind])
        for _ in range(rng.randint(0, config.max_distractors))
    ]
    kinds = [kind] * count + others
    rng.shuffle(kinds)
    while True:  # a draw too crowded to place is drawn again, with new sizes
        radii = [rng.randint(8, 15) for _ in kinds]
        centres = place(rng, radii, (SIZE, SIZE), gap=3)
        if centres is not None:
            break
    icons = [
        [k, list(rng.choice(PAINTS)), x, y, r]
        for k, (x, y), r in zip(kinds, centres, radii, strict=True)
    ]
    return {"kind": kind, "count": count, "icons": icons, "background": rng.choice(BACKGROUNDS)}


class PixmoCount(VisionEnv[PixmoConfig]):
    """Count, or point at, the icons of one kind; +1 right, else -1."""

    name = "pixmo_count"
    kind = "pixmo"
    task = "You count and point at objects in pictures."
    example = "4"
    hub_fields = ("image_url", "label", "count")

    @classmethod
    def make_item(cls, config: PixmoConfig, seed: int) -> dict[str, Any]:
        picture = make_picture(seed, config)
        mode = config.task
        if mode == "mix":
            mode = "point" if random.Random(f"pixmo-task:{seed}").random() < 0.5 else "count"
        label = PLURALS[picture["kind"]]
        shown = [
            (x * 100 / SIZE, y * 100 / SIZE)
            for k, _, x, y, _ in picture["icons"]
            if k == picture["kind"]
        ]
        if mode == "count":
            question, answer = f"How many {label} are in the image?", str(picture["count"])
        else:
            question = (
                f"Point to every {picture['kind']} in the image. Answer with their points,"
                ' in per cent of the width and height: <points x1="..." y1="..." x2="..."'
                f' y2="..." alt="{label}">{label}</points>'
            )
            answer = points_text(shown, label)
        return {
            "question": question,
            "answer": answer,
            "category": mode,
            **picture,
        }

    @classmethod
    def draw(cls, item: Mapping[str, Any]) -> Any:
        image, draw = canvas(SIZE, SIZE, tuple(item["background"]))
        for kind, colour, x, y, r in item["icons"]:
            draw_icon(draw, kind, x, y, r, tuple(colour))
        return image

    def hub_item(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if not row["image_url"] or row["count"] is None or not row["label"]:
            return []
        return [
            {
                "question": f"How many {row['label']} are in the image?",  # upstream's wording
                "answer": str(int(row["count"])),
                "category": "count",
                "image_url": row["image_url"],
                "image_sha256": row.get("image_sha256"),
            }
        ]

    def judge(self, item: Mapping[str, Any], answer: str | None) -> Verdict:
        if answer is None:
            return Verdict(-1.0, False)
        if item["category"] != "point":
            said, gold = as_number(answer), float(item["answer"])
            if said is None:
                return Verdict(-1.0, False)
            return Verdict(1.0 if said == gold else -1.0, True, {"count_error": abs(said - gold)})
        return self._judge_points(item, read_points(answer))

    def _judge_points(self, item: Mapping[str, Any], points: list[tuple[float, float]]) -> Verdict:
        icons = [(x, y, r) for k, _, x, y, r in item["icons"] if k == item["kind"]]
        hit = hits(points, icons)
        f1 = 2 * hit / (len(points) + len(icons)) if points or icons else 1.0
        exact = hit == len(icons) == len(points)
        score = (1.0 if exact else -1.0) if self.config.points_reward == "exact" else 2 * f1 - 1
        measures = {"point_f1": f1, "count_error": float(abs(len(points) - len(icons)))}
        return Verdict(score, bool(points), measures)

    @classmethod
    def wrong_answer(cls, item: Mapping[str, Any]) -> str:
        """One too many for a count; for pointing, the points without the first."""
        if item["category"] != "point":
            return super().wrong_answer(item)
        label = PLURALS[item["kind"]]
        return points_text(read_points(str(item["answer"]))[1:], label)
