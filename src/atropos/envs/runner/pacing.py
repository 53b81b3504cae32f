"""Staleness pacing: start a rollout only while no rollout in flight can be trained too stale.

With `atropos api serve --max-staleness N` the API drops, at batch time, a group whose policy
version is more than N behind the step (`Hub._drop_stale`): the discard rule. Discarding falls
hardest on long rollouts: short ones started later finish first, fill the queue, the trainer
steps past, and the long one arrives too old, so the hard tasks are the ones never trained.
Pacing keeps them: the API's `/status-env` answer carries `max_staleness`, `batch_size` and
`waiting_sequences` (with `--max-staleness` only), and the runner admits a new rollout only
while every rollout in flight stays within N.

The bound. The step S counts batches handed out and a batch takes the oldest waiting groups,
so a group with A sequences ahead of it in the queue is batched at step S + floor(A / B) (B the
batch size) at the latest, whatever the trainer's pace: each batch taken raises S by one and
removes B sequences ahead of it. Its staleness is then S + floor(A / B) - v, v its version.
In the worst case the rollout in flight with the oldest version v_min finishes last, behind the
Q sequences waiting now (every env's, plus this env's groups sent since the status was read)
and every other rollout in flight (G sequences each). So n rollouts may be in flight while

    Q + n * G <= (N + v_min - S + 1) * B

(the last sequence of its group is then in batch D = N + v_min - S at the latest); the new
rollout's own version (the version the trainer last published, else the step) counts in v_min.

Choices where the issue is silent:

* A group sent but not yet acknowledged by the API counts as in flight, at its stamped version:
  the sender's requests run side by side, so a group can reach the API after groups finished
  later (`hold` when handed to the sender, `release` when the sender is done with it).
* A rollout's version is the oldest it may carry: the version when it started, lowered to the
  lowest the inference servers reported for its calls so far (with `keep`-mode weight
  transfer a rollout spans versions, each response reports its first, and the group is stamped
  with the oldest). The reports are folded in at every status poll (`refresh`), so the bound is
  exact when a server reports older weights than the trainer published.
* Other environments' rollouts in flight are not known here; they can land ahead. This and
  group sizes that do not pack exactly are what the API's discard rule still catches.
* A rollout that runs long holds admission (pacing never cancels work); `worker_timeout`
  bounds how long.
* Pacing is on whenever the API announces `max_staleness` (`--env.pace_staleness false` turns
  it off, leaving only the discard rule); an API without the flag, or atroposlib's, announces
  nothing and nothing changes.
* "Paced": admission stopped by this rule while rollouts were wanted. The runner logs the
  seconds and the number of such stretches in its metrics (`train/paced_seconds`,
  `train/paced_count`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atropos.inference.base import PolicyVersions


@dataclass(eq=False, slots=True)  # one per rollout
class Flight:
    """One rollout in flight: the version it is counted at and what the servers reported."""

    version: int
    seen: PolicyVersions = field(default_factory=PolicyVersions)


@dataclass(frozen=True)
class PaceInputs:
    """The API's figures a pacing decision rests on (from one `/status-env` answer)."""

    max_staleness: int
    step: int
    batch_size: int
    waiting_sequences: int

    @classmethod
    def of(cls, status: Mapping[str, Any]) -> PaceInputs | None:
        """The figures in `status`, or None when the API announces no staleness limit."""
        names = ("max_staleness", "current_step", "batch_size", "waiting_sequences")
        values = [status.get(name) for name in names]
        numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if len(numbers) != len(names):
            return None
        limit, step, batch_size, queued = numbers
        return cls(limit, step, batch_size, queued)


