"""Data-parallel techniques: how copies of a model that saw different data agree on one update: plain DP,
ZeRO-1 and ZeRO-2 with gradient buckets (sharded.py), ZeRO-1 over the groups placements name (zero.py),
ZeRO-3 (zero3.py: weights sharded at rest, gathered one layer at a time), clipping by one norm over both
gradient groups (clip.py), sharded checkpoints that resume on another layout (checkpoint*.py), and the
bytes each buffer costs a rank, told to the trace (held.py). They work on any layer that follows the layer
protocol: ShardedAdam and Zero3 over the data-parallel group they are given, zero1_step over the groups
each weight's placement names (dp-cp for dense weights, expert-dp for experts)."""

from .sharded import ShardedAdam
from .zero import Zero1Adam, adam, sum_partials, zero1_step
from .zero3 import Zero3

__all__ = ["ShardedAdam", "Zero1Adam", "Zero3", "adam", "sum_partials", "zero1_step"]
