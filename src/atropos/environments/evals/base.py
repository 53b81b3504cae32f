"""`EvalEnv`: the shared evaluation environment behind `eval_gsm8k`, `eval_mmlu`, ...

An evaluation env loads a benchmark's problems (the shipped fixture, a hub dataset by name, or a
local JSONL file in the benchmark's own field layout), samples `eval_n` completions of each at
`eval_temperature` (at most `max_eval_workers` requests in flight), grades every completion,
and writes `metrics.json` and `samples.jsonl` into `data_dir_to_save_evals` via `evaluate_log`:

- `eval/pass@k` for each k of `eval_k`: the unbiased estimator (`atropos.rewards.passk`)
  averaged over problems;
- `eval/accuracy`: the mean correctness of all samples (pass@1 when every problem has n);
- `eval/<group>/<value>/accuracy`: the same per subset (MMLU subject, MATH level, ...);
- `eval/answered` (share of samples with an extracted answer), `eval/truncated` (share cut by
  the token limit), `eval/num_problems`, `eval/num_samples`, plus a benchmark's own numbers.

A subclass gives `problem(row, index)` (a row in its field layout to a `Problem`) and
`grade(problem, answer_text)` (one completion, think block removed, to a `Graded`).

These environments only evaluate: the CLI refuses `serve` and `process` with status 2 before
writing anything or asking any server (`evaluation_only`), and the training hooks raise
`EvaluationOnly` for a caller that drives the env itself; either way the message says to run
`atropos env evaluate NAME`, so a test set is never trained on by accident.

>>> summarize([[True, False], [False, False]], [1, 2])
{'eval/accuracy': 0.25, 'eval/pass@1': 0.25, 'eval/pass@2': 0.5}
>>> boxed_contents(r"so \\boxed{\\frac{1}{2}} or \\boxed {3}")
['\\\\frac{1}{2}', '3']
>>> answer_text("<think>maybe 3</think> It is 4."), answer_text("<think>never closed") is None
(' It is 4.', True)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from pydantic import Field, field_validator, model_validator
from typing_extensions import TypeVar

from atropos.environments.common.completions import boxed_contents
from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeFailed
from atropos.envs.types import Item, Message
from atropos.inference.config import APIServerConfig, local_server_config
from atropos.rewards.math import after_think
from atropos.rewards.passk import pass_at_k
from atropos.rewards.text import normalise_think

__all__ = [
    "THINKING_PROMPT",
    "EvalConfig",
    "EvalEnv",
    "EvaluationOnly",
    "Graded",
    "Problem",
    "Sample",
    "answer_text",
    "boxed_contents",
    "sample_records",
    "stable_seed",
    "subset_key",
    "summarize",
]

log = logging.getLogger("atropos.env")

THINKING_PROMPT = (
    "You are a deep thinking AI. You may think for as long as you need, reasoning step by step"
    " and checking your own work, before you answer. Put your thoughts and internal monologue"
    " inside <think> </think> tags, then give your solution or response to the problem."
)


class EvaluationOnly(RuntimeError):
    """An evaluation environment was asked for training data."""


def _int_list(value: Any) -> Any:
    """`1`, `"1,5"`, `"[1, 5]"` or `[1, 5]` as a list (pydantic checks the items)."""
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        return [v for v in re.split(r"[\s,\[\]]+", value) if v]
    return value


class EvalConfig(BaseEnvConfig):
    """Settings shared by the evaluation environments (every field is a `--env.NAME` flag)."""

    dataset_name: str | None = Field(
        default=None, description="hub dataset to evaluate on (unset: the shipped fixture)"
    )
    dataset_config: str | None = Field(
        default=None, description="the hub dataset's configuration (unset: the benchmark's)"
    )
    dataset_split: str | None = Field(
        default=None, description="the hub dataset's split (unset: the benchmark's)"
    )
    data_file: str | None = Field(
        default=None, description="a local JSONL file in the benchmark's layout (beats the hub)"
    )
    max_eval_items: int | None = Field(
        default=None, ge=1, description="evaluate only the first N problems"
    )
    eval_n: int = Field(default=1, ge=1, description="completions sampled per problem")
    eval_k: list[int] = Field(
        default=[1], description="k values for pass@k, each at most eval_n (e.g. 1,5)"
    )
    eval_temperature: float = Field(default=0.6, ge=0, description="sampling temperature")
    eval_max_tokens: int | None = Field(
        default=None, ge=1, description="completion token limit (unset: max_token_length)"
    )
    custom_system_prompt: str | None = Field(
        default=None, description="system prompt used instead of the benchmark's own"
    )

    @field_validator("eval_k", mode="before")
    @classmethod
    def _k_list(cls, value: Any) -> Any:
        return _int_list(value)

    @model_validator(mode="after")
    def _k_within_n(self) -> EvalConfig:
        if not self.eval_k:
            raise ValueError("eval_k needs at least one k")
        bad = [k for k in self.eval_k if not 1 <= k <= self.eval_n]
        if bad:
            raise ValueError(f"every eval_k must be in 1..eval_n={self.eval_n}, got {bad}")
        self.eval_k = sorted(set(self.eval_k))
        return self


@dataclass
class Problem:
    """One benchmark problem: the user's prompt, the gold answer and how to group it."""

    id: str
    prompt: str
    gold: Any
    subsets: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # what grading needs beyond the gold


