"""What recording a latency costs (`atropos.inference.latency`), in process CPU time.

Per sample: `Latency.record` (one stage's histogram), `note` (the bound stages looked up through
the context variable, then `record`), and `note_call` (what `ServerManager._call` adds per
answered call: two stages) against an empty loop, each over 1,000,000 lognormal durations. Then
what one rollout adds in a serving env: `record("rollout")`, `note("scoring")` and one
`note_call` per inference call (one here: a single-turn group asks for its G completions in one
call), with one status poll's `summaries()` per 1,000 rollouts.

    nice -n 10 .venv/bin/python benchmarks/latency_recording.py
"""

from __future__ import annotations

import os
import random
import time

from atropos.inference.latency import Latencies, Latency, note, note_call

N = 1_000_000


def per_sample(fn, values: list[float]) -> float:
    """Microseconds of process CPU per call of `fn(v)`, less the bare loop's."""
    start = time.process_time()
    for v in values:
        fn(v)
    spent = time.process_time() - start
    start = time.process_time()
    for _ in values:
        pass
    bare = time.process_time() - start
    return (spent - bare) / len(values) * 1e6


def main() -> None:
    rng = random.Random(0)
    values = [rng.lognormvariate(-3.0, 1.5) for _ in range(N)]
    lat = Latency()
    stages = Latencies()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {N:,} samples each")
    print(f"Latency.record          {per_sample(lat.record, values):.3f} us")
    with stages.bind():
        print(f"note (bound)            {per_sample(lambda v: note('scoring', v), values):.3f} us")
        two = per_sample(lambda v: note_call("train", v, v), values)
        print(f"note_call (two stages)  {two:.3f} us")
    print(f"note (none bound)       {per_sample(lambda v: note('scoring', v), values):.3f} us")

    def rollout(v: float) -> None:
        stages.record("rollout", v)
        note("scoring", v)
        note_call("train", v, v)

    with stages.bind():
        per = per_sample(rollout, values[:200_000])
    start = time.process_time()
    for _ in range(1000):
        stages.summaries()
    poll = (time.process_time() - start) / 1000 * 1e6
    print(f"per rollout (4 stages)  {per:.3f} us; one status poll's summaries {poll:.0f} us")


if __name__ == "__main__":
    main()
