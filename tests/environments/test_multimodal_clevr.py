"""`clevr`: scenes that keep their rules, pictures that show the scene graph (read back from the
pixels), questions whose answers a separate reading of their words gets again, scoring, and the
hub's CLEVR sets."""

from __future__ import annotations

import collections
import itertools
import math
import re
from typing import Any

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")

from pydantic import ValidationError  # noqa: E402

from atropos.environments.common.data_loading import HubUnavailable  # noqa: E402
from atropos.environments.multimodal.clevr import Clevr, ClevrConfig  # noqa: E402
from atropos.environments.multimodal.clevr_scene import (  # noqa: E402
    AXIS_GAP,
    FAMILIES,
    FLOOR,
    HEIGHT,
    SIZES,
    VALUES,
    WIDTH,
    Scene,
    Solid,
    ask,
    make_scene,
    render,
)
from atropos.environments.multimodal.drawing import CLEVR_COLOURS  # noqa: E402

from .helpers import fake_hub, make_env  # noqa: E402

SEEDS = range(60)


def make(**env: Any) -> Clevr:
    return make_env(Clevr, server_type="vllm", **{"train_size": 10, "eval_size": 3, **env})


# ----- scenes and pictures ---------------------------------------------------------------------


def test_scenes_keep_objects_apart_and_inside():
    for seed in range(300):
        scene = make_scene(seed, max_objects=10)
        assert 3 <= len(scene.objects) <= 10
        for a, b in itertools.combinations(scene.objects, 2):
            assert abs(a.x - b.x) >= AXIS_GAP and abs(a.y - b.y) >= AXIS_GAP
            reach = (SIZES[a.size] + SIZES[b.size]) * 1.42
            assert math.hypot(a.x - b.x, a.y - b.y) >= reach
        for o in scene.objects:
            half = SIZES[o.size]
            assert half <= o.x <= WIDTH - half and half <= o.y <= HEIGHT - half
    with pytest.raises(ValueError, match="max_objects"):
        make_scene(0, max_objects=11)


def read_objects(image: Any) -> list[Solid]:
    """The objects a picture shows, from its pixels alone: each blob of non-floor pixels, its
    colour at the centre, its size by its width, its shape by how much of its box it fills,
    and its material by whether anything in it is lighter than its colour (a sheen)."""
    pixels = image.load()
    names = {rgb: name for name, rgb in CLEVR_COLOURS.items()}
    halves = {2 * half + 1: size for size, half in SIZES.items()}
    seen: set[tuple[int, int]] = set()
    found = []
    for start in itertools.product(range(WIDTH), range(HEIGHT)):
        if start in seen or pixels[start] == FLOOR:
            continue
        blob, todo = [], [start]
        seen.add(start)
        while todo:
            x, y = todo.pop()
            blob.append((x, y))
            for nx, ny in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                inside = 0 <= nx < WIDTH and 0 <= ny < HEIGHT
                if inside and (nx, ny) not in seen and pixels[nx, ny] != FLOOR:
                    seen.add((nx, ny))
                    todo.append((nx, ny))
        xs, ys = [p[0] for p in blob], [p[1] for p in blob]
        cx, cy = (min(xs) + max(xs)) // 2, (min(ys) + max(ys)) // 2
        colour = names[pixels[cx, cy]]  # a KeyError: the centre is not a plain colour
        base = CLEVR_COLOURS[colour]
        fill = len(blob) / ((max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1))
        shape = "cube" if fill > 0.99 else "cylinder" if fill > 0.9 else "sphere"
        lighter = any(sum(pixels[p]) > sum(base) + 30 for p in blob)
        size = halves[max(xs) - min(xs) + 1]
        found.append(Solid(shape, colour, size, "metal" if lighter else "rubber", cx, cy))
    return found


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 33, 123, 10**9 + 5])
def test_the_picture_shows_exactly_the_scene_graph(seed):
    scene = make_scene(seed, max_objects=10)
    image = render(scene)
    assert image.size == (WIDTH, HEIGHT)
    assert sorted(read_objects(image), key=str) == sorted(scene.objects, key=str)


# ----- questions -------------------------------------------------------------------------------

WORDS = {value: attr for attr, values in VALUES.items() for value in values}
WORDS.update({f"{shape}s": "shape" for shape in VALUES["shape"]})


def phrase(text: str) -> dict[str, str]:
    """The filter a noun phrase names ("large red things" -> size and colour)."""
    f = {}
    for word in text.split():
        if word in ("thing", "things"):
            continue
        f[WORDS[word]] = word.rstrip("s") if WORDS[word] == "shape" else word
    return f


def the(scene: Scene, text: str) -> Solid:
    [obj] = scene.select(phrase(text))  # "the large cube" names exactly one object
    return obj