@dataclass
class Sample:
    """One sampled completion: its text (for a multi-turn benchmark, the last turn's) and why
    it ended ("stop", "length")."""

    text: str
    finish_reason: str


@dataclass
class Graded:
    """One graded completion: the answer read from it (None: none found), and whether it is
    right; `details` go into its line of samples.jsonl."""

    extracted: str | None
    correct: bool
    details: dict[str, Any] = field(default_factory=dict)


def answer_text(completion: str) -> str | None:
    """The part of a completion that holds its answer: the text after the last `</think>`
    (think tags in any case); None when a `<think>` is never closed (no answer given)."""
    text = normalise_think(completion)
    if "<think>" in text and "</think>" not in text:
        return None
    return after_think(text)


def stable_seed(*parts: object) -> int:
    """A seed from `parts` that is the same in every process (unlike `hash`).

    >>> stable_seed("gpqa", "rec1") == stable_seed("gpqa", "rec1") != stable_seed("gpqa", "rec2")
    True
    """
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def subset_key(value: object) -> str:
    """A subset's value as a metric-name part: lower case, runs of other characters as `_`.

    >>> subset_key("Counting & Probability"), subset_key(3)
    ('counting_probability', '3')
    """
    return re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_") or "none"


def summarize(correct: Sequence[Sequence[bool]], ks: Iterable[int]) -> dict[str, float]:
    """`eval/accuracy` (mean over all samples) and `eval/pass@k` (the unbiased estimator,
    averaged over problems) of per-problem correctness lists."""
    flat = [ok for row in correct for ok in row]
    metrics = {"eval/accuracy": sum(flat) / len(flat) if flat else 0.0}
    for k in ks:
        values = [pass_at_k(len(row), sum(row), k) for row in correct]
        metrics[f"eval/pass@{k}"] = sum(values) / len(values) if values else 0.0
    return metrics


EvalConfigT = TypeVar("EvalConfigT", bound=EvalConfig, default=EvalConfig)


