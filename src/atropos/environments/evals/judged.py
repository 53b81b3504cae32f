r"""The judge-scored suites: SimpleQA (a grade per answer), MT-Bench (a 1-10 rating per turn of a
two-turn conversation) and Arena-Hard (pairwise against a baseline answer, both orders).

The judge is `atropos.envs.judge`'s: its own server with `--judge.base_url` (and
`--judge.model_name`, `--judge.api_key`), else the policy's own servers. Here it answers once
per question at temperature 0 unless `--judge.votes` and `--judge.temperature` say otherwise.
A judge answer that cannot be read is counted (`eval/judge_unparsed`) and never turned into a
score: that sample is wrong for pass@k and left out of the benchmark's own score. A sample that
gave no answer (an unclosed `<think>`) is not sent to the judge: SimpleQA counts it as not
attempted, MT-Bench rates the turn 1, Arena-Hard counts it as a loss.

>>> arena_points("The first is far better. [[A>>B]]", model="A")
(1.0, 3)
>>> arena_points("[[A>B]] ... on reflection [[B>A]]", model="A"), arena_points("A wins", "A")
((0.0, 1), None)
>>> majority_grade(["A", "B", "A"]), majority_grade(["A", "C"])
('A', 'C')
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field
from typing_extensions import TypeVar

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.evals.base import Graded, Problem, Sample, answer_text, subset_key
from atropos.environments.evals.formats import Format, Row
from atropos.environments.evals.suite import SuiteConfig, SuiteEval
from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeConfig, JudgedEnv, boxed_choice, rate
from atropos.envs.types import Message

__all__ = [
    "ArenaConfig",
    "ArenaJudged",
    "ArenaPrompt",
    "Conversation",
    "Dialogue",
    "JudgedSuiteConfig",
    "JudgedSuiteEval",
    "MTBenchConfig",
    "MTBenchJudged",
    "ShortAnswer",
    "SimpleQAJudged",
    "arena_points",
    "majority_grade",
    "simpleqa_topic",
]

SIMPLEQA_JUDGE = (
    "You grade one answer to a factual question against the reference answer. The answer is"
    " CORRECT when it states the reference fact (other wording, more detail or a hedge are fine"
    " as long as nothing it says contradicts the reference), INCORRECT when it states something"
    " that contradicts the reference, and NOT ATTEMPTED when it gives no answer or declines."
    " Reply with \\boxed{A} for CORRECT, \\boxed{B} for INCORRECT or \\boxed{C} for NOT"
    " ATTEMPTED."
)
MT_BENCH_JUDGE = (
    "You rate how well an AI assistant answered the last user turn of a conversation:"
    " helpfulness, relevance, accuracy, depth and clarity, and correctness against the reference"
    " answer when one is given. Explain briefly, then end with a line 'Rating: N' where N is a"
    " whole number from 1 (useless) to 10 (excellent)."
)
ARENA_JUDGE = (
    "You compare two AI assistants' answers to the same user prompt: which one serves the user"
    " better (correct, helpful, relevant, complete, clear). Ignore the order and the length of"
    " the answers. Explain briefly, then give your verdict as exactly one of [[A>>B]] (A much"
    " better), [[A>B]], [[A=B]] (a tie), [[B>A]] or [[B>>A]] (B much better)."
)
GRADES = {"A": "correct", "B": "incorrect", "C": "not_attempted"}
_WORST_FIRST = "BCA"  # a tie among grades goes to the worse one
_VERDICT = re.compile(r"\[\[\s*([AB])\s*(>>|>|=|<<|<)\s*([AB])\s*\]\]")
BASELINE = "_baseline"  # the key under which an Arena-Hard row carries its baseline answer


class JudgedSuiteConfig(SuiteConfig):
    """A judged suite's settings; the judge is `--judge.*`."""

    judge: JudgeConfig = Field(
        default_factory=lambda: JudgeConfig(votes=1, temperature=0.0),
        description="the judge model (--judge.*; no base_url: the policy's servers)",
    )


