"""The garbage collector's full collections, run between ticks and never within one.

At 5,000 nodes a full collection walks every object made since the informer froze its cache
and its first views, and cost 18 to 134 ms where measured (docs/design/scale.md, "Full
collections between ticks"). CPython starts one once enough objects have survived into its
oldest generation, and a lend or reclaim wave, which makes requests, answers and records by
the hundred, is where that most often comes: the tick that moves nodes was the one slowed.

While the loop runs in the controller's process (``Controller.run``), the automatic full
collection is held off, and the loop runs one after a tick (``ReconcileLoop``'s ``after``)
once as many middle collections have run since the last as CPython itself waits for before
it considers one (its third threshold, 10 by default). Young and middle collections go on as
before. Every replica runs the loop, a standby too, so every replica collects; the loop runs
at least once a tick interval.

An interpreter whose collector is incremental (CPython 3.14 on) has no long pause to move:
there this does nothing.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Where the oldest generation is collected all at once, in one pause.
GENERATIONAL = sys.version_info < (3, 14)
# A threshold no count of middle collections reaches (the collector keeps it as a C int).
NEVER = 2**31 - 1


class FullCollections:
    """Held off while ``between_ticks`` is entered; ``after_tick`` runs one when due."""

    def __init__(self) -> None:
        self.due_after: int | None = None  # middle collections; None while not held

    @contextmanager
    def between_ticks(self) -> Iterator[None]:
        """The automatic full collection held off for the block, and the thresholds as they
        were once it ends."""
        if not GENERATIONAL:
            yield
            return
        young, middle, oldest = gc.get_threshold()
        gc.set_threshold(young, middle, NEVER)
        self.due_after = oldest
        try:
            yield
        finally:
            self.due_after = None
            gc.set_threshold(young, middle, oldest)

    def after_tick(self) -> bool:
        """The full collection CPython would have considered by now, run here: whether one
        ran. Never outside ``between_ticks``, where CPython runs its own."""
        if self.due_after is None or gc.get_count()[2] < self.due_after:
            return False
        gc.collect()
        return True
