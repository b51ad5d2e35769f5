"""The collective interface of one virtual rank: the public calls (interface.py) check a call, then it
joins the shared VirtualWorld (virtual.py), which matches it with the other members' calls."""

from __future__ import annotations

import numpy as np

from .interface import Comm, call_site
from .virtual import VirtualWorld
from .virtual_p2p import NUMBER_KINDS, check_array


class VirtualComm(Comm):
    """The collective interface of one virtual rank: the backend hooks of `Comm`, on a VirtualWorld."""

    def __init__(self, world: VirtualWorld, rank: int):
        self._w = world
        self.rank = rank
        self.world = world.world
        self.algo = world.algo
        self._sites = world.site_memo

    def _check_array(self, x, op):
        check_array(x, op)

    def _checked(self, x, group, op):
        # every rank's every call: numbers in a numpy array, on the world or a group, checked in one frame (the
        # usual array in one test; bfloat16's kind is not a number's, so it, and all else, takes the full check)
        if type(x) is not np.ndarray or x.dtype.kind not in NUMBER_KINDS:
            self._check_array(x, op)
        w = self._w
        return w.world_group if group is None else w.resolve(self.rank, group, op)

    def _group(self, group, op):
        w = self._w
        return w.world_group if group is None else w.resolve(self.rank, group, op)

    def _collective(self, op, x, params, group, label, site, sig=None):
        return self._w.collective(self.rank, op, x, params, group, label, site, sig)

    def exchange(self, ops, *, group=None, label=None, tags=None):
        site = call_site(2, self._sites)
        g = self._w.resolve(self.rank, group, "exchange")
        return self._w.exchange(self.rank, list(ops), g, label, site, tags)

    def new_group(self, ranks, name):
        return self._w.new_group(self.rank, ranks, name, self._w.site_names(call_site(2, self._sites)))

    def new_groups(self, groups):
        # one call site for them all: the stack walked once, not per group
        site = self._w.site_names(call_site(2, self._sites))
        return self._w.new_groups(self.rank, groups, site)
