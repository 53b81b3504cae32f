"""`repetition_penalty`: a penalty (0.0 down to -1.0) for completions that loop or stutter.

>>> repetition_penalty("The cat sat on the mat while the dog slept by the warm fire all day.")
0.0
>>> looping = "I will check the sum again. " * 6
>>> repetition_penalty(looping) < -0.5
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from atropos.rewards.registry import Completion, override_weights, reward, text_of

__all__ = ["COMPONENT_WEIGHTS", "STOPWORDS", "repetition_penalty", "repetition_rates"]

COMPONENT_WEIGHTS: dict[str, float] = {"ngrams": 0.5, "sentences": 0.3, "words": 0.2}
STOPWORDS: frozenset[str] = frozenset(
    "a an the and or but if of to in on at by for with as is are was were be been it this that"
    " had has have do did i you he she we they".split()
)
_WORD = re.compile(r"[\w']+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_PARAGRAPH = re.compile(r"\n\s*\n")
_MIN_PARAGRAPH_WORDS = 5  # shorter paragraphs ("Answer:") may repeat without penalty


def _duplicate_share(parts: Sequence[str]) -> float:
    """The share of `parts` that repeat an earlier one."""
    return 1.0 - len(set(parts)) / len(parts) if parts else 0.0


def _normalized(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def repetition_rates(
    text: str, ngram_size: int = 3, stopwords: Iterable[str] = STOPWORDS
) -> dict[str, float]:
    """Each component's repetition rate in [0, 1].

    - `ngrams`: the share of word n-grams that repeat an earlier one;
    - `sentences`: the share of sentences that repeat an earlier one;
    - `words`: the share of (non-stopword) words equal to the word before ("very very");
    - `paragraphs`: the share of paragraphs (of 5 words or more) that repeat an earlier one.

    >>> repetition_rates("go go go now", ngram_size=2)["words"]
    0.5
    """
    words = _WORD.findall(text.lower())
    grams = [" ".join(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    sentences = [s for s in map(_normalized, _SENTENCE.split(text)) if s]
    skip = set(stopwords)
    content = [w for w in words if w not in skip]
    stutters = sum(1 for a, b in zip(content, content[1:], strict=False) if a == b)
    paragraphs = [
        p
        for p in map(_normalized, _PARAGRAPH.split(text))
        if len(p.split()) >= _MIN_PARAGRAPH_WORDS
    ]
    return {
        "ngrams": _duplicate_share(grams),
        "sentences": _duplicate_share(sentences),
        "words": stutters / len(content) if content else 0.0,
        "paragraphs": _duplicate_share(paragraphs),
    }


@reward("repetition_penalty", aliases=("repetitionpenalty",))
def repetition_penalty(
    completion: Completion,
    *,
    answer: object = None,
    threshold: float = 0.05,
    min_words: int = 10,
    min_sentences: int = 1,
    short_text_penalty: float = -0.1,
    paragraph_repetition_base_penalty: float = -0.6,
    component_weights: Mapping[str, float] | None = None,
    stopwords: Sequence[str] | None = None,
    ngram_size: int = 3,
) -> float:
    """0.0 for a text that does not repeat itself, down to -1.0 for one that only loops.

    The weighted mean of the `ngrams`, `sentences` and `words` rates (`repetition_rates`) is
    the repetition; up to `threshold` it costs nothing, above it the penalty grows linearly to
    -1.0 at full repetition. A repeated paragraph costs at least
    `paragraph_repetition_base_penalty`, more the more paragraphs repeat (down to -1.0).

    Args:
        threshold: the repetition tolerated without penalty.
        min_words, min_sentences: a shorter text scores `short_text_penalty` (too short to
            judge; upstream's rule).
        component_weights: weights of `ngrams`, `sentences`, `words` (default 0.5, 0.3, 0.2).
        stopwords: words a stutter may repeat ("had had"); default: common English ones.
        ngram_size: words per n-gram.

    >>> repetition_penalty("Too short."), repetition_penalty("")
    (-0.1, -0.1)
    """
    weights = override_weights(
        COMPONENT_WEIGHTS, component_weights, "repetition_penalty", "component"
    )
    text = text_of(completion)
    if (
        len(_WORD.findall(text)) < min_words
        or len([s for s in _SENTENCE.split(text) if s.strip()]) < min_sentences
    ):
        return float(short_text_penalty)
    rates = repetition_rates(text, ngram_size, STOPWORDS if stopwords is None else stopwords)
    total = sum(weights.values())
    rate = sum(w * rates[name] for name, w in weights.items()) / total if total else 0.0
    penalty = 0.0
    if rate > threshold and threshold < 1.0:
        penalty = -min(1.0, (rate - threshold) / (1.0 - threshold))
    if rates["paragraphs"] > 0:
        paragraph = max(-1.0, paragraph_repetition_base_penalty * (1.0 + rates["paragraphs"]))
        penalty = min(penalty, paragraph)
    return penalty