class EvalEnv(BaseEnv[EvalConfigT]):
    """An evaluation-only environment: sample, grade, log pass@k. Subclasses give the data
    (`fixture`, `hub_*`, `problem`) and the grading (`grade`); one with settings of its own is
    generic over its config (`class MMLUEval(EvalEnv[MMLUConfig])`)."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = EvalConfig  # the generic default's
    evaluation_only: ClassVar[bool] = True  # `serve`/`process` refused by the CLI, status 2
    benchmark: ClassVar[str] = ""  # the task name in metrics.json
    fixture: ClassVar[str] = ""  # file under atropos/environments/data/evals/
    hub_dataset: ClassVar[str] = ""  # the real dataset (documentation, errors)
    hub_config: ClassVar[str | None] = None
    hub_split: ClassVar[str] = "test"
    system_prompt: ClassVar[str | None] = None

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        """Defaults for `atropos env evaluate NAME`: the local server (text-only OpenAI API)."""
        env = cls.env_config_cls(tokenizer_name="tiny", use_wandb=False)
        return env, [local_server_config("openai")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # converts a plain config into `env_config_cls`
        if not isinstance(self.config, EvalConfig):  # a subclass's env_config_cls is not one
            raise TypeError(f"{self.name} needs an EvalConfig, got {type(self.config).__name__}")

    # ----- data ----------------------------------------------------------------------------------

    def load_rows(self) -> list[dict[str, Any]]:
        """The benchmark's rows: `data_file`, else the hub dataset `dataset_name` (its
        `dataset_config` and `dataset_split`, or the benchmark's), else the shipped fixture."""
        s = self.config
        if s.data_file:
            return read_jsonl(s.data_file)
        if s.dataset_name:
            config = s.dataset_config if s.dataset_config is not None else self.hub_config
            return load_hub(s.dataset_name, s.dataset_split or self.hub_split, config)
        return read_jsonl(data_path("evals", self.fixture))

    def keep(self, row: Mapping[str, Any]) -> bool:
        """Whether to evaluate `row` (a filter, e.g. MMLU's subjects). Default: every row."""
        return True

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        """A row of the benchmark's layout as a `Problem`."""
        raise NotImplementedError

    def load_problems(self) -> list[Problem]:
        """The problems to evaluate, in order (the first `max_eval_items` when set)."""
        rows = [(i, row) for i, row in enumerate(self.load_rows()) if self.keep(row)]
        limit = self.config.max_eval_items
        return [self.problem(row, i) for i, row in rows[:limit]]

    # ----- prompting and grading -----------------------------------------------------------------

    def messages(self, problem: Problem) -> list[Message]:
        """The conversation to complete: the thinking prompt (`thinking_mode`, or
        `custom_thinking_prompt`), then `custom_system_prompt` or the benchmark's own, then the
        problem as the user's turn."""
        s = self.config
        parts = [s.custom_thinking_prompt or THINKING_PROMPT] if s.thinking_mode else []
        own = s.custom_system_prompt if s.custom_system_prompt is not None else self.system_prompt
        parts += [own] if own else []
        system: list[Message] = [{"role": "system", "content": "\n\n".join(parts)}] if parts else []
        return [*system, {"role": "user", "content": problem.prompt}]

    def grade(self, problem: Problem, answer: str) -> Graded:
        """Grade one completion's answer part (think block already removed)."""
        raise NotImplementedError

    def grade_completion(self, problem: Problem, completion: str) -> Graded:
        """Grade a whole completion: an unclosed `<think>` has given no answer."""
        answer = answer_text(completion)
        if answer is None:
            return Graded(None, False, {"unclosed_think": True})
        return self.grade(problem, answer)

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        """A benchmark's own numbers (IFEval's strict/loose accuracies). Default: none."""
        return {}

    # ----- BaseEnv hooks -------------------------------------------------------------------------

    def _problems(self) -> list[Problem]:
        found = self.load_problems()
        if not found:
            raise ValueError(f"{self.name}: no problems to evaluate (check the dataset flags)")
        return found

    async def setup(self) -> None:
        self.problems = self._problems()

    def _refuse(self) -> EvaluationOnly:
        return EvaluationOnly(
            f"{self.name} is an evaluation-only environment; use `atropos env evaluate {self.name}`"
        )

    async def get_next_item(self) -> Item:
        raise self._refuse()

    async def collect_trajectories(self, item: Item) -> Any:
        raise self._refuse()

    async def sample(self, problem: Problem) -> list[Sample]:
        """The `eval_n` completions of `problem`: one chat request with `n = eval_n`. A
        multi-turn benchmark (MT-Bench) asks for each turn in turn."""
        return await self.complete(self.messages(problem), self.config.eval_n)

    async def complete(self, messages: list[Message], n: int) -> list[Sample]:
        """`n` completions of `messages` at the evaluation's temperature and token limit."""
        s = self.config
        reply = await self.server.chat_completion(
            messages=messages,
            n=n,
            max_tokens=s.eval_max_tokens or s.max_token_length,
            temperature=s.eval_temperature,
            split="eval",
        )
        return [Sample(c.message.content or "", str(c.finish_reason)) for c in reply.choices]

    async def grade_samples(self, problem: Problem, samples: list[Sample]) -> list[Graded]:
        """Grade each of a problem's samples (`grade_completion`); a judged benchmark asks its
        judge here."""
        return [self.grade_completion(problem, sample.text) for sample in samples]

    async def _run(
        self, problem: Problem, gate: asyncio.Semaphore
    ) -> tuple[list[Sample], list[Graded] | JudgeFailed]:
        """A problem's samples and grades; a judge that cannot answer leaves the problem
        ungraded (its `JudgeFailed`), never graded wrong."""
        async with gate:  # at most max_eval_workers problems asking a server at once
            samples = await self.sample(problem)
            try:
                return samples, await self.grade_samples(problem, samples)
            except JudgeFailed as failed:
                return samples, failed

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Sample, grade and log every problem; returns the metrics.

        Not `Env.evaluate`'s loop (an `EvalEnv` is no `Env`): `eval_n` completions per problem
        give pass@k, and the metrics break down by subset."""
        s = self.config
        problems = getattr(self, "problems", None) or self._problems()
        start = time.time()
        gate = asyncio.Semaphore(s.max_eval_workers)
        runs = await asyncio.gather(*(self._run(p, gate) for p in problems))
        failed = [row for _, row in runs if isinstance(row, JudgeFailed)]
        if failed and len(failed) == len(runs):
            raise failed[-1]  # no problem could be graded: the judge is down, say so once
        kept = [
            (p, run)
            for p, run in zip(problems, runs, strict=True)
            if not isinstance(run[1], JudgeFailed)
        ]
        problems = [p for p, _ in kept]
        replies = [samples for _, (samples, _) in kept]
        graded = [cast(list[Graded], row) for _, (_, row) in kept]
        metrics = self.eval_metrics(problems, replies, graded)
        if failed:  # counted where they happened, so the exact metrics of a clean run stay
            metrics["eval/num_failed"] = len(failed)
        for reason in sorted({f.reason for f in failed}):
            metrics[f"eval/failed/judge_{reason}"] = sum(f.reason == reason for f in failed)
        params = {
            "temperature": s.eval_temperature,
            "max_new_tokens": s.eval_max_tokens or s.max_token_length,
            "n": s.eval_n,
            "k": list(s.eval_k),
            "thinking_mode": s.thinking_mode,
            "dataset": s.data_file or s.dataset_name or f"fixture:{self.fixture}",
        }
        records = sample_records(problems, replies, graded)
        self.evaluate_log(metrics, self.benchmark, None, start, time.time(), params, records)
        return metrics

    def eval_metrics(
        self, problems: list[Problem], replies: list[list[Sample]], graded: list[list[Graded]]
    ) -> dict[str, Any]:
        """pass@k and accuracy, per subset too, the answered and truncated shares, the counts,
        and the benchmark's own numbers (`extra_metrics`)."""
        correct = [[g.correct for g in row] for row in graded]
        metrics: dict[str, Any] = summarize(correct, self.config.eval_k)
        groups: dict[tuple[str, str], list[bool]] = {}
        for problem, row in zip(problems, correct, strict=True):
            for group, value in problem.subsets.items():
                groups.setdefault((group, subset_key(value)), []).extend(row)
        for (group, value), oks in sorted(groups.items()):
            metrics[f"eval/{group}/{value}/accuracy"] = sum(oks) / len(oks)
        everything = [g for row in graded for g in row]
        finishes = [sample.finish_reason for reply in replies for sample in reply]
        metrics.update(
            {
                "eval/answered": sum(g.extracted is not None for g in everything) / len(everything),
                "eval/truncated": finishes.count("length") / len(finishes),
                "eval/num_problems": len(problems),
                "eval/num_samples": len(everything),
                **self.extra_metrics(problems, graded),
            }
        )
        return metrics


def sample_records(
    problems: list[Problem], replies: list[list[Sample]], graded: list[list[Graded]]
) -> list[dict[str, Any]]:
    """The lines of samples.jsonl: one per completion, with its problem's subsets and gold."""
    return [
        {
            "id": problem.id,
            "sample": j,
            **problem.subsets,
            "prompt": problem.prompt,
            "gold": problem.gold,
            "completion": sample.text,
            "finish_reason": sample.finish_reason,
            "extracted": g.extracted,
            "correct": g.correct,
            **g.details,
        }
        for problem, reply, row in zip(problems, replies, graded, strict=True)
        for j, (sample, g) in enumerate(zip(reply, row, strict=True))
    ]
