"""CLEVR-style scenes and questions for `clevr`, made from a seed; answers come from the scene.

A scene is 3 to `max_objects` solids on a 320x240 floor, each with CLEVR's attributes: a shape
(cube, sphere, cylinder: drawn as a square, a disc, a rounded box), one of CLEVR's 8 colours,
a size (large, small) and a material (rubber: flat; metal: a sheen). Solids never touch, and
any two centres differ by at least 8 pixels across and down, so "left of" or "behind" is never a
close call. Seen from the front, "left of" means further left in the picture and "in front of"
lower down (nearer the camera); "behind" is higher up.

Questions come in CLEVR's families (`FAMILIES`), each answered by running it on the scene
graph: `count` ("How many red things are there?"), `exist`, `relate` ("How many small spheres
are left of the large cube?"), `compare` ("Are there more cubes than cylinders?"), `query`
("What colour is the large metal sphere?") and `same` ("Is there anything else that is the
same colour as the small cylinder?"). An object a question names ("the large cube") is
described by the fewest attributes that pick it out alone.

>>> a = Solid("cube", "red", "large", "metal", 40, 100)
>>> b = Solid("sphere", "red", "small", "rubber", 200, 60)
>>> scene = Scene((a, b))
>>> len(scene.select({"colour": "red"})), scene.relate(a, "right")
(2, [Solid(shape='sphere', colour='red', size='small', material='rubber', x=200, y=60)])
>>> describe({"size": "small", "shape": "sphere"}), describe({"colour": "red"}, plural=True)
('small sphere', 'red things')
>>> unique_filter(scene, a, exclude="colour")
{'shape': 'cube'}
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import astuple, dataclass
from typing import Any

from atropos.environments.multimodal.drawing import CLEVR_COLOURS, canvas, draw_solid, place

__all__ = [
    "ATTRIBUTES",
    "FAMILIES",
    "HEIGHT",
    "MAX_OBJECTS",
    "Question",
    "Scene",
    "Solid",
    "WIDTH",
    "ask",
    "describe",
    "make_scene",
    "render",
    "unique_filter",
]

WIDTH, HEIGHT = 320, 240
FLOOR = (214, 214, 208)
SHAPES = ("cube", "sphere", "cylinder")
SIZES: dict[str, int] = {"large": 22, "small": 13}  # half the side, in pixels
MATERIALS = ("rubber", "metal")
VALUES: dict[str, tuple[str, ...]] = {
    "size": tuple(SIZES),
    "colour": tuple(CLEVR_COLOURS),
    "material": MATERIALS,
    "shape": SHAPES,
}
ATTRIBUTES = tuple(VALUES)  # in the order a description names them
FAMILIES = ("count", "exist", "relate", "compare", "query", "same")
RELATIONS = {"left": "left of", "right": "right of", "front": "in front of", "behind": "behind"}
MIN_OBJECTS, MAX_OBJECTS = 3, 10
GAP, AXIS_GAP = 6, 8
Filter = Mapping[str, str]


@dataclass(frozen=True)
class Solid:
    """One object: its attributes and its centre in the picture."""

    shape: str
    colour: str
    size: str
    material: str
    x: int
    y: int

    def matches(self, f: Filter) -> bool:
        """Whether it has every attribute value of `f`."""
        return all(getattr(self, attr) == value for attr, value in f.items())


@dataclass(frozen=True)
class Scene:
    """The objects on one floor (the scene graph)."""

    objects: tuple[Solid, ...]

    def select(self, f: Filter, among: list[Solid] | None = None) -> list[Solid]:
        """The objects (of `among`, default all) that match `f`."""
        return [o for o in (self.objects if among is None else among) if o.matches(f)]

    def relate(self, ref: Solid, relation: str) -> list[Solid]:
        """The other objects `relation` ("left", "right", "front", "behind") of `ref`."""
        if relation not in RELATIONS:
            raise ValueError(f"unknown relation {relation!r}; one of {', '.join(RELATIONS)}")
        axis = "x" if relation in ("left", "right") else "y"
        sign = -1 if relation in ("left", "behind") else 1  # left: smaller x; behind: smaller y
        here = getattr(ref, axis)
        return [o for o in self.objects if o != ref and sign * (getattr(o, axis) - here) > 0]

    def as_json(self) -> list[list[Any]]:
        """The objects as lists (shape, colour, size, material, x, y), for an item."""
        return [list(astuple(o)) for o in self.objects]

    @classmethod
    def from_json(cls, rows: list[list[Any]]) -> Scene:
        """The scene `as_json` wrote."""
        return cls(tuple(Solid(*row) for row in rows))


@dataclass(frozen=True)
class Question:
    """A question about a scene, its answer, and its family."""

    text: str
    answer: str
    family: str


def make_scene(seed: int, max_objects: int = 8) -> Scene:
    """Between 3 and `max_objects` solids with random attributes, placed apart (see above)."""
    if not MIN_OBJECTS <= max_objects <= MAX_OBJECTS:
        raise ValueError(f"max_objects must be {MIN_OBJECTS} to {MAX_OBJECTS}, got {max_objects}")
    rng = random.Random(seed)
    while True:  # a crowded draw that cannot be placed is drawn again (rare)
        count = rng.randint(MIN_OBJECTS, max_objects)
        picks = [{a: rng.choice(VALUES[a]) for a in ATTRIBUTES} for _ in range(count)]
        radii = [SIZES[p["size"]] * 1.42 for p in picks]  # a square's corner reaches this far
        centres = place(rng, radii, (WIDTH, HEIGHT), GAP, AXIS_GAP)
        if centres is not None:
            break
    return Scene(
        tuple(
            Solid(p["shape"], p["colour"], p["size"], p["material"], x, y)
            for p, (x, y) in zip(picks, centres, strict=True)
        )
    )


def render(scene: Scene) -> Any:
    """The scene as a PIL image, the objects further back drawn first."""
    image, draw = canvas(WIDTH, HEIGHT, FLOOR)
    for o in sorted(scene.objects, key=lambda o: o.y):
        half = SIZES[o.size]
        box = (o.x - half, o.y - half, o.x + half, o.y + half)
        draw_solid(draw, o.shape, box, CLEVR_COLOURS[o.colour], o.material == "metal")
    return image


def describe(f: Filter, plural: bool = False) -> str:
    """A noun phrase for the objects matching `f`: "large red metal cube", "small things"."""
    shape = f.get("shape")
    noun = (shape or "thing") + ("s" if plural else "")
    return " ".join([*(f[a] for a in ATTRIBUTES[:3] if a in f), noun])


def unique_filter(scene: Scene, obj: Solid, exclude: str | None = None) -> dict[str, str] | None:
    """The fewest attributes (never `exclude`) that pick `obj` out alone, shape first among
    equals; None when no description does (an identical twin)."""
    usable = [a for a in ("shape", "colour", "size", "material") if a != exclude]
    subsets: list[tuple[str, ...]] = [()]
    for attr in usable:
        subsets += [(*s, attr) for s in subsets]
    for subset in sorted(subsets[1:], key=len):
        f = {a: getattr(obj, a) for a in subset}
        if scene.select(f) == [obj]:
            return f
    return None


def _random_filter(
    rng: random.Random, scene: Scene, most: int = 2, present: float = 0.75
) -> dict[str, str]:
    """A filter of up to `most` attributes, taken from an object of the scene with chance
    `present` (so it matches something), else from any values."""
    source = rng.choice(scene.objects) if rng.random() < present else None
    attrs = rng.sample(ATTRIBUTES, rng.randint(0, most))
    return {a: getattr(source, a) if source else rng.choice(VALUES[a]) for a in attrs}


def _named(rng: random.Random, scene: Scene, exclude: str | None = None) -> tuple[Solid, Filter]:
    """An object the scene can name alone (without `exclude`), and the filter naming it."""
    candidates = [(o, unique_filter(scene, o, exclude)) for o in scene.objects]
    named = [(o, f) for o, f in candidates if f is not None]
    if not named:
        raise LookupError("no object can be named alone")
    return rng.choice(named)


def _count(rng: random.Random, scene: Scene) -> Question:
    f = _random_filter(rng, scene, present=0.5)
    return Question(f"How many {describe(f, True)} are there?", str(len(scene.select(f))), "count")


def _exist(rng: random.Random, scene: Scene) -> Question:
    """Yes and no about equally often: for a no, up to 20 draws of 2 or 3 random attributes
    until one matches nothing (else it stays a yes)."""
    source = rng.choice(scene.objects)
    f = {a: getattr(source, a) for a in rng.sample(ATTRIBUTES, rng.randint(1, 3))}
    if rng.random() < 0.5:
        for _ in range(20):
            absent = {a: rng.choice(VALUES[a]) for a in rng.sample(ATTRIBUTES, rng.randint(2, 3))}
            if not scene.select(absent):
                f = absent
                break
    return Question(f"Is there a {describe(f)}?", _yes(bool(scene.select(f))), "exist")


def _relate(rng: random.Random, scene: Scene) -> Question:
    ref, ref_f = _named(rng, scene)
    relation = rng.choice(tuple(RELATIONS))
    f = _random_filter(rng, scene, most=1)
    found = scene.select(f, scene.relate(ref, relation))
    text = f"How many {describe(f, True)} are {RELATIONS[relation]} the {describe(ref_f)}?"
    return Question(text, str(len(found)), "relate")


def _compare(rng: random.Random, scene: Scene) -> Question:
    a, b = _random_filter(rng, scene, most=1), _random_filter(rng, scene, most=1)
    while describe(b) == describe(a):
        b = {"shape": rng.choice(SHAPES)} if "shape" not in a else {}
    na, nb = len(scene.select(a)), len(scene.select(b))
    pa, pb = describe(a, True), describe(b, True)
    form = rng.choice(("more", "fewer", "same"))
    if form == "same":
        return Question(f"Are there the same number of {pa} and {pb}?", _yes(na == nb), "compare")
    answer = _yes(na > nb if form == "more" else na < nb)
    return Question(f"Are there {form} {pa} than {pb}?", answer, "compare")


def _query(rng: random.Random, scene: Scene) -> Question:
    attr = rng.choice(ATTRIBUTES)
    obj, f = _named(rng, scene, exclude=attr)
    return Question(f"What {attr} is the {describe(f)}?", getattr(obj, attr), "query")


def _same(rng: random.Random, scene: Scene) -> Question:
    exist = rng.random() < 0.5  # of two sizes or materials, another often shares one: ask to count
    attr = rng.choice(("colour", "shape") if exist else ATTRIBUTES)
    obj, f = _named(rng, scene, exclude=attr)
    alike = [o for o in scene.objects if o != obj and getattr(o, attr) == getattr(obj, attr)]
    if exist:
        text = f"Is there anything else that is the same {attr} as the {describe(f)}?"
        return Question(text, _yes(bool(alike)), "same")
    text = f"How many other things are the same {attr} as the {describe(f)}?"
    return Question(text, str(len(alike)), "same")


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def ask(scene: Scene, seed: int, families: tuple[str, ...] = FAMILIES) -> Question:
    """One question of a family drawn from `families` about `scene`, its answer from the scene
    graph (a family that needs an object named alone falls back to `count` when none is)."""
    rng = random.Random(f"clevr-question:{seed}")  # apart from the scene's stream
    family = rng.choice(families)
    makers = {
        "count": _count,
        "exist": _exist,
        "relate": _relate,
        "compare": _compare,
        "query": _query,
        "same": _same,
    }
    try:
        return makers[family](rng, scene)
    except LookupError:
        return _count(rng, scene)
