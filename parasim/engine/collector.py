"""The cyclic garbage collector paused while a run builds its trace.

A symbolic run at thousands of GPUs makes millions of small records (events, members, tensors), none of them in
a reference cycle. While they are made, Python's cyclic collector walks the whole growing heap again and again:
at 2,048 GPUs that was two thirds of unfolding the trace (engine/symbolic/fold.py). Paused only for that work and
switched back on after, as it was: reference counting still frees everything that is dropped meanwhile.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
