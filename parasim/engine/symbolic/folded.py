"""Virtual ranks folded: only representatives run, each playing the part of the ranks folded onto it.

`rep[r]` is the rank whose program stands for rank r's (engine/symbolic/fold.py chooses them: ranks that differ
only in their place do the same work). A folded rank never runs; in a collective it brings what its
representative brought, and its result is not read. Point-to-point peers must run themselves, and every
folded member of a group must have its representative in the group. The trace holds the events the
representatives took part in; `fold.unfold` then writes the folded ranks' own.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...comm.virtual import VirtualWorld
from ...comm.virtual_p2p import tensor_record
from ...errors import CollectiveError, UsageError
from ...comm.trace import Member

_member = tuple.__new__  # a Member without NamedTuple's Python-level __new__ (hot path)


class FoldedWorld(VirtualWorld):
    """A VirtualWorld of `world` ranks of which only the representatives in `rep` run."""

    def __init__(self, world: int, rep: Sequence[int], **options: Any):
        super().__init__(world, **options)
        rep = list(rep)
        if len(rep) != world or any(not 0 <= s < world or rep[s] != s for s in rep):
            raise UsageError("a fold maps every rank to a rank that runs for itself")
        self.rep = rep
        self._running: dict[int, tuple[int, ...]] = {}  # group index -> its members that run
        self._from: dict[int, list[int]] = {}  # group index -> each member's representative's place in it
        for st in self.ranks:
            if rep[st.rank] != st.rank:
                st.done = True  # it never runs: its representative does its work

    def run(self, program: Any, contexts: list[Any]) -> list[Any]:
        values = super().run(program, contexts)
        return [values[s] for s in self.rep]  # a folded rank's value is its representative's

    def _members_running(self, group: Any) -> tuple[int, ...]:
        """The representatives among `group`'s members; each folded member's representative must be one of
        them, as its part is copied from that representative's."""
        got = self._running.get(group.index)
        if got is None:
            rep = self.rep
            away = [r for r in group.ranks if rep[r] not in group.ranks]
            if away:
                raise CollectiveError(
                    f"folded run: in group {group}, rank {away[0]} is folded onto rank "
                    f"{rep[away[0]]}, which is not in the group; fold ranks onto a member of "
                    "every group they share"
                )
            got = self._running[group.index] = tuple(r for r in group.ranks if rep[r] == r)
        return got

    def _brought(self, inst: Any) -> tuple[list, list]:
        """Each folded member brings what its representative brought."""
        g = inst.group
        got = self._from.get(g.index)
        if got is None:  # where each member's part comes from: its representative's place in the group
            at = {r: i for i, r in enumerate(g.ranks)}
            got = self._from[g.index] = [at[self.rep[r]] for r in g.ranks]
        xs, sites = inst.xs, inst.sites
        return [xs[i] for i in got], [sites[i] for i in got]

    def _peer(self, peer: int, rank: int) -> int:
        """A point-to-point peer must run itself: a folded rank cannot answer."""
        if self.rep[peer] != peer:
            raise CollectiveError(
                f"folded run: rank {rank} exchanges with rank {peer}, which is folded onto rank "
                f"{self.rep[peer]}; fold only ranks whose point-to-point peers run"
            )
        return peer

    def _works(self, ranks: Any) -> list:
        """A folded member did its representative's work: taken once, shared."""
        rep, got = self.rep, {}
        for r in ranks:
            if rep[r] not in got:
                got[rep[r]] = self._work(rep[r])
        return [got[rep[r]] for r in ranks]

    def _members(self, g: Any, xs: list, sites: list, op: Any, params: dict, step: int, current: int) -> tuple:
        if op.name == "all_to_all" and not self.keep and all([x is xs[0] for x in xs]):
            return self._alike(g, xs[0], sites[0], step, current), None
        return super()._members(g, xs, sites, op, params, step, current)

    def _alike(self, g: Any, chunks: list, site: tuple[str, int], step: int, current: int) -> list:
        """An all-to-all in which every member sends the very same chunks: one member runs and every other is
        folded onto it (each running member brings a list of its own), so the member that runs is the one
        completing the call, and every member's call site is its. Member j gets chunk j from everyone, so its
        record is one tensor repeated: the same records as the kernel's path, without t x t copies and
        lookups (4,096 a side over EP 64)."""
        made, t = self._tensors, g.size
        # a folded sender's chunks are a few arrays repeated: a record for each of those
        kinds = {i: tensor_record(c, made) for i, c in {id(c): c for c in chunks}.items()}
        tin = self._chunk_records(tuple([kinds[id(c)] for c in chunks]))  # one tuple a kind, across calls
        outs = {i: (k,) * t for i, k in kinds.items()}
        total = sum([v.nbytes for v in chunks])
        name = self.site_names(site)
        members = []
        work = self._work(current)  # the one rank that ran did the work of every rank folded onto it
        ranks = self.ranks
        for r, c in zip(g.ranks, chunks):
            ranks[r].clock = step
            members.append(
                _member(Member, (r, tin, outs[id(c)], total - c.nbytes, (t - 1) * c.nbytes, name, None, None, work))
            )
        # the member that runs gets chunk j of everyone: its own chunk, t times; a folded rank reads nothing
        mine = chunks[g.ranks.index(current)]
        ranks[current].result = [mine.copy() for _ in range(t)]
        return members  # no member to wake: the one that runs is the one here
