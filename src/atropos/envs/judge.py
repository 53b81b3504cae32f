"""An AI judge for RLAIF-style environments: its own server (`--judge.*`) or the policy's.

Environments that score by asking a model (rlaif, npc_arena) declare a `judge: JudgeConfig`
field on their config; it is configured under its own namespace (`--judge.base_url URL`,
`judge:` in a `--config` file, `ATROPOS_JUDGE__BASE_URL`). With no `base_url` the judge is the
policy's own servers, as upstream's environments did. Such an environment also has
`JudgedEnv` among its bases, for its `judge` property. A failure of the judge's own server that
will repeat for every call (a model it does not serve, a refused key, a judge server never
reached, or all of them unreachable for `--server_wait` seconds in a row) is a `JudgeError`
naming the `--judge.*` flags, and the runners stop the run with it, as with the policy's servers.

Every environment and eval suite asks its judge through `Judge.complete`, the one judge client,
which keeps to the provider's budget (`atropos.envs.budget`, one per base URL): at most
`--judge.max_concurrency` calls in flight, `--judge.rpm` requests and `--judge.tpm` tokens per
minute (estimated before the call from the prompt and `max_tokens`, corrected from the answer's
usage), a pause for every call when the provider answers 429 with `Retry-After`, and a circuit
breaker (`--judge.breaker_threshold` consecutive failures refuse calls for
`--judge.breaker_cooldown` seconds, then one probe). One call has one deadline,
`--judge.timeout`, over its waits, attempts and backoffs; only a connection error, a 5xx, a 429
(or 408) is retried, `--judge.retries` times, with jittered exponential backoff. A judge that
cannot answer raises `JudgeFailed`, and the rollout (the group it scores) fails with the reason,
counted as `train/failed/judge_<reason>` by the runners: timeout, breaker_open,
retries_exhausted, rejected (another 4xx), malformed. It is never scored, as a 0 or otherwise.

Verdicts come in two shapes:

- pairwise (`compare`): the judge sees both answers twice, in both orders, `votes` times each,
  and answers `\\boxed{A}` or `\\boxed{B}`; votes are mapped back to the original order, so a
  judge that always prefers the first answer scores the pair even. Scores are centred shares of
  the parsed votes, each in [-0.5, 0.5] (upstream's rlaif rule when every vote parses).
- absolute (`rate`): per-criterion scores on a scale (`consistency: 7`), averaged over votes.

Answers that cannot be parsed are counted (`unparsed`) and never turned into scores; a verdict
with no parsed vote has no scores at all, and the caller drops the group.

>>> boxed_choice("I prefer the first. \\\\boxed{A}"), boxed_choice("\\\\boxed{ b }")
('A', 'B')
>>> boxed_choice("A is better") is None, boxed_choice("\\\\boxed{C}") is None
(True, True)
>>> PairVerdict(a=6, b=0).scores, PairVerdict(a=3, b=1).scores
((0.5, -0.5), (0.25, -0.25))
>>> parse_rubric("Consistency: 8/10\\nlore accuracy = 6\\nEngagingness: 9", ["consistency",
...     "lore_accuracy", "engagingness"])
{'consistency': 8.0, 'lore_accuracy': 6.0, 'engagingness': 9.0}
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import Field, SecretStr

from atropos.envs.base import BaseEnv
from atropos.envs.budget import (
    Attempt,
    Budget,
    BudgetRefused,
    Provider,
    estimate_tokens,
    provider_for,
)
from atropos.envs.config import Namespace
from atropos.envs.types import Message
from atropos.inference.base import gather_or_cancel, within
from atropos.inference.config import APIServerConfig, ServerType
from atropos.inference.errors import FatalError, InferenceError
from atropos.inference.retry import RetryPolicy

if TYPE_CHECKING:
    from atropos.inference.manager import ServerManager

__all__ = [
    "Judge",
    "JudgeConfig",
    "JUDGE_FAILURES",
    "JudgeError",
    "JudgeFailed",
    "JudgedEnv",
    "PairVerdict",
    "RubricVerdict",
    "boxed_choice",
    "compare",
    "parse_rubric",
    "rate",
]


class JudgeConfig(Namespace):
    """`--judge.*`: the judge model and its budget. No `base_url`: the policy's servers judge."""

    base_url: str = Field(
        "", description="judge server, e.g. http://127.0.0.1:9010/v1 ('': policy's)"
    )
    model_name: str = Field("default", description="judge model name")
    api_key: SecretStr = Field(SecretStr(""), description="bearer key for the judge server")
    server_type: ServerType = Field("openai", description="openai | vllm | sglang | trl")
    timeout: float = Field(
        600, gt=0, description="seconds one judge call may take in all (budget waits, retries)"
    )
    votes: int = Field(3, ge=1, description="judge answers per order (pairwise) or per rating")
    temperature: float = Field(1.0, ge=0, description="judge sampling temperature")
    max_tokens: int = Field(2048, ge=1, description="longest judge answer, in tokens")
    max_concurrency: int = Field(64, ge=0, description="judge calls in flight (0: no limit)")
    rpm: float = Field(0, ge=0, description="judge requests per minute (0: no limit)")
    tpm: float = Field(
        0, ge=0, description="judge tokens per minute, prompt + max_tokens (0: no limit)"
    )
    retries: int = Field(
        3, ge=0, description="retries of a call after a connection error, 5xx or 429"
    )
    breaker_threshold: int = Field(
        5, ge=0, description="consecutive judge failures that open its breaker (0: never)"
    )
    breaker_cooldown: float = Field(
        30, gt=0, description="seconds the open breaker refuses calls before one probe"
    )

    def server(self) -> APIServerConfig:
        """The judge's own server configuration (only meaningful when `base_url` is set)."""
        return APIServerConfig.model_validate(
            {
                "base_url": self.base_url,
                "model_name": self.model_name,
                "api_key": self.api_key,
                "server_type": self.server_type,
                "timeout": self.timeout,
                "num_max_requests_at_once": max(self.max_concurrency, 512),
            }
        )

    def budget(self) -> Budget:
        """The provider's limits."""
        return Budget(
            self.max_concurrency, self.rpm, self.tpm, self.breaker_threshold, self.breaker_cooldown
        )


