"""DROP's answer scores: exact match and token F1 between a predicted and a gold set of spans.

Written from the DROP paper's description (Dua et al., 2019, section 5): an answer is a set of
spans (a number, a date, or one or more passage spans). Each span is normalised: lower case,
punctuation and the articles a/an/the removed, whitespace collapsed, and a number written as
its value (`1,000` and `1000.0` are `1000`). Exact match: the two sets of normalised spans are
equal. F1: every predicted span is paired with at most one gold span so that the sum of their
bag-of-tokens F1 is largest; the sum is divided by the larger number of spans. A pair whose
gold span holds a number scores 0 unless the prediction holds that number too. Over several
gold answers (DROP's validated answers) the best scores count.

>>> scores(["the 1,000 yards"], ["1000 yards"])
(1.0, 1.0)
>>> scores(["Bears", "Lions"], ["Lions", "Packers"])
(0.0, 0.5)
>>> scores(["12"], ["13"]), round(scores(["John Smith"], ["Smith"])[1], 3)
((0.0, 0.0), 0.667)
"""

from __future__ import annotations

import itertools
import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = ["best_scores", "normalize_span", "scores", "span_f1"]

_ARTICLES = {"a", "an", "the"}
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")
_MAX_EXACT_PAIRING = 7  # up to this many spans the pairing is searched in full, then greedily


def _number(token: str) -> str | None:
    try:
        value = float(token.replace(",", ""))
    except ValueError:
        return None
    return str(int(value)) if value.is_integer() else str(value)


def normalize_span(text: str) -> str:
    """A span for comparison: lower case, numbers as values, no punctuation or articles.

    >>> normalize_span("The  U.S. Army's 3,000.0 men")
    'us armys 3000 men'
    """
    tokens = []
    for token in re.split(r"[\s\-]+", text.lower()):
        number = _number(token.strip(string.punctuation.replace("-", "").replace(".", "")))
        token = number if number is not None else _PUNCTUATION.sub("", token)
        if token and token not in _ARTICLES:
            tokens.append(token)
    return " ".join(tokens)


def _numbers(tokens: Sequence[str]) -> set[str]:
    return {t for t in tokens if _number(t) is not None}


def span_f1(predicted: str, gold: str) -> float:
    """Bag-of-tokens F1 of two normalised spans; 0 when the gold's numbers are missed."""
    pred, true = predicted.split(), gold.split()
    if not pred and not true:
        return 1.0
    if _numbers(true) and not _numbers(true) & _numbers(pred):
        return 0.0
    common = sum((Counter(pred) & Counter(true)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(true)
    return 2 * precision * recall / (precision + recall)


def _pairing_total(predicted: list[str], gold: list[str]) -> float:
    """The largest sum of span F1 over pairings of the spans (each used at most once)."""
    small, large = sorted((predicted, gold), key=len)
    swapped = small is gold

    def f1(i: int, j: int) -> float:
        p, g = (large[j], small[i]) if swapped else (small[i], large[j])
        return span_f1(p, g)

    if len(large) <= _MAX_EXACT_PAIRING:
        pairings = itertools.permutations(range(len(large)), len(small))
        return max(sum(f1(i, j) for i, j in enumerate(p)) for p in pairings)
    free, total = set(range(len(large))), 0.0
    for i in range(len(small)):  # greedy for long lists: the best free partner in turn
        j = max(free, key=lambda j: f1(i, j))
        free.discard(j)
        total += f1(i, j)
    return total


def scores(predicted: Sequence[str], gold: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of a predicted answer against one gold answer (spans each)."""
    pred = [normalize_span(s) for s in predicted if s.strip()]
    true = [normalize_span(s) for s in gold if s.strip()]
    if not pred or not true:
        return (float(pred == true), float(pred == true))
    exact = float(sorted(set(pred)) == sorted(set(true)))
    return exact, _pairing_total(pred, true) / max(len(pred), len(true))


def best_scores(predicted: Sequence[str], golds: Sequence[Sequence[str]]) -> tuple[float, float]:
    """The best (exact match, F1) over several gold answers."""
    found = [scores(predicted, gold) for gold in golds] or [(0.0, 0.0)]
    return max(e for e, _ in found), max(f for _, f in found)
