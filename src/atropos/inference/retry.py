"""Retry policy of the server manager: bounded attempts, jittered exponential backoff.

Only errors marked `retryable` are retried (see `errors.InferenceError`); the policy only says
how often and how long to wait. There is exactly one retry layer (the manager's): backends
never retry on their own, so attempts do not multiply (atroposlib 0.4.0 nested its retries, up
to 9 x 3 HTTP attempts per call, and retried 4xx errors too).

>>> policy = RetryPolicy(max_attempts=3, backoff=0.5, backoff_max=4.0)
>>> 0.0 <= policy.delay(1) <= 0.5 and 0.0 <= policy.delay(10) <= 4.0
True
>>> policy.delay(1, retry_after=2.0)
2.0
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts one call may make and how long to wait between them.

    Args:
        max_attempts: attempts per call, the first included (1 disables retries).
        backoff: the ceiling of the first wait, in seconds; it doubles per attempt.
        backoff_max: the largest ceiling.
    """

    max_attempts: int = 3
    backoff: float = 0.5
    backoff_max: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.backoff < 0 or self.backoff_max < 0:
            raise ValueError(f"backoffs must be >= 0, got {self.backoff}, {self.backoff_max}")

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based).

        "Full jitter": uniform in [0, min(backoff_max, backoff * 2**(attempt-1))], so many
        callers that failed together do not come back together. A server's `Retry-After` is
        honoured (up to `backoff_max`) when it asks for longer.
        """
        ceiling = min(self.backoff_max, self.backoff * 2 ** max(0, attempt - 1))
        wait = (rng or random).uniform(0.0, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max))
        return wait
