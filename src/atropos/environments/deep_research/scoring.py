"""The rules of `deep_research` as plain functions: answer match, citation check, the reward.

Answers are compared as SQuAD compares them (Rajpurkar et al., 2016, the official evaluation
script's rules): lower case, punctuation removed, the articles a/an/the removed, whitespace
collapsed. Exact match is equality of the normalised strings; F1 is the bag-of-tokens F1 of the
two. Against several gold answers (aliases) the best score counts.

Citations are checked against what the rollout did: a cited id is *valid* when the document
exists and the rollout opened it; the support is the share of the question's supporting
documents among the valid citations (`citation_score`). The reward is

    reward = answer × ((1 − w) + w × citation_score)

with `answer` the F1, the exact match or the judge's verdict (0 to 1) and `w` the citation
weight: citations scale a right answer between `1 − w` (none, or none valid) and 1 (every
supporting document cited, nothing invalid), and never earn anything for a wrong one. No answer
is 0.

>>> normalize_answer("The  Sea-Lark!")
'sealark'
>>> exact_match("the Sea Lark", ["Sea Lark"]), round(token_f1("Admiral Bresk Halloway",
...     ["Bresk Halloway"]), 3)
(1.0, 0.8)
>>> check = check_citations(["a", "zz"], opened={"a"}, supporting=["a", "b"])
>>> check.valid, check.precision, check.recall, check.score
(('a',), 0.5, 0.5, 0.25)
>>> reward(1.0, check.score, weight=0.4)
0.7
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "CitationCheck",
    "check_citations",
    "exact_match",
    "normalize_answer",
    "reward",
    "token_f1",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _f1(predicted: str, gold: str) -> float:
    pred, true = normalize_answer(predicted).split(), normalize_answer(gold).split()
    if not pred or not true:
        return float(pred == true)
    common = sum((Counter(pred) & Counter(true)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(true)
    return 2 * precision * recall / (precision + recall)


def exact_match(predicted: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised answer equals one normalised gold answer, else 0.0."""
    mine = normalize_answer(predicted)
    return float(any(mine == normalize_answer(g) for g in golds))


def token_f1(predicted: str, golds: Iterable[str]) -> float:
    """The best bag-of-tokens F1 of the normalised answer against the gold answers."""
    return max((_f1(predicted, g) for g in golds), default=0.0)


@dataclass(frozen=True)
class CitationCheck:
    """What the citations of one answer were worth.

    Attributes:
        cited: the cited ids, duplicates removed, in order.
        valid: those that exist and were opened by the rollout.
        precision: supporting documents among the cited ids, over the cited ids (0 with none);
            when the question names no supporting documents, the share of valid citations.
        recall: supporting documents cited (validly) over the supporting documents; None when the
            question names no supporting documents (a web search, a collection without them).
        score: the share of valid citations times the recall (the recall counts as 1 when it is
            None); 0 with no citation.
    """

    cited: tuple[str, ...]
    valid: tuple[str, ...]
    precision: float
    recall: float | None
    score: float


def check_citations(
    cited: Sequence[str], opened: Collection[str], supporting: Sequence[str]
) -> CitationCheck:
    """Check `cited` against the documents the rollout `opened` (only a document that exists
    opens) and the question's `supporting` ids (may be empty)."""
    ids = tuple(dict.fromkeys(cited))
    valid = tuple(i for i in ids if i in opened)
    support = set(supporting)
    precision = sum(1 for i in ids if i in support) / len(ids) if ids and support else 0.0
    recall = sum(1 for i in valid if i in support) / len(support) if support else None
    if not ids:
        return CitationCheck(ids, valid, precision, recall, 0.0)
    share = len(valid) / len(ids)
    if not support:
        precision = share  # nothing to compare with: what was cited and opened counts
    score = share * (1.0 if recall is None else recall)
    return CitationCheck(ids, valid, precision, recall, round(score, 6))


def reward(answer: float, citation_score: float, weight: float) -> float:
    """`answer × ((1 − weight) + weight × citation_score)` (see the module docstring)."""
    return round(answer * ((1.0 - weight) + weight * citation_score), 6)
