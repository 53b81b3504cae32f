"""`clock_reading`: read the time off an analogue clock face, answered as `<answer>HH:MM</answer>`.

Upstream's `pixmo_clocks` (atroposlib 0.4.0's "multimodal DPO" family). The faces are drawn
from a seed: a 224x224 picture holding one clock of varied size and place, face, rim and ink
colours, numerals (arabic, roman, or ticks only), minute ticks or not, hour and minute hands
of varied widths, and a thin red second hand on some (`--env.second_hand_rate`). The hour hand
stands where a real one would (3:30 puts it half way from 3 to 4).

The answer is read on a 12-hour dial: `3:05`, `03:05`, `15:05` and `3:05 pm` are all the same
time, `12:10` is `0:10`. It is right within `--env.tolerance_minutes` (0: the exact minute) of
the shown time, the short way round; +1 right, else -1. `train/minute_error` (and `eval/...`)
is the mean distance of the times read. Upstream compared the text exactly, so `03:05` was
wrong for `3:05` and its dataset's hour 0 could only be answered as `0:MM`. The hub's faces
read with `--env.dataset_name junyeong-nero/clock-dataset` (`image`, `hour`, `minute`).
allenai/pixmo-clocks holds no pictures (only what its generator needs), so it cannot be read.

>>> item = ClockReading.generated_item(ClockConfig(), 7)
>>> item["id"], item["answer"] == f"{item['hour']:02d}:{item['minute']:02d}"
('clock-7', True)
>>> ClockReading.wrong_answer({"answer": "11:58"})
'12:15'
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atropos.environments.common.vision import require_pillow
from atropos.environments.multimodal.answers import dial_minutes, minutes_apart
from atropos.environments.multimodal.base import Verdict, VisionConfig, VisionEnv
from atropos.environments.multimodal.drawing import RGB, canvas

__all__ = ["ClockConfig", "ClockReading", "hand_angles"]

SIZE = 224
NUMERALS = ("arabic", "roman", "ticks")
ROMAN = "XII I II III IV V VI VII VIII IX X XI".split()
BACKGROUNDS: tuple[RGB, ...] = ((236, 232, 220), (200, 214, 228), (60, 64, 72), (222, 236, 214))
FACES: tuple[RGB, ...] = ((255, 255, 255), (250, 244, 228), (232, 240, 246))
INKS: tuple[RGB, ...] = ((20, 20, 20), (70, 70, 80), (40, 40, 110))
HANDS: tuple[RGB, ...] = ((10, 10, 10), (25, 45, 120), (120, 30, 30))
SECOND_HAND: RGB = (220, 20, 20)
QUESTIONS = (
    "What time does the clock show?",
    "What time is it on this clock?",
    "Read the time on the clock face.",
)
HAND_LENGTH = {"hour": 0.5, "minute": 0.78, "second": 0.86}  # shares of the face's radius


class ClockConfig(VisionConfig):
    """`clock_reading`'s settings."""

    tolerance_minutes: int = Field(
        default=0, ge=0, le=360, description="minutes a read time may be off and still be right"
    )
    second_hand_rate: float = Field(
        default=0.3, ge=0, le=1, description="share of faces with a second hand"
    )


def hand_angles(hour: int, minute: int, second: int | None) -> dict[str, float]:
    """Each hand's angle in degrees, clockwise from 12 (the second hand's only when shown).

    >>> hand_angles(3, 30, None)
    {'hour': 105.0, 'minute': 180.0}
    """
    seconds = second or 0
    angles = {
        "hour": ((hour % 12) + minute / 60 + seconds / 3600) * 30,
        "minute": (minute + seconds / 60) * 6,
    }
    if second is not None:
        angles["second"] = second * 6.0
    return angles


def _point(cx: float, cy: float, r: float, degrees: float) -> tuple[float, float]:
    a = math.radians(degrees)
    return cx + r * math.sin(a), cy - r * math.cos(a)


def _face(draw: Any, item: Mapping[str, Any]) -> None:
    """The dial: face and rim, hour ticks (and minute ticks), numerals."""
    cx, cy, r = item["cx"], item["cy"], item["radius"]
    ink = tuple(item["ink"])
    draw.ellipse(
        (cx - r, cy - r, cx + r, cy + r), fill=tuple(item["face"]), outline=ink, width=item["rim"]
    )
    for tick in range(60):
        if tick % 5 and not item["minute_ticks"]:
            continue
        inner = 0.86 if tick % 5 == 0 else 0.92
        width = 3 if tick % 5 == 0 else 1
        draw.line(
            [_point(cx, cy, r * inner, tick * 6), _point(cx, cy, r * 0.97, tick * 6)],
            fill=ink,
            width=width,
        )
    if item["numerals"] == "ticks":
        return
    font = require_pillow().ImageFont.load_default(size=max(8, round(r * 0.17)))
    for n in range(12):
        label = ROMAN[n] if item["numerals"] == "roman" else str(n or 12)
        x, y = _point(cx, cy, r * 0.7, n * 30)
        draw.text((x, y), label, fill=ink, font=font, anchor="mm")


