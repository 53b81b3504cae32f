"""`ocr_vqa`: read a book cover and answer a question about it, in `<answer>` tags.

Upstream's `ocr_vqa` (atroposlib 0.4.0's "multimodal DPO" family), on generated covers by
default (`book_cover`: a title, an author, a genre and a year written in Pillow's own font at
varied sizes, places and colours, from a seed) with OCR-VQA's kinds of question: "What is the
title of this book?", "Who wrote this book?", "What is the genre of this book?", "What year
was this book published?", "Is this a Travel book?". Answers compare up to case, spacing and
the punctuation or quotes around them (numbers numerically); +1 right, else -1, as upstream.
The hub's covers read with `--env.dataset_name howard-hou/OCR-VQA` (`image`, `questions`,
`answers`): every question of a row is an item (`--env.questions_per_row 1` keeps upstream's
first only). docs/multimodal.md.

>>> item = OCRVQA.generated_item(OCRConfig(), 11)
>>> item["id"], item["category"] in CATEGORIES
('ocr-11', True)
>>> category_of("Who is the author of this book?"), category_of("Is this a comedy book?")
('author', 'yes_no')
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from atropos.environments.multimodal.base import VisionConfig, VisionEnv
from atropos.environments.multimodal.book_cover import GENRES, draw_cover, make_book

__all__ = ["CATEGORIES", "OCRConfig", "OCRVQA", "category_of"]

CATEGORIES = ("title", "author", "genre", "year", "yes_no")
ASKED = {
    "title": ("What is the title of this book?", "What is the name of this book?"),
    "author": ("Who wrote this book?", "Who is the author of this book?"),
    "genre": ("What is the genre of this book?", "What type of book is this?"),
    "year": ("What year was this book published?", "In which year did this book come out?"),
}
_CUES = (  # how a hub question's wording gives its kind, first match wins
    ("yes_no", ("is this ",)),
    ("author", ("who ", "author")),
    ("title", ("title", "name of this book")),
    ("genre", ("genre", "type of book")),
    ("edition", ("edition",)),
    ("year", ("year",)),
)


def category_of(question: str) -> str:
    """The kind of an OCR-VQA question from its wording ("other" when none fits)."""
    text = question.lower()
    for category, cues in _CUES:
        if any(text.startswith(c) if c.endswith(" ") else c in text for c in cues):
            return category
    return "other"


class OCRConfig(VisionConfig):
    """`ocr_vqa`'s settings."""

    questions_per_row: int = Field(
        default=0, ge=0, description="hub questions kept per cover (0: all; upstream kept 1)"
    )


class OCRVQA(VisionEnv[OCRConfig]):
    """Answer a question about a book cover's text; +1 right, else -1."""

    name = "ocr_vqa"
    kind = "ocr"
    task = "You answer questions about the cover of a book."
    example = "The Silent River"
    hub_fields = ("image", "questions", "answers")

    @classmethod
    def make_item(cls, config: OCRConfig, seed: int) -> dict[str, Any]:
        book = make_book(seed)
        rng = random.Random(f"ocr-question:{seed}")
        category = rng.choice(CATEGORIES)
        if category == "yes_no":
            genre = book["genre"] if rng.random() < 0.5 else rng.choice(GENRES)
            form = rng.choice(("Is this a {} book?", "Is this book related to {}?"))
            question, answer = form.format(genre), "yes" if genre == book["genre"] else "no"
        else:
            question, answer = rng.choice(ASKED[category]), str(book[category])
        return {
            "question": question,
            "answer": answer,
            "category": category,
            "book": book,
        }

    @classmethod
    def draw(cls, item: Mapping[str, Any]) -> Any:
        return draw_cover(item["book"])

    def hub_item(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        pairs = list(zip(row["questions"] or [], row["answers"] or [], strict=False))
        if row["image"] is None:
            return []
        if self.config.questions_per_row:
            pairs = pairs[: self.config.questions_per_row]
        return [
            {
                "question": str(q),
                "answer": str(a),
                "category": category_of(str(q)),
                "image": row["image"],
            }
            for q, a in pairs
        ]

    @classmethod
    def wrong_answer(cls, item: Mapping[str, Any]) -> str:
        """The default's, or for a title, an author or a genre, a near miss (a word short)."""
        gold = str(item["answer"])
        words = gold.split()
        return " ".join(words[:-1]) if len(words) > 1 else super().wrong_answer(item)
