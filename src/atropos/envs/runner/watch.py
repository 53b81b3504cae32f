"""What a runner says about failed and dropped items while it runs, without flooding its log.

`FailureLog.record(err)` counts a failed item by its `failure_reason` (and, given an outcome
counter, its rollouts as `failed/<reason>` under the same name, `atropos.envs.outcome`) and
tells a fatal error (one that will repeat for every item:
`atropos.inference.errors.fatal_reason`) from a per-item one.
A per-item error is logged once per distinct message, with its traceback the first time its
type is seen; the same failure again is only counted (the counts are in the summary, in the
drop line below and in the metrics).

`DropReport.check(...)`, called every second or so from a runner's own timer (never per
rollout), logs one line when most groups are dropped: at once the first time the share of
dropped groups crosses `share` after `min_groups`, then at most one every `every` seconds while
it stays above, e.g. "dropped 97% of groups in the last 30 s (identical_scores 1,204,
too_short 3); sent 12". When nearly all of them go for equal scores, the line ends with what to
do (`drop_hint`): a graded reward, a larger group, or `--env.ensure_scores_are_not_same false`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from atropos.envs.outcome import count_failure, failure_reason
from atropos.inference.errors import fatal_reason

log = logging.getLogger("atropos.env")


class FailureLog:
    """Counts failures into `counts`; logs each distinct one once (see the module docstring)."""

    max_messages = 50  # distinct messages logged per run; later new ones are only counted

    def __init__(
        self,
        counts: Counter[str],
        what: str = "item",
        outcomes: Counter[str] | None = None,
        rollouts: int = 1,
    ) -> None:
        self.counts = counts
        self.what = what
        # with `outcomes`: each failed item's `rollouts` counted as `failed/<reason>`
        self.outcomes = outcomes
        self.rollouts = rollouts
        self.fatal: str | None = None  # the first fatal error's message
        self._types: set[str] = set()
        self._messages: set[str] = set()

    def record(self, err: BaseException, kind: str | None = None) -> bool:
        """Count `err` (under `kind`, default `failure_reason(err)`: the same name as its
        rollouts' `failed/<reason>`, e.g. `judge_timeout`, `inference_http_5xx`); True when it
        is fatal."""
        kind = kind or failure_reason(err)
        self.counts[kind] += 1
        if self.outcomes is not None:
            count_failure(self.outcomes, err, self.rollouts)
        reason = fatal_reason(err)
        if reason is not None:
            if self.fatal is None:
                self.fatal = reason
            return True
        message = f"{kind}: {err}"
        if message in self._messages or len(self._messages) >= self.max_messages:
            return False
        self._messages.add(message)
        if kind not in self._types:
            self._types.add(kind)
            log.error(
                "%s failed: %s (the same failure again is only counted)",
                self.what,
                message,
                exc_info=err,
            )
        else:
            log.error("%s failed: %s", self.what, message)
        if len(self._messages) == self.max_messages:
            log.warning(
                "%d distinct failures logged; new ones are only counted", len(self._messages)
            )
        return False


IDENTICAL_SCORES_HINT = (
    "the groups' scores were all equal, so none can teach: give partial credit (a graded"
    " reward), raise --env.group_size, or set --env.ensure_scores_are_not_same false to keep"
    " such groups and look at the data"
)


def drop_hint(dropped: Counter[str], sent: int, share: float = 0.95) -> str | None:
    """What to do when nearly every group (at least `share`) is dropped, mostly for equal
    scores (pass/fail rewards on a weak policy); None otherwise.

    >>> drop_hint(Counter(identical_scores=40), sent=0) == IDENTICAL_SCORES_HINT
    True
    >>> drop_hint(Counter(identical_scores=40), sent=20) is None
    True
    """
    n = sum(dropped.values())
    if n == 0 or n < share * (n + sent) or 2 * dropped["identical_scores"] < n:
        return None
    return IDENTICAL_SCORES_HINT


def _counts(counter: Counter[str], top: int = 4) -> str:
    return ", ".join(f"{k} {n:,}" for k, n in counter.most_common(top))


class DropReport:
    """Rate-limited "most groups are dropped" lines (see the module docstring)."""

    def __init__(
        self,
        every: float = 30.0,
        share: float = 0.5,
        min_groups: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        self.share = share
        self.min_groups = min_groups
        self.clock = clock
        self.since = clock()
        self.logged_once = False
        self.drops: Counter[str] = Counter()  # the totals at the start of the window
        self.failures: Counter[str] = Counter()
        self.sent = 0

    def check(self, drops: Counter[str], failures: Counter[str], sent: int) -> str | None:
        """Log (and return) the line when it is due; start a new window every `every` s."""
        now = self.clock()
        elapsed = now - self.since
        dropped = drops - self.drops
        n_dropped, n_sent = sum(dropped.values()), sent - self.sent
        mostly = n_dropped + n_sent >= self.min_groups and n_dropped >= self.share * (
            n_dropped + n_sent
        )
        line = None
        if mostly and (not self.logged_once or elapsed >= self.every):
            failed = failures - self.failures
            line = (
                f"dropped {100 * n_dropped / (n_dropped + n_sent):.0f}% of groups in the last"
                f" {elapsed:.0f} s ({_counts(dropped)}); sent {n_sent:,}"
            )
            if failed:
                line += f"; failed {_counts(failed)}"
            hint = drop_hint(dropped, n_sent)
            if hint is not None:
                line += f": {hint}"
            log.warning("%s", line)
            self.logged_once = True
        if line is not None or elapsed >= self.every:
            self.since, self.sent = now, sent
            self.drops, self.failures = Counter(drops), Counter(failures)
        return line