def render(item: Mapping[str, Any]) -> Any:
    """The clock face of a generated item as a PIL image."""
    image, draw = canvas(SIZE, SIZE, tuple(item["background"]))
    _face(draw, item)
    cx, cy, r = item["cx"], item["cy"], item["radius"]
    angles = hand_angles(item["hour"], item["minute"], item["second"])
    widths = {"hour": item["hand_width"] + 2, "minute": item["hand_width"], "second": 1}
    for hand, angle in angles.items():
        colour = SECOND_HAND if hand == "second" else tuple(item["hand"])
        tip = _point(cx, cy, r * HAND_LENGTH[hand], angle)
        draw.line([(cx, cy), tip], fill=colour, width=widths[hand])
    cap = max(3, item["hand_width"])
    draw.ellipse((cx - cap, cy - cap, cx + cap, cy + cap), fill=tuple(item["hand"]))
    return image


def make_face(seed: int, second_hand_rate: float = 0.3) -> dict[str, Any]:
    """A clock's time and looks from `seed` (the picture's fields of an item)."""
    rng = random.Random(seed)
    radius = rng.randint(70, 104)
    centre = (
        rng.randint(radius + 4, SIZE - radius - 4),
        rng.randint(radius + 4, SIZE - radius - 4),
    )
    return {
        "hour": rng.randint(1, 12),
        "minute": rng.randint(0, 59),
        "second": rng.randint(0, 59) if rng.random() < second_hand_rate else None,
        "cx": centre[0],
        "cy": centre[1],
        "radius": radius,
        "background": rng.choice(BACKGROUNDS),
        "face": rng.choice(FACES),
        "ink": rng.choice(INKS),
        "hand": rng.choice(HANDS),
        "rim": rng.randint(2, 7),
        "hand_width": rng.randint(3, 6),
        "numerals": rng.choice(NUMERALS),
        "minute_ticks": rng.random() < 0.5,
        "question": rng.choice(QUESTIONS),
    }


class ClockReading(VisionEnv[ClockConfig]):
    """Read an analogue clock; +1 within the tolerance, else -1."""

    name = "clock_reading"
    kind = "clock"
    task = "You read analogue clocks."
    example = "10:25"
    hub_fields = ("image", "hour", "minute")

    @classmethod
    def make_item(cls, config: ClockConfig, seed: int) -> dict[str, Any]:
        face = make_face(seed, config.second_hand_rate)
        return {
            "answer": f"{face['hour']:02d}:{face['minute']:02d}",
            "category": face["numerals"],
            **face,
        }

    @classmethod
    def draw(cls, item: Mapping[str, Any]) -> Any:
        return render(item)

    def hub_item(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        if row["image"] is None or row["hour"] is None or row["minute"] is None:
            return []
        hour = int(row["hour"]) % 12 or 12
        question = QUESTIONS[0]  # upstream's
        answer = f"{hour:02d}:{int(row['minute']):02d}"
        return [{"question": question, "answer": answer, "category": "hub", "image": row["image"]}]

    def judge(self, item: Mapping[str, Any], answer: str | None) -> Verdict:
        """+1 when `answer` is a time within `tolerance_minutes` of the shown one, else -1;
        the distance in minutes is the `minute_error` measure."""
        said = None if answer is None else dial_minutes(answer)
        if said is None:
            return Verdict(-1.0, False)
        shown = dial_minutes(item["answer"])
        if shown is None:
            raise ValueError(f"item {item['id']}: its answer {item['answer']!r} is not a time")
        error = minutes_apart(said, shown)
        right = error <= self.config.tolerance_minutes
        return Verdict(1.0 if right else -1.0, True, {"minute_error": float(error)})

    @classmethod
    def wrong_answer(cls, item: Mapping[str, Any]) -> str:
        """The shown time plus 17 minutes."""
        shown = (dial_minutes(str(item["answer"])) or 0) + 17
        return f"{(shown // 60) % 12 or 12:02d}:{shown % 60:02d}"
