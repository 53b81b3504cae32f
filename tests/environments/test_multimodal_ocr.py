"""`ocr_vqa`: covers whose every field is drawn, apart from the others, where the layout says;
questions answered by the book's own fields; scoring; OCR-VQA's rows from the hub."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")
from PIL import Image, ImageChops  # noqa: E402

from atropos.environments.multimodal.book_cover import (  # noqa: E402
    FIELDS,
    GENRES,
    HEIGHT,
    MARGIN,
    WIDTH,
    draw_cover,
    layout,
    make_book,
)
from atropos.environments.multimodal.ocr_vqa import (  # noqa: E402
    CATEGORIES,
    OCRVQA,
    OCRConfig,
    category_of,
)

from .helpers import fake_hub, make_env  # noqa: E402


def make(**env: Any) -> OCRVQA:
    return make_env(OCRVQA, server_type="vllm", **{"train_size": 10, "eval_size": 3, **env})


def crop_equal(a: Image.Image, b: Image.Image, box: tuple[int, int, int, int]) -> bool:
    return ImageChops.difference(a.crop(box), b.crop(box)).getbbox() is None


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 17, 99, 10**9])
def test_each_field_is_drawn_alone_in_its_box(seed):
    book = make_book(seed)
    cover = draw_cover(book)
    blank = draw_cover(book, only="nothing")
    lines = layout(book)
    assert cover.size == (WIDTH, HEIGHT)
    assert {line.field for line in lines} == set(FIELDS)
    for field in FIELDS:
        assert " ".join(line.text for line in lines if line.field == field) == str(book[field])
    for a, b in itertools.combinations(lines, 2):  # no two lines' boxes overlap
        assert (
            a.box[2] <= b.box[0]
            or b.box[2] <= a.box[0]
            or a.box[3] <= b.box[1]
            or (b.box[3] <= a.box[1])
        )
    for line in lines:
        x0, y0, x1, y1 = line.box
        assert MARGIN <= x0 and x1 <= WIDTH - MARGIN and MARGIN <= y0 and y1 <= HEIGHT - MARGIN
        alone = draw_cover(book, only=line.field)
        grown = (x0 - 1, y0 - 1, x1 + 1, y1 + 1)
        assert crop_equal(cover, alone, grown)  # what is in the box is that field's text ...
        assert not crop_equal(cover, blank, line.box)  # ... and it is there to read
    # and nothing is drawn outside the boxes
    boxes = Image.new("L", cover.size, 0)
    for line in lines:
        boxes.paste(255, (line.box[0] - 1, line.box[1] - 1, line.box[2] + 1, line.box[3] + 1))
    drawn = ImageChops.difference(cover, blank).convert("L").point(lambda v: 255 if v else 0)
    assert ImageChops.subtract(drawn, boxes).getbbox() is None


def test_questions_are_answered_by_the_books_fields():
    seen = collections.Counter()
    yes = collections.Counter()
    for seed in range(300):
        item = OCRVQA.generated_item(OCRConfig(), seed)
        book, category = item["book"], item["category"]
        seen[category] += 1
        if category == "yes_no":
            named = next(g for g in GENRES if g in item["question"])
            assert item["answer"] == ("yes" if named == book["genre"] else "no")
            yes[item["answer"]] += 1
        else:
            assert item["answer"] == str(book[category])
            assert category_of(item["question"]) == category
    assert set(seen) == set(CATEGORIES)
    assert yes["yes"] > 20 and yes["no"] > 20


@pytest.mark.parametrize(
    ("completion", "gold", "score"),
    [
        ("<answer>The Silent River</answer>", "The Silent River", 1.0),
        ("<answer>the silent  river.</answer>", "The Silent River", 1.0),
        ('<answer>"The Silent River"</answer>', "The Silent River", 1.0),
        ("<answer>Silent River</answer>", "The Silent River", -1.0),
        ("<answer>Science Fiction & Fantasy</answer>", "Science Fiction & Fantasy", 1.0),
        ("<answer>Science Fiction and Fantasy</answer>", "Science Fiction & Fantasy", -1.0),
        ("<answer>1987</answer>", "1987", 1.0),
        ("<answer>1987.0</answer>", "1987", 1.0),
        ("<answer>Yes</answer>", "yes", 1.0),
        ("The Silent River", "The Silent River", -1.0),  # no tags
    ],
)
def test_scoring_hand_made_answers(completion, gold, score):
    assert make().score({"answer": gold}, completion) == score


def test_ocr_vqa_rows_give_an_item_per_question(monkeypatch):
    rows = [
        {
            "image": Image.new("RGB", (10, 14), (n, 0, 0)),
            "questions": ["Who wrote this book?", "Is this a comedy book?", "What is the edition?"],
            "answers": [f"Author {n}", "No", "2nd"],
        }
        for n in range(3)
    ]
    rows.append({"image": None, "questions": ["Q"], "answers": ["A"]})
    calls = fake_hub(monkeypatch, rows, only="howard-hou/OCR-VQA")
    env = make(dataset_name="howard-hou/OCR-VQA", hub_rows=4)
    items = env.load()
    assert [i["id"] for i in items[:3]] == ["ocr-train-0-0", "ocr-train-0-1", "ocr-train-0-2"]
    assert len(items) == 9  # the row without a picture is skipped
    assert [i["category"] for i in items[:3]] == ["author", "yes_no", "edition"]
    assert (items[3]["question"], items[3]["answer"]) == ("Who wrote this book?", "Author 1")
    assert calls[-1].split == "train[:4]"
    first_only = make(dataset_name="howard-hou/OCR-VQA", questions_per_row=1).load()
    assert [i["id"] for i in first_only] == ["ocr-train-0", "ocr-train-1", "ocr-train-2"]
    assert env.image_base64(items[0]).startswith("iVBORw0KGgo")
    with pytest.raises(ValueError, match="no field 'questions'"):
        fake_hub(monkeypatch, [{"image": None, "question": "?", "answers": []}])
        make(dataset_name="howard-hou/OCR-VQA").load()


@pytest.mark.parametrize(
    ("question", "category"),
    [
        ("Who is the author of this book?", "author"),
        ("What is the title of this book?", "title"),
        ("What type of book is this?", "genre"),
        ("What is the genre of this book?", "genre"),
        ("Is this book related to Travel?", "yes_no"),
        ("Is this a sci-fi book?", "yes_no"),
        ("What is the year printed on this book?", "year"),
        ("How many pages?", "other"),
    ],
)
def test_hub_questions_get_their_kind_from_their_words(question, category):
    assert category_of(question) == category
