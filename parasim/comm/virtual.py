"""Virtual ranks: N ranks in one process, one greenlet each, scheduled cooperatively and deterministically.

A rank runs until it calls a collective that not every member has reached, then hands over to the next
ready rank (always in the same order, so every run is identical). The last member to arrive checks that
all calls fit together, computes every member's result (the op's kernel in ops.py), records one trace event and wakes
the others. When no rank can run and some have not finished, the run is deadlocked and says who waits on
what. Point-to-point transfers (virtual_p2p.py) complete only when both sides have posted.
"""

from __future__ import annotations

import inspect
from threading import get_ident
from collections import deque
from itertools import chain
from typing import Any, Callable, Sequence, cast

from greenlet import GreenletExit, getcurrent, greenlet

from ..errors import CollectiveError, CollectiveMismatch, Deadlock, ParasimError, RankFailed, TimedOut, UsageError
from ..limits import KEPT_VALUES, RECORD_KINDS
from .trace import Event, Mark, Member, Trace
from .interface import Group, by_text, describe, check_algo, group_members, mismatch_error, ranks_text, site_name
from .sites import SiteMemo, SiteNames, with_call_site
from .kernels import arrays, ring_moved
from .ops import OPS, entry
from .virtual_p2p import Batch, PointToPoint, check_array, tensor_record
from .watchdog import Stopped, TimeLimit, frame_text, raised_text, where

_member = tuple.__new__  # builds a Member without NamedTuple's Python-level __new__ (hot path)


class _Instance:
    """One collective on one group, filling up as members arrive: member i's input `xs[i]` and call site
    `sites[i]` (None: not arrived yet), each in a list of its own, which the completion reads as they are.
    Every member that arrived brought the op and params of the first (`sig`, `params`: a member that does not
    is refused as it arrives). `labels`: each member's label, where any brought one; `needed`: how many
    arrivals complete it."""

    __slots__ = ("group", "call", "op", "params", "sig", "xs", "sites", "labels", "count", "needed")

    def __init__(self, group: Group, call: int, op: str, params: dict, sig: tuple, needed: int):
        self.group, self.call, self.op, self.params, self.sig = group, call, op, params, sig
        self.xs: list[Any] = [None] * group.size
        self.sites: list[tuple[str, int] | None] = [None] * group.size
        self.labels: list[str | None] | None = None
        self.count = 0
        self.needed = needed

    def label(self, i: int, label: str) -> None:
        if self.labels is None:
            self.labels = [None] * self.group.size
        self.labels[i] = label

    def said(self, i: int) -> str:
        """How member i's call is named in errors (`describe`)."""
        return describe(self.op, self.xs[i], **self.params)


class _Rank:
    __slots__ = ("rank", "glet", "done", "value", "clock", "phase", "waiting", "ngroups", "result")

    def __init__(self, rank: int):
        self.rank, self.done, self.value = rank, False, None
        self.glet: greenlet | None = None
        self.clock = 0
        self.phase: str | None = None
        self.waiting: Any = None  # what it waits in: a collective's instance, a transfer, or nothing
        self.ngroups = 0
        self.result: Any = None


