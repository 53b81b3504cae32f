"""Generated book covers for `ocr_vqa`: a title, an author, a genre and a year, drawn as text.

`make_book(seed)` picks the words and the looks (plain Python, the same on every machine);
`layout(book)` places the text with Pillow's own font (`ImageFont.load_default(size)`), and
`draw_cover(book)` draws a 200x300 cover. The title is wrapped to the cover's width at the top;
the author, genre and year follow in a shuffled order with random gaps; each line is aligned
left, centred or right, in a colour that stands out from the background. No two lines' boxes
overlap, so each field can be read, and the tests check that each box holds exactly its text.

>>> book = make_book(5)
>>> book == make_book(5), sorted(k for k in book if k in FIELDS)
(True, ['author', 'genre', 'title', 'year'])
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atropos.environments.common.vision import require_pillow
from atropos.environments.multimodal.drawing import RGB, canvas

__all__ = ["FIELDS", "GENRES", "HEIGHT", "WIDTH", "Line", "draw_cover", "layout", "make_book"]

WIDTH, HEIGHT = 200, 300
FIELDS = ("title", "author", "genre", "year")
GENRES = (  # the book categories OCR-VQA's covers come with
    "Arts & Photography",
    "Biographies & Memoirs",
    "Business & Money",
    "Children's Books",
    "Comics & Graphic Novels",
    "Computers & Technology",
    "Cookbooks, Food & Wine",
    "Health, Fitness & Dieting",
    "History",
    "Humor & Entertainment",
    "Law",
    "Literature & Fiction",
    "Mystery, Thriller & Suspense",
    "Politics & Social Sciences",
    "Reference",
    "Religion & Spirituality",
    "Romance",
    "Science & Math",
    "Science Fiction & Fantasy",
    "Self-Help",
    "Sports & Outdoors",
    "Teen & Young Adult",
    "Travel",
)
ADJECTIVES = (
    "Silent Hidden Golden Broken Last Secret Quiet Wild Distant Crimson Forgotten Endless"
    " Bright Little Northern Winter Paper Iron Glass Salt"
).split()
NOUNS = (
    "River Garden Kingdom Lantern Harbor Mountain Letter Orchard Compass Island Forest Engine"
    " Bridge Archive Voyage Kitchen Atlas Signal Tide Sparrow"
).split()
PLACES = ("Paris", "Autumn", "the Desert", "the City", "Winter", "the North", "Lisbon", "Spring")
FIRST = (
    "Anna Ben Clara David Elena Farid Grace Hugo Ines Jonas Keiko Liam Maya Noor Omar Priya".split()
)
LAST = (
    "Alvarez Brooks Chen Dubois Eriksen Fischer Garcia Haddad Ito Kowalski Laurent Mensah".split()
)
TITLES = ("The {a} {n}", "{n} of {p}", "A {n} in {p}", "{a} {n}s", "The {n} and the {m}")
DARK: tuple[RGB, ...] = ((24, 32, 60), (70, 20, 30), (20, 60, 40), (40, 40, 40), (90, 50, 10))
LIGHT: tuple[RGB, ...] = ((245, 240, 225), (250, 250, 250), (235, 225, 180), (200, 225, 240))
MARGIN = 12  # pixels kept clear at each edge
SIZES = {"title": (18, 26), "author": (12, 16), "genre": (10, 13), "year": (11, 14)}


@dataclass(frozen=True)
class Line:
    """One line of a cover's text: its field, text, font size, colour and box (x0, y0, x1, y1)."""

    field: str
    text: str
    size: int
    colour: RGB
    box: tuple[int, int, int, int]


def make_book(seed: int) -> dict[str, Any]:
    """A book's title, author, genre and year, and how its cover looks, from `seed`."""
    rng = random.Random(seed)
    words = {"a": rng.choice(ADJECTIVES), "n": rng.choice(NOUNS), "m": rng.choice(NOUNS)}
    dark = rng.random() < 0.5
    inks = LIGHT if dark else DARK
    order = ["author", "genre", "year"]
    rng.shuffle(order)
    return {
        "title": rng.choice(TITLES).format(p=rng.choice(PLACES), **words),
        "author": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
        "genre": rng.choice(GENRES),
        "year": rng.randint(1950, 2024),
        "background": rng.choice(DARK if dark else LIGHT),
        "colours": {f: rng.choice(inks) for f in FIELDS},
        "sizes": {f: rng.randint(*SIZES[f]) for f in FIELDS},
        "align": rng.choice(("left", "centre", "right")),
        "order": ["title", *order],
        "gaps": [rng.random() for _ in range(3)],
    }


def _wrapped(text: str, font: Any, width: int) -> list[str]:
    """`text` broken into lines no wider than `width` pixels (a longer word stays whole)."""
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def layout(book: Mapping[str, Any]) -> list[Line]:
    """Where each line of the cover's text goes (fonts shrink until everything fits)."""
    pil = require_pillow()
    for shrink in range(0, 12):
        blocks = []
        for f in book["order"]:
            size = max(8, book["sizes"][f] - shrink)
            font = pil.ImageFont.load_default(size=size)
            text = str(book[f])
            parts = _wrapped(text, font, WIDTH - 2 * MARGIN) if f == "title" else [text]
            boxes = [font.getbbox(p) for p in parts]
            blocks.append((f, size, parts, boxes))
        height = sum(b[3] - b[1] + 4 for _, _, _, boxes in blocks for b in boxes)
        widest = max(b[2] - b[0] for _, _, _, boxes in blocks for b in boxes)
        spare = HEIGHT - 2 * MARGIN - height - 8 * len(blocks)
        if spare >= 0 and widest <= WIDTH - 2 * MARGIN:
            return _placed(book, blocks, spare)
    raise ValueError(f"the cover's text does not fit: {book['title']!r}")


def _placed(book: Mapping[str, Any], blocks: list[Any], spare: int) -> list[Line]:
    """The blocks of text top to bottom, `spare` pixels shared out as gaps before each block
    after the title."""
    weights = [w + 0.1 for w in book["gaps"][: len(blocks) - 1]]
    gaps = [0, *(int(spare * w / sum(weights)) for w in weights)]
    y, lines = MARGIN, []
    for (f, size, parts, boxes), gap in zip(blocks, gaps, strict=True):
        y += gap
        for text, (bx0, by0, bx1, by1) in zip(parts, boxes, strict=True):
            width = bx1 - bx0
            x = {"left": MARGIN, "right": WIDTH - MARGIN - width}.get(
                book["align"], (WIDTH - width) // 2
            )
            box = (x, y, x + width, y + by1 - by0)
            lines.append(Line(f, text, size, tuple(book["colours"][f]), box))
            y = box[3] + 4
        y += 8
    return lines


def draw_cover(book: Mapping[str, Any], only: str | None = None) -> Any:
    """The cover as a PIL image; with `only`, just that field's text (for the tests)."""
    pil = require_pillow()
    image, draw = canvas(WIDTH, HEIGHT, tuple(book["background"]))
    edge = tuple(book["colours"]["title"])
    draw.rectangle((3, 3, WIDTH - 4, HEIGHT - 4), outline=edge, width=2)
    for line in layout(book):
        if only is None or line.field == only:
            font = pil.ImageFont.load_default(size=line.size)
            x0, y0 = font.getbbox(line.text)[:2]
            draw.text((line.box[0] - x0, line.box[1] - y0), line.text, fill=line.colour, font=font)
    return image
