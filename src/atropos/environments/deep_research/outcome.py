"""What a played episode is worth: `Outcome` (the reward and per-item metrics), and the means
that training and evaluation log.

The answer's score is its token F1 (`answer_metric: f1`), its exact match (`em`) or the judge's
verdict (`judge`, from `judging.py`); exact match and F1 are measured in every case. An episode
without an answer scores 0 (`scoring.py` has the rule).

>>> from atropos.environments.deep_research.episode import Episode
>>> from atropos.environments.deep_research.questions import Question
>>> episode = Episode(Question("q", "Who?", ("Ysolde Marr",), ("guild",)), [])
>>> episode.research.answer, episode.research.citations = "Marr", ("guild",)
>>> episode.research.opened.add("guild")
>>> found = outcome(episode, "f1", citation_weight=0.5)
>>> found.em, round(found.f1, 3), found.citation_recall, round(found.reward, 3)
(0.0, 0.667, 1.0, 0.667)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from atropos.environments.deep_research.episode import Episode
from atropos.environments.deep_research.scoring import (
    check_citations,
    exact_match,
    reward,
    token_f1,
)

__all__ = ["Outcome", "columns", "means", "outcome"]


@dataclass(frozen=True)
class Outcome:
    """One episode's reward and metrics (all 0 for an episode without an answer)."""

    reward: float
    answered: float
    em: float
    f1: float
    answer_score: float
    citation_score: float
    citation_precision: float
    citation_recall: float | None
    searches: int
    opens: int
    turns: int
    tool_errors: int

    def metrics(self) -> dict[str, float]:
        """The metrics as numbers (a recall of None left out)."""
        return {k: float(v) for k, v in asdict(self).items() if v is not None}


def outcome(
    episode: Episode,
    metric: str,
    citation_weight: float,
    verdict: float | None = None,
    supporting: bool = True,
) -> Outcome:
    """The outcome of `episode`; `verdict` is the judge's score of its answer (with
    `metric == "judge"`). Without `supporting` the question's supporting ids are not compared
    (a web search, whose ids are not the collection's): every valid citation counts."""
    research, question = episode.research, episode.question
    counts = {
        "searches": research.searches,
        "opens": research.opens,
        "turns": episode.turns,
        "tool_errors": research.errors,
    }
    if research.answer is None:
        recall = 0.0 if question.supporting and supporting else None
        return Outcome(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, recall, **counts)
    em = exact_match(research.answer, question.answers)
    f1 = token_f1(research.answer, question.answers)
    answer = {"em": em, "f1": f1}.get(metric, verdict or 0.0)
    support = question.supporting if supporting else ()
    check = check_citations(research.citations, research.opened, support)
    value = reward(answer, check.score, citation_weight)
    return Outcome(value, 1.0, em, f1, answer, check.score, check.precision, check.recall, **counts)


def columns(outcomes: Sequence[Outcome]) -> dict[str, list[float]]:
    """Each metric's values over `outcomes`, in order (a recall only where there is one)."""
    rows = [o.metrics() for o in outcomes]
    keys = dict.fromkeys(k for row in rows for k in row)
    return {k: [row[k] for row in rows if k in row] for k in keys}


def means(outcomes: Sequence[Outcome], prefix: str) -> dict[str, float]:
    """`{prefix}/{metric}`: the mean of each metric over `outcomes`."""
    return {f"{prefix}/{k}": sum(v) / len(v) for k, v in columns(outcomes).items()}
