"""The cyclic garbage collector paused while a run builds its trace.

A symbolic run at thousands of GPUs makes millions of small records (events, members, tensors), none of them in
a reference cycle. While they are made, Python's cyclic collector walks the whole growing heap again and again:
at 2,048 GPUs that was two thirds of unfolding the trace (engine/symbolic/fold.py). Paused only for that work and
switched back on after, as it was: reference counting still frees everything that is dropped meanwhile.

Everything made while paused sits in the youngest generation, so the collections that follow would each walk it
again on its way to the oldest (three passes over 30 million objects at 16,384 GPUs). After a large pause one full
collection moves it there at once; after a small one (the suite's many small runs) nothing extra is done.

`CollectorHold` pauses it the same way across work that is not one block of code: the app's what-if runs a step
and builds its view, then paints the comparison, and only then lets that full collection run (at 2,048 GPUs it
walks both runs' traces, about half a second the learner would otherwise wait for).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


# objects made while paused past which one full collection follows: DeepSeek-V3's 2,048-GPU step, its layers
# repeated (train/repeat.py), makes about 230,000; left to the automatic collections, they were walked again by
# whatever ran next (the clock), and the run's cost was counted there
LARGE = 100_000


@contextmanager
def collector_paused() -> Iterator[None]:
    hold = CollectorHold()
    try:
        yield
    finally:
        hold.release()


class CollectorHold:
    """The cyclic collector paused from now until `release` (called once; a second call does nothing)."""

    def __init__(self) -> None:
        self.was_on = gc.isenabled()
        gc.disable()

    def release(self) -> None:
        if self.was_on:  # a pause inside another leaves the switch, and the collection, to the outer one
            self.was_on = False
            gc.enable()
            if gc.get_count()[0] > LARGE:
                gc.collect()
