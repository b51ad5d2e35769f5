"""The clock: a run's events in seconds on a GPU type (costs.py: how long each event takes; timeline.py:
streams, overlap and the critical path). The logical step order stays the trace's identity; times are a
layer on it."""

from .costs import COSTS, Machine, event_seconds, machine
from .overlaps import OVERLAPS
from .timeline import Span, Timeline, simulate

__all__ = ["COSTS", "Machine", "OVERLAPS", "Span", "Timeline", "event_seconds", "machine", "simulate"]