def max_in_flight(inputs: PaceInputs, oldest: int, queued: int, group_size: int) -> int:
    """How many rollouts (of `group_size` sequences) may be in flight so that the one at
    version `oldest` is batched within `max_staleness` of it, behind `queued` sequences.

    >>> at = PaceInputs(max_staleness=0, step=5, batch_size=8, waiting_sequences=0)
    >>> max_in_flight(at, 5, 0, 4), max_in_flight(at, 5, 4, 4), max_in_flight(at, 4, 0, 4)
    (2, 1, 0)
    >>> max_in_flight(PaceInputs(2, 5, 8, 0), 4, 4, 4)  # two batches of room, one group ahead
    3
    """
    reach = inputs.max_staleness + oldest - inputs.step  # the last batch index allowed
    if reach < 0 or inputs.batch_size <= 0:
        return 0
    return max(0, ((reach + 1) * inputs.batch_size - queued) // max(1, group_size))


def stalled(inputs: PaceInputs, version_now: int) -> str | None:
    """Why no rollout can start even with none in flight (None: one can): the version a new
    rollout would get is already more than `max_staleness` behind the step, so its group
    could never be trained; the trainer must publish newer weights first.

    >>> stalled(PaceInputs(2, 9, 8, 0), 5)[:65]
    'the version a rollout would start at (5) is 4 behind the step (9)'
    >>> stalled(PaceInputs(2, 9, 8, 0), 7) is None
    True
    """
    behind = inputs.step - version_now
    if behind <= inputs.max_staleness:
        return None
    n = inputs.max_staleness
    return (
        f"the version a rollout would start at ({version_now}) is {behind} behind the step"
        f" ({inputs.step}), more than --max-staleness {n}: nothing can start until the trainer"
        f" publishes newer weights (it must sync at least every {max(1, n)} steps)"
    )


class Pacer:
    """The rollouts in flight (and their groups not yet at the API) by version, and how long
    admission was paced."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.flights: set[Flight] = set()
        self.versions: Counter[int] = Counter()  # flights and held groups, by version
        self.paced_seconds = 0.0  # total, since the run started
        self.paced_count = 0  # stretches of pacing, since the run started
        self._paced_since: float | None = None

    def start(self, version: int, seen: PolicyVersions | None = None) -> Flight:
        """A rollout starts, generated by `version` (as far as the API knows); `seen`: what
        its servers report (the rollout's own `PolicyVersions`; a fresh one when None)."""
        flight = Flight(version) if seen is None else Flight(version, seen)
        self.flights.add(flight)
        self.versions[version] += 1
        return flight

    def finish(self, flight: Flight) -> None:
        self.flights.discard(flight)
        self._uncount(flight.version)

    def hold(self, version: int) -> None:
        """A group of `version` is handed to the sender: in flight until `release`."""
        self.versions[version] += 1

    def release(self, version: int) -> None:
        """The sender is done with a group of `version` (acknowledged, spooled or refused)."""
        self._uncount(version)

    def refresh(self) -> None:
        """Count each flight at the oldest version its servers reported, when older."""
        for flight in self.flights:
            lowest = flight.seen.lowest
            if lowest is not None and lowest < flight.version:
                self._uncount(flight.version)
                flight.version = lowest
                self.versions[lowest] += 1

    def oldest(self) -> int | None:
        """The oldest version among the rollouts in flight (None: none in flight)."""
        return min(self.versions) if self.versions else None

    def limit(self, inputs: PaceInputs, version_now: int, queued: int, group_size: int) -> int:
        """How many rollouts may be in flight, a new one starting at `version_now`."""
        oldest = self.oldest()
        oldest = version_now if oldest is None else min(oldest, version_now)
        return max_in_flight(inputs, oldest, queued, group_size)

    def note(self, paced: bool) -> None:
        """Whether admission is held by pacing now (called at every admission decision)."""
        if paced == (self._paced_since is not None):
            return  # no change (the common case: no clock read)
        now = self.clock()
        if paced and self._paced_since is None:
            self._paced_since = now
            self.paced_count += 1
        elif not paced and self._paced_since is not None:
            self.paced_seconds += now - self._paced_since
            self._paced_since = None

    def paced_total(self) -> float:
        """Seconds paced since the run started, the current stretch included."""
        ongoing = 0.0 if self._paced_since is None else self.clock() - self._paced_since
        return self.paced_seconds + ongoing

    def _uncount(self, version: int) -> None:
        self.versions[version] -= 1
        if self.versions[version] <= 0:
            del self.versions[version]
