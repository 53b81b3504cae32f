"""Shared helpers for the viewer's tests: groups and JSONL files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from atropos.inference.tokenize import tokenize_for_trainer
from atropos.inference.tokenizer import load_tokenizer

INJECTIONS = [
    "<script>window.__pwned = 1</script>",
    "</script><script>window.__pwned = 2</script>",
    '<img src=x onerror="window.__pwned = 3">',
    "&lt;b&gt; \u2028 \u2029 <!-- ]]> -->",
]


@pytest.fixture(scope="session")
def tiny() -> Any:
    return load_tokenizer("tiny")


def chat_group(tok: Any, answers: list[str], scores: list[float], **extra: Any) -> dict:
    """A group of one prompt answered `answers`, tokenized as process mode does."""
    tokens, masks, messages = [], [], []
    for answer in answers:
        chat = [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": answer},
        ]
        out = tokenize_for_trainer(tok, chat)
        tokens.append(out["tokens"])
        masks.append(out["masks"])
        messages.append(chat)
    return {"tokens": tokens, "masks": masks, "scores": scores, "messages": messages, **extra}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """`rows` as JSONL; a str row is written as is (a bad line)."""
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
        encoding="utf-8",
    )
    return path


def page_json(page: str) -> dict:
    """The data embedded in a page."""
    start = page.index("<script type='application/json' id='atropos-data'>")
    start = page.index(">", start) + 1
    end = page.index("</script>", start)
    return json.loads(page[start:end])
