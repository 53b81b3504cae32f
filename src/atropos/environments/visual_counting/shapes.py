"""Counting scenes for `visual_counting`: coloured shapes on a small canvas, made from a seed.

A scene is a few circles, squares and triangles in four colours on a white 128x128 canvas. The
canvas is a 4x4 grid of 32-pixel cells and each shape sits inside its own cell, so shapes never
overlap or touch. A task is a scene plus one counting question about it ("How many red circles
are in the image?") and its answer. Everything follows from the seed through `random.Random`,
so the same seed gives the same scene, question and answer on every machine; the picture is
drawn without anti-aliasing, so every pixel holds the background or one of the `COLOURS`
exactly. Only `render_png` needs Pillow (the `vision` extra, `common.vision.require_pillow`),
imported when it is first called.

>>> task = make_task(17)
>>> task == make_task(17), task.answer == str(task.scene.count(task.colour, task.kind))
(True, True)
>>> Scene((Shape("circle", "red", 0, 0, 20), Shape("square", "red", 32, 0, 20))).count("red")
2
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

from atropos.environments.common.vision import require_pillow

__all__ = [
    "BACKGROUND",
    "CANVAS",
    "CELL",
    "COLOURS",
    "KINDS",
    "MAX_SHAPES",
    "Scene",
    "Shape",
    "Task",
    "make_scene",
    "make_task",
    "render_png",
]

CANVAS = 128  # pixels, square
CELL = 32  # one shape per cell: a 4x4 grid
MAX_SHAPES = (CANVAS // CELL) ** 2
KINDS = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 0),
}
BACKGROUND = (255, 255, 255)
_SIZES = (16, 26)  # a shape's side, in pixels (inclusive range)
_PRESENT = 0.75  # chance that a question names a colour or kind that is in the picture


@dataclass(frozen=True)
class Shape:
    """One shape: its kind, colour and bounding square (`x`, `y` its top-left corner)."""

    kind: str
    colour: str
    x: int
    y: int
    size: int


@dataclass(frozen=True)
class Scene:
    """The shapes on one canvas."""

    shapes: tuple[Shape, ...]

    def count(self, colour: str | None = None, kind: str | None = None) -> int:
        """How many shapes have this colour and this kind (None: any)."""
        return sum(
            (colour is None or s.colour == colour) and (kind is None or s.kind == kind)
            for s in self.shapes
        )


@dataclass(frozen=True)
class Task:
    """A scene, a question about it and the answer (the count, as text)."""

    seed: int
    scene: Scene
    question: str
    answer: str
    colour: str | None  # what the question counts (None: any colour)
    kind: str | None  # (None: any kind)


def make_scene(seed: int, max_shapes: int = 8) -> Scene:
    """Between 1 and `max_shapes` shapes in distinct cells, sizes and offsets drawn at random.

    >>> len(make_scene(3, max_shapes=1).shapes)
    1
    """
    if not 1 <= max_shapes <= MAX_SHAPES:
        raise ValueError(f"max_shapes must be between 1 and {MAX_SHAPES}, got {max_shapes}")
    rng = random.Random(seed)
    per_row = CANVAS // CELL
    cells = rng.sample(range(per_row * per_row), rng.randint(1, max_shapes))
    shapes = []
    for cell in sorted(cells):
        size = rng.randint(*_SIZES)
        slack = CELL - size  # room left in the cell, split at random around the shape
        x = (cell % per_row) * CELL + rng.randint(1, slack - 1)
        y = (cell // per_row) * CELL + rng.randint(1, slack - 1)
        shapes.append(Shape(rng.choice(KINDS), rng.choice(sorted(COLOURS)), x, y, size))
    return Scene(tuple(shapes))


def _plural(kind: str) -> str:
    return kind + "s"


def make_task(seed: int, max_shapes: int = 8) -> Task:
    """The scene of `seed` and one question: all shapes, a colour, a kind, or both.

    A named colour or kind is one in the picture three times in four, else any (the answer
    may then be 0).
    """
    scene = make_scene(seed, max_shapes)
    rng = random.Random(f"question:{seed}")  # separate from the scene's stream
    colour: str | None = None
    kind: str | None = None
    form = rng.choice(("total", "colour", "kind", "both"))
    if form != "total":
        if rng.random() < _PRESENT:
            pick = rng.choice(scene.shapes)
            named_colour, named_kind = pick.colour, pick.kind
        else:
            named_colour, named_kind = rng.choice(sorted(COLOURS)), rng.choice(KINDS)
        colour = named_colour if form in ("colour", "both") else None
        kind = named_kind if form in ("kind", "both") else None
    noun = _plural(kind) if kind else "shapes"
    adjective = f"{colour} " if colour else ""
    total = " in total" if form == "total" else ""
    question = f"How many {adjective}{noun} are in the image{total}?"
    return Task(seed, scene, question, str(scene.count(colour, kind)), colour, kind)


def render_png(scene: Scene) -> bytes:
    """The scene as PNG bytes (RGB, no anti-aliasing: every pixel is a listed colour)."""
    pil = require_pillow()
    image = pil.Image.new("RGB", (CANVAS, CANVAS), BACKGROUND)
    draw = pil.ImageDraw.Draw(image)
    for s in scene.shapes:
        fill = COLOURS[s.colour]
        right, bottom = s.x + s.size - 1, s.y + s.size - 1
        if s.kind == "circle":
            draw.ellipse((s.x, s.y, right, bottom), fill=fill)
        elif s.kind == "square":
            draw.rectangle((s.x, s.y, right, bottom), fill=fill)
        else:  # a triangle pointing up
            draw.polygon([(s.x, bottom), (right, bottom), ((s.x + right) / 2, s.y)], fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()