JudgedConfigT = TypeVar("JudgedConfigT", bound=JudgedSuiteConfig, default=JudgedSuiteConfig)


class JudgedSuiteEval(SuiteEval[JudgedConfigT], JudgedEnv):
    """A suite graded by the judge (`grade_samples`); its `Format` only builds the problems."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = JudgedSuiteConfig

    async def grade_samples(self, problem: Problem, samples: list[Sample]) -> list[Graded]:
        return list(await asyncio.gather(*(self.judged(problem, s) for s in samples)))

    async def judged(self, problem: Problem, sample: Sample) -> Graded:
        """One sample graded by the judge."""
        raise NotImplementedError

    async def ask(self, system: str, user: str) -> list[str]:
        """`--judge.votes` judge answers to one request."""
        messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]
        return await self.judge.complete(messages, self.config.judge.votes)


def _share(graded: list[list[Graded]], key: str) -> tuple[list[Any], int]:
    """The values of detail `key` that are set, and how many samples have it unset."""
    values = [g.details.get(key) for row in graded for g in row]
    return [v for v in values if v is not None], sum(v is None for v in values)


# ----- SimpleQA --------------------------------------------------------------------------------


def simpleqa_topic(row: Row) -> dict[str, str]:
    """SimpleQA's topic, from `metadata` (a dict, or its Python text as the hub stores it)."""
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = ast.literal_eval(metadata)
        except (ValueError, SyntaxError):
            return {}
    topic = metadata.get("topic") if isinstance(metadata, dict) else None
    return {"topic": str(topic)} if topic else {}


def majority_grade(letters: list[str]) -> str:
    """The most common grade letter; a tie goes to the worse grade (B, then C, then A)."""
    counts = Counter(letters)
    return max(_WORST_FIRST, key=lambda letter: (counts[letter], -_WORST_FIRST.index(letter)))


@dataclass(frozen=True)
class ShortAnswer(Format):
    """A fact-seeking question and its reference answer (graded by the judge)."""

    question: Callable[[Row], str]
    answer: Callable[[Row], str]

    def problem(self, row: Row, ident: str) -> Problem:
        return Problem(ident, self.question(row).strip(), str(self.answer(row)).strip())


class SimpleQAJudged(JudgedSuiteEval):
    """SimpleQA: the judge grades each answer correct, incorrect or not attempted."""

    async def judged(self, problem: Problem, sample: Sample) -> Graded:
        answer = (answer_text(sample.text) or "").strip()
        if not answer:
            return Graded(None, False, {"grade": GRADES["C"]})
        user = f"Question: {problem.prompt}\nReference answer: {problem.gold}\nAnswer: {answer}"
        votes = await self.ask(SIMPLEQA_JUDGE, user)
        letters = [v for v in (boxed_choice(t, ("A", "B", "C")) for t in votes) if v]
        grade = GRADES[majority_grade(letters)] if letters else None
        return Graded(answer, grade == "correct", {"grade": grade, "judge": votes})

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        grades, unparsed = _share(graded, "grade")
        shares = {g: grades.count(g) / len(grades) if grades else 0.0 for g in GRADES.values()}
        attempted = shares["correct"] + shares["incorrect"]
        given = shares["correct"] / attempted if attempted else 0.0
        both = shares["correct"] + given
        return {
            **{f"eval/{g}": share for g, share in shares.items()},
            "eval/correct_given_attempted": given,
            "eval/f_score": 2 * shares["correct"] * given / both if both else 0.0,
            "eval/judge_unparsed": unparsed,
        }


# ----- MT-Bench --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation(Format):
    """MT-Bench: user turns asked one after the other; reference answers for some categories."""

    turns: Callable[[Row], list[str]]
    reference: Callable[[Row], list[str]]

    def problem(self, row: Row, ident: str) -> Problem:
        turns = [str(t) for t in self.turns(row)]
        if not turns:
            raise ValueError(f"{ident}: the row has no turns")
        return Problem(
            ident, turns[0], [str(r) for r in self.reference(row)], data={"turns": turns}
        )


