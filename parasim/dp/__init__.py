"""Data-parallel techniques: how copies of a model that saw different data agree on one update (plain DP,
ZeRO-1; ZeRO-2/3, clipping over gradient groups and checkpoints are to come). They work on any layer that
follows the layer protocol, over the groups its placements name (dp-cp for dense weights, expert-dp for
experts)."""
from .zero import Zero1Adam

__all__ = ["Zero1Adam"]
