"""`FrozenHeap`: the garbage-collector settings the runners hold for a run."""

from __future__ import annotations

import gc


class FrozenHeap:
    """Keep the garbage collector's work proportional to what rollouts allocate.

    After imports, `setup()` and the first rollouts an env holds a few hundred thousand
    long-lived objects (modules, tokenizer, dataset), and every full collection walks all of
    them: with hundreds of rollouts in flight, full collections came several times a second
    and took over a quarter of the env's CPU. `gc.freeze()` moves everything alive to a
    generation the collector never scans (instantly: no collection first, which would stall the
    loop as long as a full one). It runs on entry and once more at `settle()`, which the
    runners call when the first rollout is done: by then the lazily loaded tokenizer, backends
    and connections exist too. (Rollouts in flight at that moment are frozen as well; their
    objects are still freed by reference counting when they finish.)

    A rollout allocates thousands of small containers (token rows, messages, HTTP objects), so
    the default threshold of 700 allocations triggered a young collection every few rollouts,
    each promoting in-flight objects toward the older generations; the first threshold is
    raised to `young` for the run (about 20 times fewer young collections at 20,000; measured:
    GC time at 256 workers down from about 2 s to 0.1 s per 20 s). With thousands of
    multi-turn rollouts in flight every turn waits seconds for the server, so what a turn
    allocates outlives many young collections and is traversed again in the older generations:
    at 16,384 rollouts in flight GC took 24% of the env's CPU with 20,000 and 12% with 100,000
    (`benchmarks/multiturn_scale.py`), hence 100,000 (a young generation of about 10 MB).

    `__exit__` restores the threshold and unfreezes, so a runner embedded in a longer process
    (a notebook, a test) leaves no trace.
    """

    def __init__(self, young: int = 100_000) -> None:
        self.young = young
        self.settled = False
        self._threshold: tuple[int, int, int] | None = None

    def __enter__(self) -> FrozenHeap:
        self._threshold = gc.get_threshold()
        first, *rest = self._threshold
        if first:  # 0: collection is disabled; leave it so
            gc.set_threshold(max(first, self.young), *rest)
        gc.freeze()
        return self

    def settle(self) -> None:
        """Freeze again, once: what the first rollout loaded is long-lived too."""
        if not self.settled:
            self.settled = True
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self._threshold is not None:
            gc.set_threshold(*self._threshold)
        gc.unfreeze()