@dataclass
class Dialogue(Sample):
    """A sampled conversation: the last turn's text, and each turn's answer (None: none)."""

    answers: list[str | None]


class MTBenchConfig(JudgedSuiteConfig):
    """`eval_mt_bench`'s settings."""

    pass_rating: float = Field(
        default=8.0, ge=1, le=10, description="mean turn rating a sample needs to count as right"
    )


def _mt_bench_request(problem: Problem, answers: list[str | None], turn: int) -> str:
    lines = []
    for i in range(turn + 1):
        lines += [f"[User, turn {i + 1}]\n{problem.data['turns'][i]}"]
        lines += [f"[Assistant, turn {i + 1}]\n{answers[i] or ''}"]
    reference = problem.gold[turn] if turn < len(problem.gold) else ""
    if reference.strip():
        lines.append(f"[Reference answer to turn {turn + 1}]\n{reference}")
    return "\n\n".join([*lines, f"Rate the assistant's answer to turn {turn + 1}."])


class MTBenchJudged(JudgedSuiteEval[MTBenchConfig]):
    """MT-Bench: two-turn conversations; the judge rates each turn's answer from 1 to 10."""

    env_config_cls = MTBenchConfig

    async def sample(self, problem: Problem) -> list[Sample]:
        first = await self.complete(self.messages(problem), self.config.eval_n)
        return list(await asyncio.gather(*(self._go_on(problem, s) for s in first)))

    async def _go_on(self, problem: Problem, first: Sample) -> Dialogue:
        history, turns = self.messages(problem), [first]
        for question in problem.data["turns"][1:]:
            history += [
                {"role": "assistant", "content": answer_text(turns[-1].text) or ""},
                {"role": "user", "content": question},
            ]
            turns += await self.complete(history, 1)
        cut = any(t.finish_reason == "length" for t in turns)
        finish = "length" if cut else turns[-1].finish_reason
        return Dialogue(turns[-1].text, finish, [answer_text(t.text) for t in turns])

    async def judged(self, problem: Problem, sample: Sample) -> Graded:
        answers = sample.answers if isinstance(sample, Dialogue) else [answer_text(sample.text)]
        ratings = await asyncio.gather(
            *(self._rate(problem, answers, i) for i in range(len(answers)))
        )
        rated = [r for r in ratings if r is not None]
        right = len(rated) == len(ratings) and sum(rated) / len(rated) >= self.config.pass_rating
        return Graded(answers[-1], right, {"answers": answers, "ratings": list(ratings)})

    async def _rate(self, problem: Problem, answers: list[str | None], turn: int) -> float | None:
        if answers[turn] is None:
            return 1.0  # no answer given (an unclosed think block): the lowest rating
        messages: list[Message] = [
            {"role": "system", "content": MT_BENCH_JUDGE},
            {"role": "user", "content": _mt_bench_request(problem, answers, turn)},
        ]
        verdict = await rate(self.judge, messages, ["rating"], votes=self.config.judge.votes)
        return verdict.means["rating"] if verdict.means else None

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        turns: dict[int, list[float]] = {}
        categories: dict[str, list[float]] = {}
        unparsed = 0
        for problem, row in zip(problems, graded, strict=True):
            for g in row:
                for turn, rating in enumerate(g.details["ratings"], 1):
                    if rating is None:
                        unparsed += 1
                        continue
                    turns.setdefault(turn, []).append(rating)
                    for value in problem.subsets.values():
                        categories.setdefault(subset_key(value), []).append(rating)
        everything = [r for ratings in turns.values() for r in ratings]
        metrics = {"eval/mt_bench_score": _mean(everything), "eval/judge_unparsed": unparsed}
        metrics |= {f"eval/turn_{t}/score": _mean(r) for t, r in sorted(turns.items())}
        metrics |= {f"eval/category/{c}/score": _mean(r) for c, r in sorted(categories.items())}
        return metrics


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


