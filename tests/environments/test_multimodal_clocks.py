"""`clock_reading`: faces whose hands, read back from the pixels, show the answer; times scored
on a 12-hour dial with a tolerance; the hub's clock dataset."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")

from atropos.environments.multimodal.clock_reading import (  # noqa: E402
    HAND_LENGTH,
    SECOND_HAND,
    SIZE,
    ClockConfig,
    ClockReading,
    hand_angles,
    render,
)

from .helpers import fake_hub, make_env  # noqa: E402


def make(**env: Any) -> ClockReading:
    return make_env(ClockReading, server_type="vllm", **{"train_size": 10, "eval_size": 3, **env})


def ring_angles(
    image: Any, item: dict[str, Any], radius: float, colour: tuple[int, ...], near: int = 0
) -> list[int]:
    """The whole degrees (clockwise from 12) at which the circle of `radius` (a share of the
    face's) crosses pixels of exactly `colour` (or passes within `near` pixels of one: a line
    one pixel wide can be stepped over between its diagonal pixels)."""
    pixels = image.load()
    cx, cy, r = item["cx"], item["cy"], item["radius"] * radius
    around = [(dx, dy) for dx in range(-near, near + 1) for dy in range(-near, near + 1)]
    found = []
    for tenth in range(3600):
        a = math.radians(tenth / 10)
        x, y = round(cx + r * math.sin(a)), round(cy - r * math.cos(a))
        if any(pixels[x + dx, y + dy] == colour for dx, dy in around):
            found.append(tenth // 10)
    return sorted(set(found))


def middle(angles: list[int]) -> float:
    """The circular mean of angles in degrees."""
    s = sum(math.sin(math.radians(a)) for a in angles)
    c = sum(math.cos(math.radians(a)) for a in angles)
    return math.degrees(math.atan2(s, c)) % 360


def apart(a: float, b: float) -> float:
    return min(abs(a - b) % 360, 360 - abs(a - b) % 360)


def clusters(angles: list[int]) -> list[list[int]]:
    """Runs of neighbouring whole degrees, round the circle (359 and 0 are neighbours)."""
    runs: list[list[int]] = []
    for a in angles:
        if runs and a - runs[-1][-1] <= 2:
            runs[-1].append(a)
        else:
            runs.append([a])
    if len(runs) > 1 and runs[0][0] + 360 - runs[-1][-1] <= 2:
        runs[0] = runs.pop() + runs[0]
    return runs


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 8, 13, 21, 33, 34, 86, 10**9 + 1])
def test_the_hands_drawn_show_the_answer(seed):
    item = ClockReading.generated_item(ClockConfig(second_hand_rate=0.5), seed)
    image = render(item)
    assert image.size == (SIZE, SIZE)
    hand = tuple(item["hand"])
    expected = hand_angles(item["hour"], item["minute"], item["second"])
    # between the hour hand's tip and the minute hand's, only the minute hand crosses
    outer = ring_angles(image, item, (HAND_LENGTH["hour"] + HAND_LENGTH["minute"]) / 2, hand)
    [run] = clusters(outer)
    minute_angle = middle(run)
    assert apart(minute_angle, expected["minute"]) < 2.5
    # nearer the centre both hands cross: two runs, or one where they overlap
    inner = clusters(ring_angles(image, item, HAND_LENGTH["hour"] * 0.7, hand))
    if len(inner) == 1:
        assert all(min(apart(a, expected[h]) for a in inner[0]) < 2 for h in ("hour", "minute"))
        return
    hour_run = max(inner, key=lambda r: apart(middle(r), minute_angle))
    hour_angle = middle(hour_run)
    assert apart(hour_angle, expected["hour"]) < 4
    minute = round(minute_angle / 6) % 60  # the angles read back, as a time
    hour = round((hour_angle - minute / 2) / 30) % 12 or 12
    if item["second"] is None:
        assert f"{hour:02d}:{minute:02d}" == item["answer"]
    seconds = clusters(ring_angles(image, item, HAND_LENGTH["second"] - 0.03, SECOND_HAND, near=1))
    if item["second"] is None:
        assert seconds == []
    else:
        [run] = seconds
        assert apart(middle(run), expected["second"]) < 3


def test_faces_vary_and_answers_cover_the_dial():
    items = [ClockReading.generated_item(ClockConfig(), s) for s in range(400)]
    assert {i["numerals"] for i in items} == {"arabic", "roman", "ticks"}
    assert {i["category"] for i in items} == {"arabic", "roman", "ticks"}
    hours = collections.Counter(i["hour"] for i in items)
    assert set(hours) == set(range(1, 13))
    assert 0.2 < sum(i["second"] is not None for i in items) / 400 < 0.4
    assert len({(i["cx"], i["cy"], i["radius"]) for i in items}) > 300
    none = ClockReading.generated_item(ClockConfig(second_hand_rate=0), 3)
    assert none["second"] is None


@pytest.mark.parametrize(
    ("completion", "tolerance", "score"),
    [
        ("<answer>03:05</answer>", 0, 1.0),
        ("<answer>3:05</answer>", 0, 1.0),  # upstream's exact text match got this wrong
        ("<answer>15:05</answer>", 0, 1.0),
        ("<answer>3:05 PM</answer>", 0, 1.0),
        ("<answer>3:06</answer>", 0, -1.0),
        ("<answer>3:06</answer>", 1, 1.0),
        ("<answer>3:02</answer>", 2, -1.0),
        ("<answer>2:55</answer>", 10, 1.0),
        ("<answer>five past three</answer>", 10, -1.0),
        ("It is 3:05.", 0, -1.0),  # no tags
    ],
)
def test_times_score_within_the_tolerance(completion, tolerance, score):
    env = make(tolerance_minutes=tolerance)
    assert env.score({"id": "x", "answer": "03:05"}, completion) == score


def test_noon_and_midnight_are_twelve_and_zero_alike():
    env = make()
    for said in ("12:10", "0:10", "00:10"):
        assert env.score({"id": "x", "answer": "12:10"}, f"<answer>{said}</answer>") == 1.0
    verdict = env.verdict({"id": "x", "answer": "11:58"}, "<answer>12:03</answer>")
    assert verdict.measures == {"minute_error": 5.0} and verdict.answered
    assert env.verdict({"id": "x", "answer": "11:58"}, "<answer>?</answer>").answered is False


def test_the_clock_dataset_reads_hour_and_minute(monkeypatch):
    from PIL import Image

    rows = [
        {"image": Image.new("RGB", (9, 9)), "hour": h, "minute": m} for h, m in ((0, 18), (9, 5))
    ]
    rows.append({"image": None, "hour": 1, "minute": 1})
    calls = fake_hub(monkeypatch, rows, only="junyeong-nero/clock-dataset")
    env = make(dataset_name="junyeong-nero/clock-dataset", hub_rows=3)
    items = env.load()
    assert [(i["id"], i["answer"]) for i in items] == [
        ("clock-train-0", "12:18"),  # the dataset's hour 0 is 12 on the dial
        ("clock-train-1", "09:05"),
    ]
    assert items[0]["question"] == "What time does the clock show?"
    assert calls[-1].split == "train[:3]" and env.load_eval() and calls[-1].split == "test[:3]"
    assert env.score(items[0], "<answer>0:18</answer>") == 1.0
