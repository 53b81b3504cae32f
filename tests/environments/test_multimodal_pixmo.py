"""`pixmo_count`: pictures whose icons are exactly the listed ones (apart, one colour each),
counts and points scored by hand-made cases, and PixMo-Count's web pictures downloaded, checked
against their hash, and skipped (counted) when they cannot be had."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")
from PIL import Image  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from atropos.environments.common.vision import ImageUnavailable  # noqa: E402
from atropos.environments.multimodal.demo import demo_responder  # noqa: E402
from atropos.environments.multimodal.drawing import ICON_KINDS  # noqa: E402
from atropos.environments.multimodal.images import fetch_url  # noqa: E402
from atropos.environments.multimodal.pixmo_count import (  # noqa: E402
    PLURALS,
    SIZE,
    PixmoConfig,
    PixmoCount,
    hits,
    points_text,
    read_points,
)
from atropos.envs.types import DROP_REASONS  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402
from atropos.testing.serve import serve_in_thread  # noqa: E402

from .helpers import evaluate, fake_hub, make_env  # noqa: E402


def make(url: str = "http://127.0.0.1:9/v1", **env: Any) -> PixmoCount:
    return make_env(
        PixmoCount, url, server_type="vllm", **{"train_size": 10, "eval_size": 3, **env}
    )


def png_of(colour: tuple[int, int, int], size: tuple[int, int] = (8, 6)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


# ----- pictures --------------------------------------------------------------------------------


def blobs(image: Image.Image, background: tuple[int, int, int]) -> list[set[tuple[int, int]]]:
    """The 8-connected runs of pixels other than the background."""
    pixels = image.load()
    seen: set[tuple[int, int]] = set()
    found = []
    for start in itertools.product(range(SIZE), range(SIZE)):
        if start in seen or pixels[start] == background:
            continue
        blob, todo = set(), [start]
        seen.add(start)
        while todo:
            x, y = todo.pop()
            blob.add((x, y))
            for nx, ny in itertools.product((x - 1, x, x + 1), (y - 1, y, y + 1)):
                inside = 0 <= nx < SIZE and 0 <= ny < SIZE
                if inside and (nx, ny) not in seen and pixels[nx, ny] != background:
                    seen.add((nx, ny))
                    todo.append((nx, ny))
        found.append(blob)
    return found


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 42, 10**9 + 2])
def test_the_picture_holds_exactly_the_listed_icons(seed):
    item = PixmoCount.generated_item(PixmoConfig(max_count=12, max_distractors=8), seed)
    image = PixmoCount.draw(item)
    background = tuple(item["background"])
    pixels = image.load()
    found = blobs(image, background)
    assert len(found) == len(item["icons"])  # apart: each icon is a blob of its own
    for kind, colour, x, y, r in item["icons"]:
        [blob] = [b for b in found if (x, y) in b]  # each icon is drawn where it is listed
        assert {pixels[p] for p in blob} == {tuple(colour)}
        assert all(abs(px - x) <= r + 1 and abs(py - y) <= r + 1 for px, py in blob)
        assert kind in ICON_KINDS
    asked = [i for i in item["icons"] if i[0] == item["kind"]]
    assert str(len(asked)) == item["answer"] == str(item["count"])


def test_counts_kinds_and_tasks_vary():
    items = [PixmoCount.generated_item(PixmoConfig(), s) for s in range(300)]
    assert {i["kind"] for i in items} == set(ICON_KINDS)
    assert {i["count"] for i in items} == set(range(11))  # 0 to max_count
    assert all(i["question"] == f"How many {PLURALS[i['kind']]} are in the image?" for i in items)
    mixed = [PixmoCount.generated_item(PixmoConfig(task="mix"), s) for s in range(100)]
    tasks = [i["category"] for i in mixed]
    assert 30 < tasks.count("point") < 70 and min(i["count"] for i in mixed) >= 1
    point = next(i for i in mixed if i["category"] == "point")
    assert point["question"].startswith(f"Point to every {point['kind']} in the image.")
    icons = [(x, y, r) for k, _, x, y, r in point["icons"] if k == point["kind"]]
    assert hits(read_points(point["answer"]), icons) == len(icons) == point["count"]


# ----- scoring ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>3</answer>", 1.0),
        ("<answer>three</answer>", 1.0),
        ("<answer>03</answer>", 1.0),
        ("<answer>4</answer>", -1.0),
        ("<answer>3 stars</answer>", -1.0),
        ("3", -1.0),
    ],
)
def test_counts_compare_numerically(completion, score):
    assert make().score({"category": "count", "answer": "3"}, completion) == score


ICONS = [
    ["star", [0, 0, 0], 64, 64, 10],
    ["star", [0, 0, 0], 192, 192, 10],
    ["arrow", [0, 0, 0], 128, 40, 10],
]
POINT_ITEM = {"category": "point", "kind": "star", "answer": "", "icons": ICONS}


@pytest.mark.parametrize(
    ("points", "exact", "f1"),
    [
        ([(25.0, 25.0), (75.0, 75.0)], 1.0, 1.0),  # both stars, each once
        ([(75.0, 75.0), (25.0, 25.0)], 1.0, 1.0),  # in any order
        ([(27.0, 26.0), (74.0, 76.0)], 1.0, 1.0),  # anywhere on them
        ([(25.0, 25.0)], -1.0, 2 * (2 / 3) - 1),  # one missed
        ([(25.0, 25.0), (25.5, 25.5)], -1.0, 0.0),  # one star twice: the second misses
        ([(25.0, 25.0), (75.0, 75.0), (50.0, 15.6)], -1.0, 2 * 0.8 - 1),  # and the arrow
        ([], -1.0, -1.0),
    ],
)
def test_points_hit_each_icon_once(points, exact, f1):
    completion = f"<answer>{points_text(points, 'stars')}</answer>"
    assert make().score(POINT_ITEM, completion) == exact
    assert make(points_reward="f1").score(POINT_ITEM, completion) == pytest.approx(f1)


def test_points_are_read_in_molmo_forms():
    assert read_points('<points x1="1" y1="2" x2="3.5" y2="4" alt="a">a</points>') == [
        (1.0, 2.0),
        (3.5, 4.0),
    ]
    assert read_points('<point x="10" y="20">a</point> and <point y="40" x="30">b</point>') == [
        (10.0, 20.0),
        (30.0, 40.0),
    ]
    assert read_points('<points x1="1" y1="2" x2="3">a</points>') == [(1.0, 2.0)]  # half a point
    verdict = make().verdict(POINT_ITEM, "<answer>none here</answer>")
    assert (verdict.score, verdict.answered) == (-1.0, False)
    assert make().verdict(POINT_ITEM, "<answer>2</answer>").measures["count_error"] == 2.0


# ----- PixMo-Count's web pictures --------------------------------------------------------------

RED = png_of((255, 0, 0), (30, 20))


@pytest.fixture(scope="module")
def image_site() -> Iterator[str]:
    """A web server on loopback: /red.png (a PNG), /text (not an image), anything else 404."""

    async def page(request: Request) -> Response:
        name = request.path_params["name"]
        if name == "red.png":
            return Response(RED, media_type="image/png")
        if name == "text":
            return Response(b"hello", media_type="text/plain")
        return Response(b"gone", status_code=404)

    with serve_in_thread(Starlette(routes=[Route("/{name}", page)])) as url:
        yield url


def test_downloads_are_checked_against_their_hash(image_site):
    assert fetch_url(f"{image_site}/red.png") == RED
    assert fetch_url(f"{image_site}/red.png", hashlib.sha256(RED).hexdigest().upper()) == RED
    with pytest.raises(ImageUnavailable, match="sha256"):
        fetch_url(f"{image_site}/red.png", "0" * 64)
    with pytest.raises(ImageUnavailable, match="404"):
        fetch_url(f"{image_site}/missing.png")
    with pytest.raises(ImageUnavailable, match="http"):
        fetch_url("file:///etc/passwd")


def pixmo_rows(site: str) -> list[dict[str, Any]]:
    sha = hashlib.sha256(RED).hexdigest()
    return [
        {"image_url": f"{site}/red.png", "image_sha256": sha, "label": "apples", "count": 3},
        {"image_url": f"{site}/missing.png", "image_sha256": sha, "label": "cars", "count": 2},
        {"image_url": f"{site}/text", "image_sha256": None, "label": "dogs", "count": 5},
        {"image_url": f"{site}/red.png", "image_sha256": "0" * 64, "label": "cats", "count": 1},
        {"image_url": "", "image_sha256": None, "label": "none", "count": 1},
    ]


def test_hub_rows_become_count_questions_with_their_url(monkeypatch, image_site):
    fake_hub(monkeypatch, pixmo_rows(image_site), only="allenai/pixmo-count")
    env = make(dataset_name="allenai/pixmo-count")
    items = env.load()
    assert len(items) == 4  # the row without a URL is skipped
    assert items[0]["question"] == "How many apples are in the image?"
    assert (items[0]["answer"], items[0]["category"], items[0]["id"]) == (
        "3",
        "count",
        "pixmo-train-0",
    )
    assert env.image_base64(items[0]) == base64.b64encode(RED).decode()  # a PNG: kept as it is
    for bad in items[1:]:
        with pytest.raises(ImageUnavailable):
            env.image_base64(bad)


def test_an_item_whose_picture_is_gone_is_dropped_and_counted(monkeypatch, image_site):
    fake_hub(monkeypatch, pixmo_rows(image_site), only="allenai/pixmo-count")
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make(fake.base_url, dataset_name="allenai/pixmo-count")

        async def main() -> tuple[Any, Any, dict[str, int]]:
            await env.setup()
            counts: dict[str, int] = {}
            token = DROP_REASONS.set(counts)
            try:
                good = await env.collect_trajectories(env.items[0])
                gone = await env.collect_trajectories(env.items[1])
            finally:
                DROP_REASONS.reset(token)
                await env.aclose()
            return good, gone, counts

        good, gone, counts = asyncio.run(main())
    assert good[0] is not None and good[0]["images"][0] == env.image_base64(env.items[0])
    assert gone == (None, []) and counts == {"image_unavailable": 1}


def test_evaluation_leaves_out_and_counts_pictures_it_cannot_have(
    monkeypatch, image_site, tmp_path
):
    fake_hub(monkeypatch, pixmo_rows(image_site), only="allenai/pixmo-count")
    with FakeInferenceServer(responder=lambda prompt: "<answer>3</answer>") as fake:
        env = make_env(
            PixmoCount,
            fake.base_url,
            "evaluate",
            server_type="vllm",
            dataset_name="allenai/pixmo-count",
            eval_size=5,
            data_dir_to_save_evals=str(tmp_path),
        )
        metrics = evaluate(env)
    assert metrics["eval/images_unavailable"] == 3.0
    assert metrics["eval/percent_correct"] == 1.0 and metrics["eval/count_error"] == 0.0