class VirtualWorld(PointToPoint):
    """The shared state of one virtual run. Lives only as long as the run; nothing is global.

    `check`: what an array a rank sends must pass (numbers in a numpy array; another kind of array, another
    check). A subclass may run fewer ranks than the world has, each playing others' parts: it names the
    members of a group that run (`_members_running`), what each member brings to a collective (`_brought`),
    the rank that answers a point-to-point peer (`_peer`) and builds the records (`_members`)."""

    def __init__(
        self,
        world: int,
        *,
        keep_values: int = 0,
        algo: str = "direct",
        timeout: float | None = None,
        check: Callable[[Any, str], None] | None = None,
    ):
        if world < 1:
            raise CollectiveError(f"world size must be at least 1, got {world}")
        check_algo(algo)
        self.world = world
        self.keep = keep_values
        self.kept = self.dropped = 0  # numbers kept so far, and calls whose values were not (KEPT_VALUES)
        self.algo = algo
        self.timeout = timeout  # seconds a rank may run without handing over (None: no limit)
        self.world_group = Group(tuple(range(world)), "world", 0)
        self.groups: list[Group] = [self.world_group]
        self.group_sites: list[str] = [""]
        self.ranks = [_Rank(r) for r in range(world)]
        self.ready: deque = deque()
        # a group's collective that some members have reached, by group: a member that arrives waits until every
        # member has, so no group has two at once (p2p transfers wait elsewhere: `sends`, `recvs`)
        self.instances: dict[int, _Instance] = {}
        self.calls: dict[int, int] = {}  # a group's collectives so far (its next one's number), by group
        self.sends: dict[tuple[int, int], deque] = {}
        self.recvs: dict[tuple[int, int], deque] = {}
        self.events: list[Event] = []
        self.marks: list[Mark] = []
        self.failure: tuple[int, BaseException] | None = None
        self.aborted = False
        self.hub: greenlet = getcurrent()  # the greenlet that runs the ranks (`run` makes it the caller's)
        self.turns = 0  # handovers between ranks so far: the time limit watches it move
        self.running = 0  # the rank whose turn it is (what it computes is its own)
        self._thread = 0  # the thread the run is in: greenlets cannot switch from any other
        self._check = check if check is not None else check_array
        self._tensors: dict = {}  # (shape, dtype) -> its trace record, shared
        self.site_memo = SiteMemo()  # every rank's call sites, by code object and instruction (sites.call_site)
        self.site_names = SiteNames()  # 'file:line' of each call site, named once in the run (comm/sites.py)
        self._records: dict[tuple, list[tuple]] = {}  # a kind of call on a group -> its members' records
        # a kind of call on a group -> (its members' raw call sites, their records) when every member computed
        # nothing before it: the records again if the next call of the kind repeats it (`_same_members`)
        self._repeats: dict[tuple, tuple[list, list[Member]]] = {}
        self._chunks: dict[tuple, tuple] = {}  # an all-to-all's chunk records -> the one tuple of them kept
        self.meter: Any = None  # each rank's FLOPs since its last event (engine/work.Meter), set by the backend
        self._asked: dict[int, tuple[list, list]] = {}  # new_groups: first group number -> (what was asked, made)

    # -- scheduling ------------------------------------------------------------------------------
    def run(self, program: Callable[[Any], Any], contexts: list[Any]) -> list[Any]:
        self.hub = getcurrent()
        self._thread = get_ident()
        for r in self._members_running(self.world_group):
            st = self.ranks[r]
            st.glet = greenlet(self._rank_main_for(program, contexts[r], st), parent=self.hub)
            self.ready.append(st.glet)
        try:
            with TimeLimit(self.timeout, self._progress):
                self._schedule()
        except Stopped as exc:  # between two ranks' turns: the engine itself took too long
            raise TimedOut(
                f"the run stopped after {self.timeout:g} s without progress (the time limit, "
                f"--timeout) at {frame_text(exc.at())}",
                None,
            ) from None
        finally:
            self._abort()
        self._check_groups()
        return [st.value for st in self.ranks]

    def _schedule(self) -> None:
        while True:
            if self.failure is not None:
                self._raise_failure()
            if self.ready:
                self.turns += 1
                self.ready.popleft().switch()
            elif all(st.done for st in self.ranks):
                break
            else:
                waiting = self._waiting()
                lines = "\n".join(by_text(waiting))
                raise Deadlock("every unfinished rank is waiting and none can go on:\n" + lines, waiting)

    def _progress(self) -> int:
        return self.turns

    def _rank_main_for(self, program, ctx, st: _Rank):
        def main():
            self.running = st.rank
            try:
                st.value = program(ctx)
                _ran(st.value, st.rank)
            except GreenletExit:
                pass
            except Stopped as exc:  # the time limit: this rank held the run without handing over
                if self.failure is None:
                    self.failure = (st.rank, self._timed_out(st.rank, exc))
            except (Exception, SystemExit) as exc:  # the hub decides what to raise; sys.exit() is an error too
                if self.failure is None:
                    self.failure = (st.rank, exc)
            finally:
                st.done = True
                st.waiting = None

        return main

    def _timed_out(self, rank: int, exc: Stopped) -> TimedOut:
        frame = where(exc.at())
        site = None if frame is None else site_name((frame.f_code.co_filename, frame.f_lineno))
        st = self.ranks[rank]
        waiting = {r: w for r, w in self._waiting().items() if r != rank}
        left = "\n".join(by_text(waiting)) or "  none"
        return TimedOut(
            f"rank {rank} ran for {self.timeout:g} s without reaching a collective or returning (the "
            f"time limit, --timeout): stopped at {frame_text(frame)}"
            f"{f' in phase {st.phase!r}' if st.phase else ''}\nranks left waiting:\n{left}",
            rank,
            site,
            waiting,
        )

    def _wait(self, st: _Rank, on: Any) -> None:
        st.waiting = on
        self.turns += 1
        # Hand over to the next ready rank directly, but let the hub start a rank that has not run yet:
        # a greenlet's stack begins where it is first switched to, and starting ranks from deep inside
        # other ranks would stack them ever deeper (numpy/BLAS calls then overflow the C stack).
        if self.ready and self.ready[0]:
            self.ready.popleft().switch()
        else:
            self.hub.switch()
        self.running = st.rank
        st.waiting = None
        if self.aborted:
            raise GreenletExit()

    def _abort(self) -> None:
        self.aborted = True
        for st in self.ranks:
            if st.glet is not None and st.glet and not st.done:
                st.glet.throw(GreenletExit())
        self.ready.clear()

    def _raise_failure(self) -> None:
        assert self.failure is not None  # called once a rank has failed
        rank, exc = self.failure
        if isinstance(exc, CollectiveError):  # a call that can never work: name the program's line that made it
            raise with_call_site(exc) from None
        if isinstance(exc, ParasimError):
            raise exc
        waiting = self._waiting()
        left = "\n".join(by_text({r: w for r, w in waiting.items() if r != rank})) or "  none"
        raise RankFailed(f"{raised_text(rank, exc)}ranks left waiting:\n{left}", rank, waiting) from exc

    def _waiting(self) -> dict[int, str]:
        """What each rank is doing, rank -> text. Ranks waiting in one collective share one text, built
        once: linear in the world, so a fault among thousands of ranks is reported at once."""
        out: dict[int, str] = {}
        texts: dict[tuple, str] = {}  # by the collective they wait in, their call and their site
        for st in self.ranks:
            w = st.waiting
            if st.done:
                out[st.rank] = "finished"
            elif isinstance(w, _Instance):
                i = w.group.ranks.index(st.rank)  # its own arrival: it waits in it
                site = cast(tuple, w.sites[i])
                key = (id(w), w.said(i), site)  # members may differ in site (and, for all_to_all, in chunks)
                if key not in texts:
                    arrived = [r for r, a in zip(w.group.ranks, w.sites) if a is not None]
                    missing = [r for r, a in zip(w.group.ranks, w.sites) if a is None]
                    texts[key] = (
                        f"waits in {key[1]} on group {w.group} (call #{w.call} on it) at "
                        f"{site_name(site)}; arrived {ranks_text(arrived)}, missing {ranks_text(missing)}"
                    )
                out[st.rank] = texts[key]
            elif isinstance(w, Batch):
                posts = ", ".join(p.describe() for p in w.posts if not p.matched)
                out[st.rank] = f"waits in point-to-point at {site_name(w.site)}: unmatched {posts}"
            else:
                out[st.rank] = "had not reached a collective yet"
        return out

    def _off_thread(self, rank: int, op: str, site: tuple[str, int]) -> None:
        """A collective from a thread the program started: virtual ranks take turns in the run's one thread,
        and no other thread can hand over to them. The run fails, naming the call; the thread ends quietly:
        threading's excepthook prints every exception but SystemExit itself (`exc_type == SystemExit`, so not
        even a subclass of it)."""
        err = UsageError(
            f"rank {rank} called {op} at {site_name(site)} from a thread it started; virtual ranks "
            "run in one thread: make collectives from the program itself, not from its threads"
        )
        if self.failure is None:
            self.failure = (rank, err)
        raise SystemExit(str(err))

    def _check_groups(self) -> None:
        counts = {r: self.ranks[r].ngroups for r in self._members_running(self.world_group)}
        if len(set(counts.values())) > 1:
            most = max(counts.values())
            short = [r for r, n in counts.items() if n < most]
            raise CollectiveMismatch(
                f"ranks {short} created fewer groups than others ({counts}); every rank must call new_group "
                "for every group, in the same order",
                ranks=short,
            )

    # -- groups ----------------------------------------------------------------------------------
    def new_group(self, rank: int, ranks: Sequence[int], name: str, site: str) -> Group:
        st = self.ranks[rank]
        st.ngroups += 1
        idx = st.ngroups
        if idx < len(self.groups):  # made by an earlier rank: plain ints equal to its ranks were checked then
            g = self.groups[idx]
            if (
                type(ranks) in (list, tuple)
                and set(map(type, ranks)) == {int}
                and tuple(ranks) == g.ranks
                and g.name == name
            ):
                return g  # the usual case, quickly (2,048 ranks x 600 groups each on a symbolic run)
        members = group_members(ranks, self.world, name, site)
        if idx < len(self.groups):
            g = self.groups[idx]
            if g.ranks != members or g.name != name:
                raise CollectiveMismatch(
                    f"rank {rank} created group #{idx} as {name}{list(members)} at {site}, but another rank "
                    f"created it as {g} at {self.group_sites[idx]}; every rank must create every group in the "
                    "same order",
                    calls=[site, self.group_sites[idx]],
                )
            return g
        g = Group(members, name, idx)
        self.groups.append(g)
        self.group_sites.append(site)
        return g

    def new_groups(self, rank: int, groups: Sequence[tuple[Sequence[int], str]], site: str) -> list[Group]:
        """`new_group` of each of `groups`, in order. A rank asking for the very groups an earlier rank asked for
        at the same place in its order (every rank of a layout: 157,728 groups a rank at 2,048 GPUs) takes that
        rank's, checked in one comparison; plain ints only, as `new_group`'s quick path takes them."""
        st = self.ranks[rank]
        start = st.ngroups + 1
        asked = [(tuple(ranks), name) for ranks, name in groups]
        made = self._asked.get(start)
        if made is not None and made[0] == asked and _plain_ints(asked):
            st.ngroups += len(asked)
            return list(made[1])
        out = [self.new_group(rank, ranks, name, site) for ranks, name in groups]
        self._asked[start] = (asked, out)
        return out

    def resolve(self, rank: int, group: Group | None, op: str) -> Group:
        if group is None:
            return self.world_group
        idx = group.index
        if not (0 <= idx < len(self.groups)) or self.groups[idx] != group:
            raise CollectiveError(f"{op}: group {group} was not created in this run")
        if idx > self.ranks[rank].ngroups:
            raise CollectiveError(f"{op}: rank {rank} uses group {group} before creating it with new_group")
        if rank not in group.ranks:
            raise CollectiveError(f"{op}: rank {rank} is not a member of group {group}")
        return group

    # -- collectives -----------------------------------------------------------------------------
    def collective(
        self,
        rank: int,
        op: str,
        x: Any,
        params: dict,
        group: Group,
        label: str | None,
        site: tuple[str, int],
        sig: tuple | None = None,
    ) -> Any:
        """`rank`'s checked call (`Comm._collective`: each rank's VirtualComm hands it here)."""
        if self.aborted:
            raise GreenletExit()
        if get_ident() != self._thread:
            self._off_thread(rank, op, site)
        if sig is None:  # `signature` but its params, which are compared as the dict they came in (below): every
            sig = (op, x.shape, x.dtype) if x is not None else (op,)  # rank's every call builds no tuple of them
        gi = group.index
        inst = self.instances.get(gi)
        if inst is None:  # the first member to arrive opens the call: its op must be in the op table
            entry(op)  # (the public methods' names are; `Comm.call`'s, a string, may not be)
            call = self.calls.get(gi, 0)
            self.calls[gi] = call + 1
            inst = self.instances[gi] = _Instance(group, call, op, params, sig, len(self._members_running(group)))
        i = group.ranks.index(rank)
        inst.xs[i] = x
        inst.sites[i] = site
        if label is not None:
            inst.label(i, label)
        if inst.sig != sig or inst.params != params:  # together, `signature`: what the members must agree on
            self._mismatch(inst, i, op, x, params)
        inst.count += 1
        st = self.ranks[rank]
        if inst.count < inst.needed:
            self._wait(st, inst)
        else:
            del self.instances[gi]
            self._complete(inst, rank)
        result, st.result = st.result, None
        return result

    def _members_running(self, group: Group) -> Sequence[int]:
        """The members of `group` whose programs run: every one."""
        return group.ranks

    def _brought(self, inst: _Instance) -> tuple[list, list]:
        """What each member brought to a completed collective, its input and its call site: its own call's."""
        return inst.xs, inst.sites

    def _mismatch(self, inst: _Instance, i: int, op: str, x: Any, params: dict) -> None:
        """Member i's call of `op` on `x` does not fit the calls before it (each of which fit the first). An op
        the op table lacks is refused as such, as when it opens a call."""
        entry(op)
        said, ranks, sites = describe(op, x, **params), inst.group.ranks, inst.sites
        raise mismatch_error(
            inst.call,
            inst.group,
            {
                r: f"{said if j == i else inst.said(j)} at {site_name(site)}"
                for j, (r, site) in enumerate(zip(ranks, sites))
                if site is not None
            },
        )

    def _complete(self, inst: _Instance, current: int) -> None:
        g, params, op = inst.group, inst.params, OPS[inst.op]
        (xs, sites), ranks = self._brought(inst), self.ranks
        step = 1 + max([ranks[r].clock for r in g.ranks])
        members, hops = self._members(g, xs, sites, op, params, step, current)
        # the first label brought, in the group's order, by the members whose programs ran
        label = None if inst.labels is None else next((a for a in inst.labels if a), None)
        self.events.append(
            Event(
                len(self.events),
                step,
                "collective",
                op.name,
                g,
                members,
                label,
                ranks[self._members_running(g)[0]].phase,  # its first member whose program ran
                params,
                params.get("algo"),
                hops,
            )
        )

    def _members(self, g: Group, xs: list, sites: list, op: Any, params: dict, step: int, current: int) -> tuple:
        """Every member's result and record (the op's kernel on the inputs `xs`, made at `sites`); the members
        waiting are woken."""
        ranks, keep = self.ranks, self.keep
        outs, hops = op.kernel(xs, g, params, keep if self.kept < KEPT_VALUES else 0)
        if keep and not self._room(
            sum([v.size for x, o in zip(xs, outs) for vs in (arrays(x), arrays(o)) for v in vs if v.size <= keep])
        ):
            keep = 0
        works = self._works(g.ranks)
        if not keep and hops is None and op.takes != "chunks":
            members = self._same_members(g, xs[0], sites, outs, op, params, works)
            for r, out in zip(g.ranks, outs):
                st = ranks[r]
                st.clock = step
                st.result = out
        else:
            members = self._own_records(g, xs, sites, outs, hops, op, params, step, keep, works)
        self.ready.extend([ranks[r].glet for r in self._members_running(g) if r != current])
        return members, hops

    def _same_members(
        self, g: Group, first: Any, sites: list, outs: list, op: Any, params: dict, works: list
    ) -> list[Member]:
        """Each member's record of the usual call: every member brought alike (the signature check), so what
        a record holds besides its rank, site and work is the same on every call of this kind on this group
        (`_same_records`). A call that repeats the previous one of its kind, each member calling from the same
        line with nothing computed since its last event (a loop of collectives: gradient buckets, a stage's
        gathers), has that call's records again: the same tuples, in a list of its own."""
        kind, records = self._same_records(g, first, outs, op, params)
        idle = kind if works.count(None) == len(works) else None  # the kind, where no member computed since
        if idle is not None:
            last = self._repeats.get(idle)
            if last is not None and last[0] == sites:
                return list(last[1])
        names = self.site_names
        members = [
            _member(Member, (r, tin, tout, sent, recv, names[site], None, None, work))
            for r, site, (tin, tout, sent, recv), work in zip(g.ranks, sites, records, works)
        ]
        if idle is not None:
            self._repeats[idle] = (sites, members)
        return members

    def _same_records(self, g: Group, first: Any, outs: list, op: Any, params: dict) -> tuple[tuple | None, list]:
        """(input records, result records, bytes sent, bytes received) of each member of a call whose members
        all brought alike (an array of one shape and dtype, or nothing) and whose bytes come from the op's
        formula: worked out once per kind of call on a group (its input and params, which say who gets a
        result: a reduce's root alone), then reused. With them the kind, where the run keeps its records
        (None: worked out afresh, not kept)."""
        # the op's name too: no two ops' params agree today (scatter's dim and src, all-gather's dim and algorithm),
        # but a new entry of the op table must not take another's records
        key = (op.name, g.index, first is None or (first.shape, first.dtype), *params.values())
        kept: tuple | None = key
        try:
            got = self._records.get(key)
        except TypeError:  # a param that is a list (unhashable): nothing to reuse, work it out
            got, kept = None, None
        if got is None:
            made = self._tensors
            ins = arrays(first)
            tin = tuple([tensor_record(v, made) for v in ins])
            one = next((o for o in outs if o is not None), None)
            tout = () if one is None else (tensor_record(one, made),)
            got = []
            for i, out in enumerate(outs):
                res = arrays(out)
                got.append((tin, tout if res else (), *op.moved(ins, res, g, i, params)))
            if kept is not None and len(self._records) < RECORD_KINDS:
                self._records[kept] = got
            else:
                kept = None
        return kept, got

    def _own_records(
        self,
        g: Group,
        xs: list,
        sites: list,
        outs: list,
        hops: list | None,
        op: Any,
        params: dict,
        step: int,
        keep: int,
        works: list,
    ) -> list[Member]:
        """Each member's record worked out from what it brought: chunks (which differ by member), a ring's
        recorded hops, or values kept."""
        ranks, made = self.ranks, self._tensors
        moved = ring_moved(g, hops) if hops is not None else None
        many = op.takes == "chunks"
        tins: dict[int, tuple] = {}
        if not many:  # the signature check made every member's input (and so every result) alike
            tin = tuple([tensor_record(v, made) for v in arrays(xs[0])])
            first = next((o for o in outs if o is not None), None)
            tout = () if first is None else (tensor_record(first, made),)
        members: list[Member] = []
        append = members.append
        for i, (r, x, site, out) in enumerate(zip(g.ranks, xs, sites, outs)):
            st = ranks[r]
            st.clock = step
            st.result = out
            ins, got = arrays(x), arrays(out)
            sent, recv = moved[i] if moved is not None else op.moved(ins, got, g, i, params)
            before = after = None
            if keep and all([v.size <= keep for v in ins]) and all([v.size <= keep for v in got]):
                before, after = tuple([v.tolist() for v in ins]), tuple([v.tolist() for v in got])
            if many:
                shared = tins.get(id(x))  # members that bring the very same chunks share one record
                if shared is None:
                    shared = tins[id(x)] = self._chunk_records(tuple([tensor_record(v, made) for v in ins]))
                tin = shared
                tout_i = tuple([tensor_record(v, made) for v in got])
            else:
                tout_i = tout if got else ()
            append(_member(Member, (r, tin, tout_i, sent, recv, self.site_names(site), before, after, works[i])))
        return members

    def _chunk_records(self, records: tuple) -> tuple:
        """One tuple for every call's chunks of the same shapes, across calls: the clock times an all-to-all once
        for each kind of chunks it sees (clock/costs.py), and a run repeats the same few thousands of times."""
        kept = self._chunks.get(records)
        if kept is None:
            if len(self._chunks) >= RECORD_KINDS:
                return records
            kept = self._chunks[records] = records
        return kept

    # -- marks -----------------------------------------------------------------------------------
    def mark(self, rank: int, kind: str, text: str, data: dict | None = None) -> None:
        st = self.ranks[rank]
        if kind == "phase":
            work = self._work(rank)
            if work:  # what the rank computed in the phase it leaves, after its last event there (engine/work.py)
                self.marks.append(Mark(rank, st.clock, "work", st.phase or "", work))
            st.phase = text
        self.marks.append(Mark(rank, st.clock, kind, str(text), data))

    def compute(self, rank: int, name: str, flops: float, site: str) -> None:
        st = self.ranks[rank]
        st.clock += 1
        self.events.append(
            Event(
                len(self.events),
                st.clock,
                "compute",
                name,
                self.world_group,
                [Member(rank, (), (), 0, 0, site, None, None, self._work(rank))],
                None,
                st.phase,
                {"flops": flops},
            )
        )

    def _work(self, rank: int) -> dict | None:
        """The FLOPs `rank` did since its last event (engine/work.py), handed to the event it is in now."""
        return None if self.meter is None else self.meter.take(rank)

    def _works(self, ranks: Sequence[int]) -> list[dict | None]:
        if self.meter is None:
            return [None] * len(ranks)
        return self.meter.take_all(ranks)

    def _room(self, n: int) -> bool:
        """Whether a call's `n` values fit in what the run may still keep (KEPT_VALUES numbers in all, so that
        `parasim check` over big tensors stays bounded); a call that does not fit is counted as dropped."""
        if self.kept + n > KEPT_VALUES:
            self.dropped += 1
            return False
        self.kept += n
        return True

    def trace(self) -> Trace:
        meta = {"keep_values": self.keep, "algo": self.algo}
        if self.dropped:  # only then: a trace that kept every value is written as before
            meta["values_dropped"] = self.dropped
        tail = [self.meter.take(r) or {} for r in range(self.world)] if self.meter is not None else []
        if any(tail):  # what each rank computed after its last event: the step's tail
            meta["tail_work"] = tail
        return Trace(self.world, "virtual", list(self.groups), self.events, self.marks, meta)


def _plain_ints(asked: list[tuple[tuple, str]]) -> bool:
    """Whether every rank named is an int (not a bool, numpy's int or a float equal to one)."""
    return set(map(type, chain.from_iterable(r for r, _ in asked))) <= {int}


def _ran(value: Any, rank: int) -> None:
    """A program that returned a generator or a coroutine ran nothing: its body never started."""
    kind = (
        "generator"
        if inspect.isgenerator(value)
        else "coroutine"
        if inspect.iscoroutine(value)
        else "async generator"
        if inspect.isasyncgen(value)
        else None
    )
    if kind is not None:
        if kind != "async generator":  # not awaited, not iterated: close it so Python does not warn at exit
            value.close()
        raise UsageError(
            f"rank {rank}'s program returned {'an' if kind[0] == 'a' else 'a'} {kind}, so its body never "
            "ran: a program is a plain function that runs to its end (no yield, no async def)"
        )