class JudgeError(FatalError):
    """A failure of the judge's own server that will repeat for every call (the runners stop
    the run)."""


JUDGE_FAILURES = ("timeout", "breaker_open", "retries_exhausted", "rejected", "malformed")
"""Why a judge call gave no answer; the rollout is failed, counted as `judge_<reason>`."""


class JudgeFailed(Exception):
    """The judge could not answer this call: the rollout fails (never scored), counted by the
    runners as `failed/judge_<reason>` (`train/failed/judge_<reason>`).

    `reason` is one of `JUDGE_FAILURES`: `timeout` (the `--judge.timeout` deadline passed, or
    would pass before the budget let the call go), `breaker_open`, `retries_exhausted`,
    `rejected` (a 4xx other than 408/429: the request is wrong) or `malformed` (an answer that
    cannot be read)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.failure_kind = f"judge_{reason}"


BACKOFF = RetryPolicy(max_attempts=1, backoff=1.0, backoff_max=30.0)
"""Waits between a judge call's attempts: full jitter, 1 s ceiling doubling to 30 s; a longer
`Retry-After` is honoured whole (within the call's deadline)."""


class Judge:
    """Asks the judge model, within the provider's budget; owns a server manager when the
    judge has its own server.

    Every call goes through the `Provider` of `base_url` (`atropos.envs.budget`): concurrency,
    requests and tokens per minute, 429 pauses and the circuit breaker, under one deadline
    (`--judge.timeout`). A retryable failure (connection, timeout of one attempt, 5xx, 429) is
    retried up to `--judge.retries` times with jittered exponential backoff; on the policy's
    own servers the manager's retries apply instead (`--max_attempts`), not these.

    Args:
        config: the `--judge.*` settings.
        env: the environment, whose servers judge when `config.base_url` is empty.
    """

    def __init__(self, config: JudgeConfig, env: BaseEnv) -> None:
        self.config = config
        self._env = env
        self._own: ServerManager | None = None
        env.on_close(self.aclose)  # the runners close it with the env

    @property
    def separate(self) -> bool:
        """Whether the judge runs on its own server rather than the policy's."""
        return bool(self.config.base_url)

    @property
    def provider(self) -> Provider:
        """This event loop's budget of the judge's provider (shared by every judge of it)."""
        return provider_for(self.config.base_url or "policy", self.config.budget())

    def _manager(self) -> ServerManager:
        if not self.separate:
            return self._env.server
        if self._own is None:
            from atropos.inference.manager import ServerManager

            manager = self._env.manager_config.model_copy(
                update={"max_attempts": 1, "deadline": self.config.timeout}
            )  # one attempt per call: the judge retries within its own budget
            self._own = ServerManager([self.config.server()], manager, role="judge")
        return self._own

    async def complete(self, messages: list[Message], n: int) -> list[str]:
        """`n` judge answers to `messages` (their text; an empty answer is "").

        Raises:
            JudgeFailed: no answer within the budget, the deadline and the retries (the
                rollout fails with its reason).
            JudgeError: a failure of the judge's own server that will repeat for every call
                (a model it does not serve, a refused key, a judge server never reached or
                unreachable for `--server_wait` seconds): the runners stop the run with it.
            InferenceError: a fatal error of the policy's servers, as it is.
        """
        c = self.config
        loop = asyncio.get_running_loop()
        deadline = loop.time() + c.timeout
        provider = self.provider
        tokens = estimate_tokens(messages, c.max_tokens * n)
        attempts = 1 + (c.retries if self.separate else 0)
        who = f"judge {provider.name}"
        for attempt in range(1, attempts + 1):
            try:
                async with provider.attempt(tokens, deadline) as sent:
                    try:
                        reply = await within(deadline, self._ask(messages, n))
                    except asyncio.TimeoutError as err:  # the deadline; InferenceTimeout too
                        sent.failed(loop.time())
                        raise JudgeFailed(
                            "timeout", f"{who}: no answer in {c.timeout:g} s"
                        ) from err
                    except InferenceError as err:
                        error = self._settle(err, sent, loop.time())
                    else:
                        usage = getattr(reply, "usage", None)
                        sent.ok(getattr(usage, "total_tokens", None))
                        return [choice.message.content or "" for choice in reply.choices]
            except BudgetRefused as refused:
                reason = "timeout" if refused.reason == "deadline" else refused.reason
                raise JudgeFailed(reason, str(refused)) from None
            if attempt == attempts:
                raise JudgeFailed(
                    "retries_exhausted", f"{who}: {attempts} attempts, the last: {error}"
                ) from error
            wait = max(BACKOFF.delay(attempt), error.retry_after or 0.0)
            if loop.time() + wait >= deadline:
                raise JudgeFailed(
                    "timeout", f"{who}: no answer in {c.timeout:g} s (the last: {error})"
                ) from error
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _ask(self, messages: list[Message], n: int) -> Any:
        return await self._manager().chat_completion(
            messages=messages,
            n=n,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )

    def _settle(self, err: InferenceError, sent: Attempt, now: float) -> InferenceError:
        """Tell the budget how the attempt went; return `err` when it may be retried, else
        raise what the caller sees."""
        if err.fatal:
            sent.failed(now)
            if self.separate:  # name the judge's flags, not the policy's
                raise JudgeError(f"judge: {err}".replace("--openai.", "--judge.")) from err
            raise err
        if err.kind == "http_429":
            sent.limited(err.retry_after, now)
            return err
        if err.kind == "timeout":
            sent.failed(now)
            raise JudgeFailed("timeout", f"judge: {err}") from err
        if err.retryable:  # connection, 5xx, no server available
            sent.failed(now)
            return err
        if err.kind == "http_4xx":
            raise JudgeFailed("rejected", f"judge: {err}") from err
        sent.failed(now)  # an answer that cannot be read, or a call the server cannot take
        raise JudgeFailed("malformed", f"judge: {err}") from err

    async def aclose(self) -> None:
        """Close the judge's own server manager (the policy's is the env's to close)."""
        if self._own is not None:
            await self._own.aclose()
            self._own = None


class _JudgedConfig(Protocol):
    judge: JudgeConfig


class JudgedEnv(BaseEnv):
    """An environment scored by a judge: its config has a `judge: JudgeConfig` field
    (`class RLAIF(JudgedEnv, Env)`)."""

    @property
    def judge(self) -> Judge:
        """The judge (`--judge.*`; the policy's servers without a `base_url`), made on first
        use; its own server manager, if any, closes with the env (`aclose`)."""
        judge: Judge | None = self.__dict__.get("_judge")
        if judge is None:
            config = cast(_JudgedConfig, self.config).judge
            judge = self.__dict__["_judge"] = Judge(config, self)
        return judge


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed_choice(text: str, choices: Sequence[str] = ("A", "B")) -> str | None:
    """The choice in the last `\\boxed{...}` of `text` (case-insensitive), else None."""
    found = _BOXED.findall(text)
    if not found:
        return None
    answer = found[-1].strip().strip("*\"'` ").removeprefix("\\text{").upper()
    for choice in choices:
        if answer == choice.upper():
            return choice
    return None


@dataclass
class PairVerdict:
    """Votes for answer `a` and answer `b`, in the original order, and unparsed answers."""

    a: int = 0
    b: int = 0
    unparsed: int = 0
    answers: list[str] = field(default_factory=list)  # forward answers, then swapped ones

    @property
    def parsed(self) -> int:
        """Votes that named an answer."""
        return self.a + self.b

    @property
    def scores(self) -> tuple[float, float] | None:
        """Centred vote shares (each in [-0.5, 0.5], summing to 0), None with no parsed vote."""
        if not self.parsed:
            return None
        share_a = self.a / self.parsed
        share_b = self.b / self.parsed
        mean = (share_a + share_b) / 2
        return share_a - mean, share_b - mean


async def compare(
    judge: Judge,
    render: Callable[[str, str], list[Message]],
    a: str,
    b: str,
    votes: int | None = None,
    parse: Callable[[str], str | None] = boxed_choice,
) -> PairVerdict:
    """Judge `a` against `b` in both orders, `votes` answers each (default: the config's).

    Args:
        judge: who answers.
        render: `(first, second) -> messages` asking the judge to answer `\\boxed{A}` (first)
            or `\\boxed{B}` (second).
        a: the first answer, b: the second.
        votes: answers per order.
        parse: an answer's verdict, "A", "B" or None (unparsed).
    """
    n = votes or judge.config.votes
    forward, swapped = await gather_or_cancel(  # one order failing cancels the other
        [judge.complete(render(a, b), n), judge.complete(render(b, a), n)]
    )
    verdict = PairVerdict(answers=[*forward, *swapped])
    for text, flipped in [(t, False) for t in forward] + [(t, True) for t in swapped]:
        choice = parse(text)
        if choice is None:
            verdict.unparsed += 1
        elif (choice == "A") != flipped:
            verdict.a += 1
        else:
            verdict.b += 1
    return verdict


def _pattern(name: str) -> re.Pattern[str]:
    words = r"[\s_-]*".join(re.escape(w) for w in re.split(r"[\s_-]+", name.strip()))
    number = r"(-?\d+(?:\.\d+)?)"
    return re.compile(rf"(?im)^[\s*#>-]*{words}[\s*]*[:=][\s*]*{number}")


def parse_rubric(
    text: str, criteria: Sequence[str], low: float = 1, high: float = 10
) -> dict[str, float] | None:
    """Per-criterion scores written as `Name: 7` (or `7/10`, `name = 7`) on their own lines;
    the last line per criterion counts. None when a criterion is missing or off the scale."""
    scores: dict[str, float] = {}
    for name in criteria:
        found = _pattern(name).findall(text)
        if not found:
            return None
        value = float(found[-1])
        if not low <= value <= high:
            return None
        scores[name] = value
    return scores


@dataclass
class RubricVerdict:
    """Mean score per criterion over the parsed answers (None with none), and the counts."""

    means: dict[str, float] | None
    parsed: int
    unparsed: int
    answers: list[str] = field(default_factory=list)


async def rate(
    judge: Judge,
    messages: list[Message],
    criteria: Sequence[str],
    votes: int | None = None,
    low: float = 1,
    high: float = 10,
) -> RubricVerdict:
    """Ask for an absolute score per criterion `votes` times and average the parsed answers."""
    answers = await judge.complete(messages, votes or judge.config.votes)
    parsed = [s for s in (parse_rubric(t, criteria, low, high) for t in answers) if s is not None]
    means: dict[str, Any] | None = None
    if parsed:
        means = {c: sum(p[c] for p in parsed) / len(parsed) for c in criteria}
    return RubricVerdict(means, len(parsed), len(answers) - len(parsed), answers)
