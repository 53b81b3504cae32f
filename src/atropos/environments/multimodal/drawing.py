"""Drawing helpers the multimodal scenes share: named colours, icon outlines, shaded solids,
and placing objects apart.

Nothing here is anti-aliased: a solid's flat part is exactly its colour and an icon is exactly
its colour, so the tests can read a picture back pixel by pixel. Pillow (the `vision` extra) is
needed only by the functions that draw; the geometry is plain Python.

>>> [round(v) for v in star(0, 0, 10)[0]]
[0, -10]
>>> len(icon_outline("hexagon", 50, 50, 10)), blend((0, 0, 0), (255, 255, 255), 0.5)
(6, (128, 128, 128))
>>> far_enough((0, 0, 5), [(20, 0, 5)], gap=10), far_enough((0, 0, 5), [(15, 0, 5)], gap=10)
(True, False)
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from atropos.environments.common.vision import require_pillow

__all__ = [
    "CLEVR_COLOURS",
    "ICON_KINDS",
    "RGB",
    "blend",
    "canvas",
    "draw_icon",
    "draw_solid",
    "far_enough",
    "icon_outline",
    "place",
    "star",
]

RGB = tuple[int, int, int]
CLEVR_COLOURS: dict[str, RGB] = {  # the eight colours CLEVR's objects come in
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
ICON_KINDS = ("star", "heart", "diamond", "cross", "hexagon", "arrow")
WHITE: RGB = (255, 255, 255)


def blend(a: RGB, b: RGB, share: float) -> RGB:
    """`a` moved `share` of the way towards `b`."""
    return (
        round(a[0] + (b[0] - a[0]) * share),
        round(a[1] + (b[1] - a[1]) * share),
        round(a[2] + (b[2] - a[2]) * share),
    )


def canvas(width: int, height: int, background: RGB) -> tuple[Any, Any]:
    """A new RGB picture of one colour, and a drawing context on it."""
    pil = require_pillow()
    image = pil.Image.new("RGB", (width, height), background)
    return image, pil.ImageDraw.Draw(image)


def _polar(cx: float, cy: float, r: float, degrees: float) -> tuple[float, float]:
    angle = math.radians(degrees)
    return cx + r * math.sin(angle), cy - r * math.cos(angle)


def star(cx: float, cy: float, r: float, points: int = 5) -> list[tuple[float, float]]:
    """A star's outline: `points` tips at radius `r`, the first straight up."""
    step = 180 / points
    return [_polar(cx, cy, r if i % 2 == 0 else r * 0.45, i * step) for i in range(2 * points)]


def _heart(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    outline = []
    for i in range(36):  # the classic parametric heart, scaled into radius r
        t = 2 * math.pi * i / 36
        x = 16 * math.sin(t) ** 3
        y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
        outline.append((cx + x * r / 17, cy - y * r / 17 + r * 0.1))
    return outline


def _arrow(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    shaft, head = r * 0.3, r * 0.8  # half widths
    return [
        (cx, cy - r),
        (cx + head, cy - r * 0.1),
        (cx + shaft, cy - r * 0.1),
        (cx + shaft, cy + r),
        (cx - shaft, cy + r),
        (cx - shaft, cy - r * 0.1),
        (cx - head, cy - r * 0.1),
    ]


def icon_outline(kind: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    """The polygon of an icon of `kind` (one of `ICON_KINDS`) centred at (cx, cy), radius r."""
    if kind == "star":
        return star(cx, cy, r)
    if kind == "heart":
        return _heart(cx, cy, r)
    if kind == "diamond":
        return [(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)]
    if kind == "cross":
        a, b = r * 0.35, r
        corners = [(a, b), (a, a), (b, a), (b, -a), (a, -a), (a, -b)]
        right = [(cx + x, cy - y) for x, y in corners]
        return right + [(cx - x, cy + y) for x, y in corners]
    if kind == "hexagon":
        return [_polar(cx, cy, r, 30 + 60 * i) for i in range(6)]
    if kind == "arrow":
        return _arrow(cx, cy, r)
    raise ValueError(f"unknown icon {kind!r}; one of {', '.join(ICON_KINDS)}")


def draw_icon(draw: Any, kind: str, cx: float, cy: float, r: float, colour: RGB) -> None:
    """An icon filled with `colour` (no outline, no anti-aliasing)."""
    draw.polygon(icon_outline(kind, cx, cy, r), fill=colour)


def draw_solid(draw: Any, shape: str, box: Sequence[float], colour: RGB, metal: bool) -> None:
    """A CLEVR solid seen from the front: a cube as a square, a sphere as a disc, a cylinder as
    a rounded box. Rubber is flat with a dark rim; metal gets a sheen, three nested lighter
    copies of the shape towards its upper left (its centre stays the plain colour)."""
    x0, y0, x1, y1 = box

    def fill(b: Sequence[float], rgb: RGB, outline: RGB | None = None) -> None:
        if shape == "cube":
            draw.rectangle(b, fill=rgb, outline=outline)
        elif shape == "sphere":
            draw.ellipse(b, fill=rgb, outline=outline)
        else:
            draw.rounded_rectangle(b, radius=(b[2] - b[0]) / 4, fill=rgb, outline=outline)

    fill(box, colour, outline=blend(colour, (0, 0, 0), 0.5))
    if not metal:
        return
    side = x1 - x0
    for step, share in enumerate((0.3, 0.55, 0.8), start=1):
        inset = side * (0.08 + 0.07 * step)
        size = side * (0.42 - 0.1 * step)
        b = (x0 + inset, y0 + inset, x0 + inset + size, y0 + inset + size)
        fill(b, blend(colour, WHITE, share))


def far_enough(
    spot: tuple[float, float, float], others: Sequence[tuple[float, float, float]], gap: float
) -> bool:
    """Whether the circle `spot` (x, y, radius) keeps `gap` pixels clear of every other one."""
    x, y, r = spot
    return all(math.hypot(x - ox, y - oy) >= r + orad + gap for ox, oy, orad in others)


def place(
    rng: random.Random,
    radii: Sequence[float],
    size: tuple[int, int],
    gap: float,
    axis_gap: float = 0,
    tries: int = 200,
) -> list[tuple[int, int]] | None:
    """Centres (integer pixels) for circles of `radii` in a picture of `size` (width, height),
    each `gap` clear of the edge and of the others, and with `axis_gap` the centres differ by at
    least that much across and down (so "left of" and "behind" are never a close call); None
    when one could not be placed in `tries` attempts."""
    spots: list[tuple[int, int, float]] = []
    width, height = size
    for r in radii:
        margin = math.ceil(r + gap)
        for _ in range(tries):
            x = rng.randint(margin, width - margin)
            y = rng.randint(margin, height - margin)
            apart = all(abs(x - ox) >= axis_gap and abs(y - oy) >= axis_gap for ox, oy, _ in spots)
            if apart and far_enough((x, y, r), spots, gap):
                spots.append((x, y, r))
                break
        else:
            return None
    return [(x, y) for x, y, _ in spots]
