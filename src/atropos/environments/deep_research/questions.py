"""Questions with gold answers and supporting documents: the shipped set, a local file, HotpotQA.

A question row has `question`, `answers` (a list of accepted answers; a single `answer` string
is read too) and optionally `supporting` (the ids of the documents that hold the answer;
`supporting_ids` is read too) and `id`. The shipped set (`data/deep_research/`) was written
for this project over its own corpus of a fictional archipelago: `corpus.jsonl`, `train.jsonl`,
`test.jsonl`.

The hub loader reads a HotpotQA-style dataset (`hotpotqa/hotpot_qa`, config `distractor`): each
row's context paragraphs join the corpus (one document per title, its id the title's slug) and
its supporting-fact titles are the supporting documents. `datasets` is imported only then.

>>> to_question({"question": "Who?", "answer": "Ysolde Marr", "supporting": ["guild"]}, "r1")
Question(id='r1', question='Who?', answers=('Ysolde Marr',), supporting=('guild',))
>>> slug("Gannet's Wake (ship)")
'gannets-wake-ship'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos.environments.common.data_loading import (
    data_path,
    load_hub,
    read_jsonl,
    split_rows,
)
from atropos.environments.deep_research.corpus import Document

__all__ = [
    "HOTPOT_SPLITS",
    "Question",
    "load_hotpot",
    "load_questions",
    "shipped_corpus_path",
    "slug",
    "to_question",
]

#: Our split names -> HotpotQA's (it has no labelled test split: its validation set serves).
HOTPOT_SPLITS = {"train": "train", "test": "validation"}


@dataclass(frozen=True)
class Question:
    """One item: the question, its accepted answers and the documents that support them."""

    id: str
    question: str
    answers: tuple[str, ...]
    supporting: tuple[str, ...] = ()


def slug(title: str) -> str:
    """A document id made from a title: lower case, words joined by `-`, apostrophes dropped."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower().replace("'", "").replace("’", "")))


def _strings(value: Any, field: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise ValueError(f"{where}: '{field}' must be a list of strings")
    return tuple(str(v) for v in value)


def to_question(row: Mapping[str, Any], where: str) -> Question:
    """The question of `row`; `where` names it in errors (and is its id when it has none)."""
    text = row.get("question")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: a question row needs a 'question' string")
    answers = _strings(row.get("answers", row.get("answer")), "answers", where)
    if not any(a.strip() for a in answers):
        raise ValueError(f"{where}: a question row needs a non-empty 'answers' list")
    supporting = _strings(row.get("supporting", row.get("supporting_ids", [])), "supporting", where)
    return Question(str(row.get("id") or where), text, answers, supporting)


def shipped_corpus_path() -> Path:
    """The shipped corpus (`data/deep_research/corpus.jsonl`)."""
    return data_path("deep_research", "corpus.jsonl")


def load_questions(
    split: str, path: str | None = None, test_fraction: float = 0.2
) -> list[Question]:
    """The questions of `split` ("train" or "test"): the shipped set's, or those of `path`.

    `path` is a JSONL file, whose rows are shuffled with seed 42 and the first
    `ceil(test_fraction · rows)` held out for "test", or a folder with `train.jsonl` and
    `test.jsonl`.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if path is None:
        source = data_path("deep_research", f"{split}.jsonl")
        return _read(source)
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / f"{split}.jsonl").is_file():
            raise FileNotFoundError(f"--env.questions {local}: no {split}.jsonl in it")
        return _read(local / f"{split}.jsonl")
    if not local.is_file():
        raise FileNotFoundError(f"--env.questions {local}: no such file or folder")
    every = _read(local)  # numbered (and named) before the split, so ids stay unique
    if len(every) < 2:
        raise ValueError(f"--env.questions {local}: {len(every)} rows, too few to split")
    held = min(len(every) - 1, max(1, math.ceil(test_fraction * len(every))))
    train, test = split_rows([{"question": q} for q in every], held)
    return [row["question"] for row in (test if split == "test" else train)]


def _read(path: Path) -> list[Question]:
    return [to_question(row, f"{path} row {n}") for n, row in enumerate(read_jsonl(path), 1)]


def _hotpot_row(row: Mapping[str, Any], where: str) -> tuple[list[Document], Question]:
    """The context documents and the question of one HotpotQA row."""
    context, facts = row.get("context") or {}, row.get("supporting_facts") or {}
    titles, sentences = context.get("title") or [], context.get("sentences") or []
    docs = [
        Document(slug(t), t, " ".join(s).strip())
        for t, s in zip(titles, sentences, strict=False)
        if slug(t)
    ]
    supporting = tuple(dict.fromkeys(slug(t) for t in facts.get("title") or []))
    question = to_question(
        {"id": row.get("id"), "question": row.get("question"), "answer": row.get("answer")}, where
    )
    return docs, Question(question.id, question.question, question.answers, supporting)


def load_hotpot(
    name: str, config: str | None, split: str, limit: int | None
) -> tuple[list[Document], list[Question]]:
    """(context documents, questions) of the first `limit` rows of a HotpotQA-style dataset's
    split (`HOTPOT_SPLITS`); documents with the same title are kept once."""
    rows = load_hub(name, HOTPOT_SPLITS[split], config)
    docs: dict[str, Document] = {}
    questions = []
    for n, row in enumerate(rows[:limit] if limit else rows):
        found, question = _hotpot_row(row, f"{name} {split} row {n}")
        for doc in found:
            docs.setdefault(doc.id, doc)
        questions.append(question)
    return list(docs.values()), questions