def answer_again(scene: Scene, question: str) -> str:
    """The answer to `question`, from its words alone (a reading apart from `clevr_scene`'s)."""
    yes = {True: "yes", False: "no"}
    n = lambda text: len(scene.select(phrase(text)))  # noqa: E731
    rel = {"left of": ("x", -1), "right of": ("x", 1), "in front of": ("y", 1), "behind": ("y", -1)}
    if m := re.fullmatch(r"How many other things are the same (\w+) as the (.+)\?", question):
        ref = the(scene, m[2])
        alike = [o for o in scene.objects if o != ref and getattr(o, m[1]) == getattr(ref, m[1])]
        return str(len(alike))
    if m := re.fullmatch(r"Is there anything else that is the same (\w+) as the (.+)\?", question):
        ref = the(scene, m[2])
        return yes[any(o != ref and getattr(o, m[1]) == getattr(ref, m[1]) for o in scene.objects)]
    if m := re.fullmatch(
        r"How many (.+) are (left of|right of|in front of|behind) the (.+)\?", question
    ):
        ref, (axis, sign) = the(scene, m[3]), rel[m[2]]
        side = [o for o in scene.objects if sign * (getattr(o, axis) - getattr(ref, axis)) > 0]
        return str(len(scene.select(phrase(m[1]), side)))
    if m := re.fullmatch(r"How many (.+) are there\?", question):
        return str(n(m[1]))
    if m := re.fullmatch(r"Is there a (.+)\?", question):
        return yes[n(m[1]) > 0]
    if m := re.fullmatch(r"Are there (more|fewer) (.+) than (.+)\?", question):
        return yes[n(m[2]) > n(m[3]) if m[1] == "more" else n(m[2]) < n(m[3])]
    if m := re.fullmatch(r"Are there the same number of (.+) and (.+)\?", question):
        return yes[n(m[1]) == n(m[2])]
    m = re.fullmatch(r"What (\w+) is the (.+)\?", question)
    assert m, question
    return str(getattr(the(scene, m[2]), m[1]))


def test_every_answer_follows_from_the_scene_graph():
    families = collections.Counter()
    for seed in range(400):
        item = Clevr.generated_item(ClevrConfig(), seed)
        scene = Scene.from_json(item["scene"])
        assert answer_again(scene, item["question"]) == item["answer"], item["question"]
        families[item["category"]] += 1
    assert set(families) == set(FAMILIES)


def test_questions_are_balanced_enough_and_families_can_be_chosen():
    answers = collections.Counter(ask(make_scene(s), s, ("exist",)).answer for s in range(300))
    assert 0.35 < answers["yes"] / 300 < 0.65
    only = ClevrConfig(families="query, relate")
    assert only.families == "query,relate"
    assert {Clevr.generated_item(only, s)["category"] for s in range(50)} == {"query", "relate"}
    with pytest.raises(ValidationError, match="did you mean 'count'"):
        ClevrConfig(families="cuont")


def test_relations_read_front_as_lower_in_the_picture():
    ref = Solid("cube", "red", "large", "rubber", 100, 100)
    low = Solid("sphere", "blue", "small", "metal", 150, 180)
    high = Solid("sphere", "gray", "small", "metal", 50, 30)
    scene = Scene((ref, low, high))
    assert scene.relate(ref, "front") == [low] and scene.relate(ref, "behind") == [high]
    assert scene.relate(ref, "left") == [high] and scene.relate(ref, "right") == [low]
    with pytest.raises(ValueError, match="above"):
        scene.relate(ref, "above")


# ----- scoring ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "gold", "score"),
    [
        ("There are \\boxed{2}.", "2", 1.0),
        ("\\boxed{two}", "2", 1.0),
        ("\\boxed{ Yes }", "yes", 1.0),
        ("\\boxed{ball}", "sphere", 1.0),
        ("\\boxed{Metallic}", "metal", 1.0),
        ("\\boxed{grey}", "gray", 1.0),
        ("\\boxed{3}", "2", -1.0),
        ("\\boxed{2} \\boxed{3}", "2", -1.0),
        ("<answer>2</answer>", "2", -1.0),  # boxed asked
        ("2", "2", -1.0),
    ],
)
def test_scoring_hand_made_answers(completion, gold, score):
    assert make().score({"answer": gold}, completion) == score


def test_tags_when_asked():
    env = make(answer_format="tags")
    assert env.score({"answer": "2"}, "<answer>2</answer>") == 1.0
    assert env.score({"answer": "2"}, "\\boxed{2}") == -1.0


# ----- the hub ---------------------------------------------------------------------------------


def hub_rows(name: str, split: str) -> list[dict[str, Any]]:
    from PIL import Image

    rows = [
        {
            "image": Image.new("RGB", (12, 8), (n, 0, 0)),
            "problem": f"How many cubes are there in picture {n}?",
            "solution": f"<answer> {n % 4} </answer>",
        }
        for n in range(10)
    ]
    rows[2]["image"] = None
    found = re.fullmatch(r"train\[(\d*):(\d*)\]", split)
    assert found, split
    return rows[int(found[1] or 0) : int(found[2])]


def test_the_hub_sets_read_problem_and_solution(monkeypatch):
    calls = fake_hub(monkeypatch, hub_rows, only="leonardPKU/clevr_cogen_a_train")
    env = make(dataset_name="leonardPKU/clevr_cogen_a_train", hub_rows=6, eval_size=3)
    train, held_out = env.load(), env.load_eval()
    assert [i["id"] for i in train] == [f"clevr-train-{n}" for n in (0, 1, 3, 4, 5)]
    assert [i["id"] for i in held_out] == ["clevr-train-6", "clevr-train-7", "clevr-train-8"]
    assert [c.split for c in calls] == ["train[:6]", "train[6:9]"]  # held out: the rows after
    assert train[1]["answer"] == "1" and train[1]["category"] == "hub"
    assert env.image_base64(train[1]).startswith("iVBORw0KGgo")
    assert env.score(train[1], "\\boxed{1}") == 1.0
    with pytest.raises(HubUnavailable, match="other/name"):
        make(dataset_name="other/name").load()


def test_a_hub_row_without_a_column_names_it(monkeypatch):
    fake_hub(monkeypatch, [{"image": None, "question": "?", "solution": "1"}])
    with pytest.raises(ValueError, match=r"row 0: no field 'problem'.*image, problem, solution"):
        make(dataset_name="some/clevr").load()