# ----- Arena-Hard ------------------------------------------------------------------------------


def arena_points(text: str, model: str) -> tuple[float, int] | None:
    """The last `[[X>Y]]` verdict of a judge answer as (the model's points, weight): a win 1, a
    tie 0.5, a loss 0; a strong verdict (`>>`) weighs 3, as in Arena-Hard-Auto. `model` is
    the letter the model's answer had; None when no verdict is given."""
    found = _VERDICT.findall(text.upper())
    if not found:
        return None
    left, sign, right = found[-1]
    if left == right:
        return None
    if sign.startswith("<"):
        left, right, sign = right, left, sign.replace("<", ">")
    weight = 3 if sign == ">>" else 1
    if sign == "=":
        return 0.5, weight
    return (1.0 if left == model else 0.0), weight


@dataclass(frozen=True)
class ArenaPrompt(Format):
    """An Arena-Hard prompt; its baseline answer (joined in by uid) is the gold."""

    question: Callable[[Row], str]

    def problem(self, row: Row, ident: str) -> Problem:
        return Problem(ident, self.question(row).strip(), str(row[BASELINE]))


class ArenaConfig(JudgedSuiteConfig):
    """`eval_arena_hard`'s settings."""

    baseline_dataset: str | None = Field(
        default=None,
        description="hub dataset of the baseline answers (uid, answer); unset: the fixture's,"
        " or NousResearch/gpt-4-0314-baseline-arenahard with --env.dataset_name",
    )
    baseline_split: str = Field(default="train", description="the baseline dataset's split")


class ArenaJudged(JudgedSuiteEval[ArenaConfig]):
    """Arena-Hard: the judge compares each answer with a baseline answer, in both orders."""

    env_config_cls = ArenaConfig
    baseline_fixture: ClassVar[str] = "arena_hard/baselines.jsonl"
    baseline_hub: ClassVar[str] = "NousResearch/gpt-4-0314-baseline-arenahard"

    def baselines(self) -> dict[str, str]:
        """Baseline answers by uid: `baseline_dataset`, the hub's with `dataset_name`, or the
        fixture's."""
        s = self.config
        if s.baseline_dataset or (s.dataset_name and not s.data_file):
            rows = load_hub(s.baseline_dataset or self.baseline_hub, s.baseline_split)
        else:
            rows = read_jsonl(data_path("evals", self.baseline_fixture))
        return {str(row["uid"]): str(row["answer"]) for row in rows}

    def load_rows(self) -> list[dict[str, Any]]:
        rows, baselines = super().load_rows(), self.baselines()
        missing = [str(row["uid"]) for row in rows if str(row["uid"]) not in baselines]
        if missing:
            raise ValueError(
                f"{self.name}: no baseline answer for uid {missing[0]!r} ({len(missing)} prompts"
                " without one); name the baselines with --env.baseline_dataset"
            )
        return [{**row, BASELINE: baselines[str(row["uid"])]} for row in rows]

    async def judged(self, problem: Problem, sample: Sample) -> Graded:
        answer = (answer_text(sample.text) or "").strip()
        if not answer:
            return Graded(None, False, {"win_share": 0.0})
        request = "[User prompt]\n{}\n\n[Answer A]\n{}\n\n[Answer B]\n{}"
        forward, swapped = await asyncio.gather(
            self.ask(ARENA_JUDGE, request.format(problem.prompt, answer, problem.gold)),
            self.ask(ARENA_JUDGE, request.format(problem.prompt, problem.gold, answer)),
        )
        points = [arena_points(t, "A") for t in forward] + [arena_points(t, "B") for t in swapped]
        parsed = [p for p in points if p is not None]
        share = sum(p * w for p, w in parsed) / sum(w for _, w in parsed) if parsed else None
        details = {"win_share": share, "judge": [*forward, *swapped]}
        return Graded(answer, share is not None and share > 0.5, details)

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        shares, unparsed = _share(graded, "win_share")
        return {"eval/win_rate": _mean(shares), "eval/judge_unparsed": unparsed}
