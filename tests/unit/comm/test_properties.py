"""Property tests: every collective and point-to-point op against a numpy reference computed on one device.

A test draws a *plan*: a world size (1-16), a few sub-groups (random subsets of ranks in random order,
created by every rank), and a sequence of phases, each one op on one group (or the whole world). Every
rank runs the plan as an SPMD program; ranks outside a phase's group skip it. Each rank draws its inputs
from numpy with a seed keyed by (plan seed, phase, rank, slot), so the test can draw the very same inputs
again on one device and compute what every member must get. Data is integer-valued, so float sums are
exact whatever order a backend adds in, and results compare bit for bit.

For every phase the checks are:
  * values: dtype, shape and elements equal to the numpy reference;
  * ownership: every result is an array of its own (no two results, and no result and an input, share
    memory; overwriting every result leaves every other array as it was) and the inputs are untouched;
  * trace: one event per collective (one per transfer for point-to-point) with the right kind, op, group,
    member order, shapes and dtypes in and out, params, label and call site, values when `keep_values`
    covers them, a logical step one past the latest step of its members, and bytes per member equal to
    the ring formula (`interface.ring_bytes`, cross-checked against a hop-by-hop count written here),
    the chunk sizes for all-to-all (without the chunk a member keeps) and the buffer for point-to-point;
  * algo="ring": measured bytes (summed from the recorded hops) equal the ring formula, the hops go
    member i -> member i+1 in group order, and results equal algo="direct" exactly;
  * determinism: the same program run twice gives the same trace JSON.
"""
from __future__ import annotations

import functools
from collections import defaultdict, deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import parasim
from parasim import CollectiveError, Recv, Send
from parasim.comm.interface import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, BARRIER, BROADCAST, P2P, REDUCE,
                                    REDUCE_SCATTER, SCATTER, broadcast_bytes, ring_bytes)

try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    byte_bounds = np.byte_bounds

DTYPES = ("float64", "float32", "int64", "int32")
FLOATS = ("float64", "float32")
LAYOUTS = ("c", "c", "f", "flip", "strided")  # how an input array is laid out in memory
EXCHANGE, PIPELINE = "exchange", "pipeline"
COLLECTIVES = (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, BROADCAST, BARRIER, REDUCE, SCATTER)
P2P_KINDS = (EXCHANGE, PIPELINE)
ALL_KINDS = COLLECTIVES + P2P_KINDS
SITE = "tests/unit/comm/test_properties.py:"

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------------------------
# Plans

@dataclass
class Phase:
    kind: str
    group: int | None            # index into Plan.groups; None: the whole world (group=None)
    dtype: str = "float64"
    shape: tuple = ()
    dim: int = 0
    op: str = "sum"
    algo: str | None = None      # None: the run's default
    src_pos: int = 0             # broadcast, scatter, reduce: position of the root (src or dst) in the group
    sizes: tuple = ()            # all_to_all: sizes[i][j] along dim, member i -> member j
    layout: str = "c"
    shapes: tuple = ()           # exchange: shapes[pos][slot] of what member pos sends
    dtypes: tuple = ()           # exchange: dtype of each slot
    order: str = "send_first"    # exchange: order of the Send and Recv entries in the batch
    micro: int = 1               # pipeline: micro-batches


@dataclass
class Plan:
    world: int
    groups: list
    phases: list
    seed: int
    algo: str = "direct"
    keep: int = 0

    def members(self, ph: Phase) -> tuple:
        return tuple(range(self.world)) if ph.group is None else self.groups[ph.group]


def make(seed, k, rank, slot, shape, dtype, layout="c", lo=-20, hi=21):
    """Rank `rank`'s input `slot` of phase `k`: integer-valued, laid out as `layout`. Same call, same array."""
    rng = np.random.default_rng([seed, k, rank, slot])
    shape = tuple(shape)
    if layout == "strided" and shape:
        return rng.integers(lo, hi, size=shape[:-1] + (2 * shape[-1],)).astype(dtype)[..., ::2]
    a = rng.integers(lo, hi, size=shape).astype(dtype)
    if layout == "f" and a.ndim:  # (asfortranarray makes a 0-d array 1-d)
        return np.asfortranarray(a)
    if layout == "flip" and a.ndim:
        return np.flip(a)
    return a


@st.composite
def dims(draw, lo, hi):
    """A shape of lo..hi dims of size 1..3; about one in six has a dim of size 0."""
    shape = draw(st.lists(st.integers(1, 3), min_size=lo, max_size=hi))
    if shape and draw(st.sampled_from((False,) * 5 + (True,))):
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    return tuple(shape)


@st.composite
def phases(draw, kind, t, dtypes=DTYPES):
    """One phase of `kind` for a group of t members (group index filled in by the caller)."""
    dtype = draw(st.sampled_from(dtypes))
    layout = draw(st.sampled_from(LAYOUTS))
    ph = Phase(kind, None, dtype=dtype, layout=layout)
    if kind in (ALL_REDUCE, REDUCE_SCATTER, REDUCE):
        ph.op = draw(st.sampled_from(("sum", "avg", "max", "min") if dtype in FLOATS else ("sum", "max", "min")))
    if kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER):
        ph.algo = draw(st.sampled_from((None, "direct", "ring")))
    if kind in (ALL_REDUCE, BROADCAST, REDUCE):
        ph.shape = draw(dims(0, 3))
    elif kind in (REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, SCATTER):
        shape = list(draw(dims(1, 3)))
        ph.dim = draw(st.integers(-len(shape), len(shape) - 1))
        if kind in (REDUCE_SCATTER, SCATTER):
            shape[ph.dim] = t * draw(st.integers(0, 2))
        ph.shape = tuple(shape)
        if kind == ALL_TO_ALL:
            flat = draw(st.lists(st.integers(0, 3), min_size=t * t, max_size=t * t))
            ph.sizes = tuple(tuple(flat[i * t:(i + 1) * t]) for i in range(t))
    elif kind == PIPELINE:
        ph.shape = draw(dims(0, 3))
        ph.micro = draw(st.integers(1, 3))
    elif kind == EXCHANGE:
        nslots = draw(st.integers(1, 2))
        ph.dtypes = tuple(draw(st.sampled_from(dtypes)) for _ in range(nslots))
        ph.shapes = tuple(tuple(draw(dims(0, 2)) for _ in range(nslots)) for _ in range(t))
        ph.order = draw(st.sampled_from(("send_first", "recv_first", "interleave")))
    if kind in (BROADCAST, REDUCE, SCATTER):
        ph.src_pos = draw(st.integers(0, t - 1))
    return ph


@st.composite
def plans(draw, kinds=ALL_KINDS, min_world=1, max_world=16, max_phases=4, algo=None, dtypes=DTYPES):
    world = draw(st.integers(min_world, max_world))
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        perm = draw(st.permutations(range(world)))
        groups.append(tuple(perm[:draw(st.integers(1, world))]))
    out = []
    for _ in range(draw(st.integers(1, max_phases))):
        gi = draw(st.sampled_from([None] + list(range(len(groups)))))
        t = world if gi is None else len(groups[gi])
        allowed = [k for k in kinds if t >= 2 or k not in P2P_KINDS]
        if not allowed:  # a p2p-only test drew a one-member group: use the world instead
            gi, t, allowed = None, world, list(kinds)
        ph = draw(phases(draw(st.sampled_from(allowed)), t, dtypes))
        ph.group = gi
        out.append(ph)
    return Plan(world, groups, out, draw(st.integers(0, 2**32 - 1)),
                algo=algo or draw(st.sampled_from(("direct", "ring"))), keep=draw(st.sampled_from((0, 4, 64))))


# ---------------------------------------------------------------------------------------------
# The SPMD program a plan describes

def exchange_entries(plan, k, ph, members, pos):
    """This member's Send and Recv entries in a ring exchange, and the inputs it sends."""
    t = len(members)
    prev_pos, nxt = (pos - 1) % t, members[(pos + 1) % t]
    xs = [make(plan.seed, k, members[pos], j, ph.shapes[pos][j], d, ph.layout) for j, d in enumerate(ph.dtypes)]
    sends = [Send(x, nxt) for x in xs]
    # the dtype of a receive is named both ways: a string, and a numpy dtype object
    recvs = [Recv(members[prev_pos], ph.shapes[prev_pos][j], d if j % 2 == 0 else np.dtype(d))
             for j, d in enumerate(ph.dtypes)]
    if ph.order == "send_first":
        entries = sends + recvs
    elif ph.order == "recv_first":
        entries = recvs + sends
    else:
        entries = [e for pair in zip(recvs, sends) for e in pair]
    return entries, xs


def run_phase(ctx, plan, k, ph, g):
    """Rank ctx.rank's part of phase k: returns (inputs, results)."""
    members = plan.members(ph)
    r, comm, label, t = ctx.rank, ctx.comm, f"p{k}", len(members)
    pos = members.index(r)
    kw = {} if ph.algo is None else {"algo": ph.algo}
    if ph.kind == ALL_REDUCE:
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        if ph.op == "sum" and ph.algo is None:
            return [x], [comm.all_reduce(x, group=g, label=label)]  # the default op
        return [x], [comm.all_reduce(x, op=ph.op, group=g, label=label, **kw)]
    if ph.kind == REDUCE_SCATTER:
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        return [x], [comm.reduce_scatter(x, ph.dim, op=ph.op, group=g, label=label, **kw)]
    if ph.kind == ALL_GATHER:
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        return [x], [comm.all_gather(x, ph.dim, group=g, label=label, **kw)]
    if ph.kind == ALL_TO_ALL:
        chunks = [make(plan.seed, k, r, j, a2a_shape(ph, pos, j), ph.dtype, ph.layout) for j in range(t)]
        out = comm.all_to_all(chunks, ph.dim, group=g, label=label)
        assert isinstance(out, list) and len(out) == t
        return chunks, out
    if ph.kind == BROADCAST:
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        return [x], [comm.broadcast(x, members[ph.src_pos], group=g, label=label)]
    if ph.kind == BARRIER:
        assert comm.barrier(group=g, label=label) is None
        return [], []
    if ph.kind == REDUCE:  # the root gets the reduction, every other member None
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        out = comm.reduce(x, members[ph.src_pos], ph.op, group=g, label=label)
        if pos != ph.src_pos:
            assert out is None
            return [x], []
        return [x], [out]
    if ph.kind == SCATTER:  # every member passes an array of the full shape; only the root's is read
        x = make(plan.seed, k, r, 0, ph.shape, ph.dtype, ph.layout)
        return [x], [comm.scatter(x, members[ph.src_pos], ph.dim, group=g, label=label)]
    if ph.kind == EXCHANGE:
        entries, xs = exchange_entries(plan, k, ph, members, pos)
        out = comm.exchange(entries, group=g, label=label)
        assert isinstance(out, list) and len(out) == len(ph.dtypes)
        return xs, out
    if ph.kind == PIPELINE:
        ins, outs = [], []
        for m in range(ph.micro):
            if pos == 0:
                y = make(plan.seed, k, r, m, ph.shape, ph.dtype, ph.layout)
            else:
                y = comm.recv(members[pos - 1], ph.shape, ph.dtype, group=g, label=label)
                outs.append(y)
                y = np.asarray(y + 1)  # this stage's "layer" (asarray: a 0-d array plus 1 is a scalar)
            if pos < t - 1:
                assert comm.send(y, members[pos + 1], group=g, label=label) is None
                ins.append(y)
        return ins, outs
    raise AssertionError(ph.kind)


def program(plan):
    def prog(ctx):
        groups = [ctx.new_group(list(ranks), f"g{i}") for i, ranks in enumerate(plan.groups)]
        done = {}
        for k, ph in enumerate(plan.phases):
            if ctx.rank in plan.members(ph):
                done[k] = run_phase(ctx, plan, k, ph, None if ph.group is None else groups[ph.group])
        return done
    return prog


def run_plan(plan, algo=None):
    return parasim.run(program(plan), world=plan.world, keep_values=plan.keep, algo=algo or plan.algo)


# ---------------------------------------------------------------------------------------------
# The reference, on one device

def a2a_shape(ph, i, j):
    shape = list(ph.shape)
    shape[ph.dim] = ph.sizes[i][j]
    return tuple(shape)


def reduce_ref(xs, op, dtype):
    """Reduce integer-valued arrays (exact in every dtype used here)."""
    stack = np.stack(xs)
    if op == "sum":
        out = np.sum(stack, axis=0, dtype=dtype)
    elif op == "avg":
        out = np.sum(stack.astype(np.float64), axis=0) / len(xs)
    elif op == "max":
        out = np.max(stack, axis=0)
    else:
        out = np.min(stack, axis=0)
    return np.asarray(out).astype(dtype)


def expected_values(plan, k, ph):
    """{rank: (inputs, results)} that phase k must produce, computed on one device."""
    members = plan.members(ph)
    t = len(members)
    mk = functools.partial(make, plan.seed, k)
    if ph.kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST):
        xs = [mk(r, 0, ph.shape, ph.dtype, ph.layout) for r in members]
        if ph.kind == ALL_REDUCE:
            outs = [reduce_ref(xs, ph.op, ph.dtype)] * t
        elif ph.kind == REDUCE_SCATTER:
            outs = np.split(reduce_ref(xs, ph.op, ph.dtype), t, axis=ph.dim)
        elif ph.kind == ALL_GATHER:
            outs = [np.concatenate(xs, axis=ph.dim)] * t
        else:
            outs = [xs[ph.src_pos]] * t
        return {r: ([x], [y]) for r, x, y in zip(members, xs, outs)}
    if ph.kind in (REDUCE, SCATTER):
        xs = [mk(r, 0, ph.shape, ph.dtype, ph.layout) for r in members]
        if ph.kind == SCATTER:  # chunk i of the root's input, whatever the others passed
            return {r: ([x], [np.split(xs[ph.src_pos], t, axis=ph.dim)[i]]) for i, (r, x) in enumerate(zip(members, xs))}
        total = reduce_ref(xs, ph.op, ph.dtype)
        return {r: ([x], [total] if i == ph.src_pos else []) for i, (r, x) in enumerate(zip(members, xs))}
    if ph.kind == ALL_TO_ALL:
        chunks = [[mk(r, j, a2a_shape(ph, i, j), ph.dtype, ph.layout) for j in range(t)]
                  for i, r in enumerate(members)]
        return {r: (chunks[j], [chunks[i][j] for i in range(t)]) for j, r in enumerate(members)}
    if ph.kind == BARRIER:
        return {r: ([], []) for r in members}
    if ph.kind == EXCHANGE:
        xs = [[mk(r, j, ph.shapes[p][j], d, ph.layout) for j, d in enumerate(ph.dtypes)]
              for p, r in enumerate(members)]
        return {r: (xs[p], xs[(p - 1) % t]) for p, r in enumerate(members)}
    if ph.kind == PIPELINE:
        first = [mk(members[0], m, ph.shape, ph.dtype, ph.layout) for m in range(ph.micro)]
        out = {}
        for p, r in enumerate(members):
            got = [] if p == 0 else [np.asarray(x + (p - 1)) for x in first]
            sent = [] if p == t - 1 else [np.asarray(x + p) for x in first] if p else first
            out[r] = (sent, got)
        return out
    raise AssertionError(ph.kind)


def sim_ring_bytes(op, nelem, t, itemsize):
    """Bytes each member sends and receives, counted hop by hop on a ring of t (chunks: np.array_split)."""
    if t == 1:
        return [(0, 0)]
    sizes = [len(c) * itemsize for c in np.array_split(np.arange(nelem), t)]
    sent, recv = [0] * t, [0] * t
    if op in (REDUCE_SCATTER, ALL_REDUCE):  # hop k: member i passes its partial sum of chunk i-k-1
        for hop in range(t - 1):
            for i in range(t):
                c = sizes[(i - hop - 1) % t]
                sent[i] += c
                recv[(i + 1) % t] += c
    if op in (ALL_GATHER, ALL_REDUCE):  # hop k: member i passes the finished chunk i-k
        for hop in range(t - 1):
            for i in range(t):
                c = sizes[(i - hop) % t]
                sent[i] += c
                recv[(i + 1) % t] += c
    return list(zip(sent, recv))


def expected_bytes(ph, members, ins):
    """(sent, received) bytes of each member of a collective, in group order."""
    t = len(members)
    if ph.kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER):
        x = ins[members[0]][0]
        nbytes = x.nbytes * (t if ph.kind == ALL_GATHER else 1)  # the full buffer
        want = ring_bytes(ph.kind, nbytes, t, x.itemsize)
        assert list(want) == sim_ring_bytes(ph.kind, nbytes // x.itemsize, t, x.itemsize)
        if t > 1 and (nbytes // x.itemsize) % t == 0:
            share = (2 if ph.kind == ALL_REDUCE else 1) * (t - 1) * nbytes // t
            assert set(want) == {(share, share)}
        return list(want)
    if ph.kind == ALL_TO_ALL:
        nb = [[ins[r][j].nbytes for j in range(t)] for r in members]
        return [(sum(nb[i][j] for j in range(t) if j != i), sum(nb[j][i] for j in range(t) if j != i))
                for i in range(t)]
    if ph.kind == BROADCAST:
        n = ins[members[0]][0].nbytes
        want = [broadcast_bytes(n, t, i, ph.src_pos) for i in range(t)]
        pos = [(i - ph.src_pos) % t for i in range(t)]  # place in the chain from src
        assert want == [(n * (p < t - 1), n * (p > 0)) for p in pos]
        return want
    if ph.kind == BARRIER:
        return [(0, 0)] * t
    n = ins[members[0]][0].nbytes
    pos = [(i - ph.src_pos) % t for i in range(t)]  # distance from the root
    if ph.kind == REDUCE:  # a chain into the root: t-1 -> t-2 -> ... -> 1 -> root, the whole buffer each hop
        return [(n * (p > 0), n * (p < t - 1)) for p in pos]
    if ph.kind == SCATTER:  # the root sends each other member its chunk
        return [((t - 1) * (n // t), 0) if p == 0 else (0, n // t) for p in pos]
    raise AssertionError(ph.kind)


def expected_params(ph, algo):
    dim = ph.dim % len(ph.shape) if ph.shape else 0
    return {ALL_REDUCE: {"op": ph.op, "algo": algo}, REDUCE_SCATTER: {"op": ph.op, "dim": dim, "algo": algo},
            ALL_GATHER: {"dim": dim, "algo": algo}, ALL_TO_ALL: {"dim": dim}, BROADCAST: {"src": None},
            BARRIER: {}, REDUCE: {"op": ph.op, "dst": None}, SCATTER: {"dim": dim, "src": None}}[ph.kind]


def expected_transfers(plan, ph, clocks):
    """Point-to-point transfers of a phase, {(src, dst): [(shape, dtype, step), ...] in FIFO order},
    advancing `clocks` the way the logical clock must move."""
    members = plan.members(ph)
    t = len(members)
    out = defaultdict(list)
    if ph.kind == EXCHANGE:  # one batch per member, all posted at the clocks of before the phase
        c0 = {r: clocks[r] for r in members}
        for j, d in enumerate(ph.dtypes):
            for p in range(t):
                src, dst = members[p], members[(p + 1) % t]
                out[src, dst].append((ph.shapes[p][j], d, 1 + max(c0[src], c0[dst])))
        for p, r in enumerate(members):
            steps = [s for (a, b), lst in out.items() if r in (a, b) for (_, _, s) in lst]
            clocks[r] = max([c0[r]] + steps)
        return out
    # a pipeline of blocking send/recv: a transfer happens when both heads match
    todo = {}
    for p, r in enumerate(members):
        ops = []
        for _ in range(ph.micro):
            if p > 0:
                ops.append(("recv", members[p - 1]))
            if p < t - 1:
                ops.append(("send", members[p + 1]))
        todo[r] = deque(ops)
    moved = True
    while moved:
        moved = False
        for r in members:
            if todo[r] and todo[r][0][0] == "send":
                dst = todo[r][0][1]
                if todo[dst] and todo[dst][0] == ("recv", r):
                    step = 1 + max(clocks[r], clocks[dst])
                    clocks[r] = clocks[dst] = step
                    todo[r].popleft()
                    todo[dst].popleft()
                    out[r, dst].append((ph.shape, ph.dtype, step))
                    moved = True
    assert not any(todo.values())
    return out


# ---------------------------------------------------------------------------------------------
# Checks

def assert_same(got, want, what):
    assert isinstance(got, np.ndarray), f"{what}: got {type(got).__name__}, not an array"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.array_equal(got, want), f"{what}: {got.tolist()} != {want.tolist()}"


def tensors(arrays):
    return tuple((tuple(a.shape), a.dtype.name) for a in arrays)


def kept(arrays, keep):
    """What a member's before/after holds for `arrays` under keep_values."""
    return tuple(a.tolist() for a in arrays) if keep else None


def check_ownership(values):
    """No two arrays (results and inputs of every rank and phase) share memory; results are writable
    arrays of their own: overwriting each with its own number leaves every other array as it was."""
    arrays, results = [], []
    for rank_vals in values:
        for ins, outs in rank_vals.values():
            arrays += [("in", a) for a in ins]
            arrays += [("out", a) for a in outs]
            results += outs
    ids = [id(a) for _, a in arrays]
    assert len(set(ids)) == len(ids), "one array object is handed out twice"
    spans = sorted(((*byte_bounds(a), kind, a) for kind, a in arrays if a.size), key=lambda s: s[0])
    for i, (lo, hi, kind, a) in enumerate(spans):
        for lo2, hi2, kind2, b in spans[i + 1:]:
            if lo2 >= hi:
                break
            assert not np.shares_memory(a, b), f"a {kind} array shares memory with a {kind2} array"
    snapshot = [a.copy() for _, a in arrays]
    for n, a in enumerate(results):
        a[...] = n % 100
    for n, a in enumerate(results):
        assert np.all(a == n % 100), "writing one result changed another"
    for (kind, a), old in zip(arrays, snapshot):
        if kind == "in":
            assert np.array_equal(a, old), "writing a result changed an input"


def check_run(plan, res, algo=None):
    """Check values, ownership and the whole trace of one run of `plan` against the reference."""
    algo = algo or plan.algo
    trace = res.trace
    assert trace.world == plan.world and len(res.values) == plan.world
    assert [(g.ranks, g.name, g.index) for g in trace.groups] == (
        [(tuple(range(plan.world)), "world", 0)] + [(g, f"g{i}", i + 1) for i, g in enumerate(plan.groups)])
    by_label = defaultdict(list)
    for n, e in enumerate(trace.events):
        assert e.seq == n
        by_label[e.label].append(e)
    assert set(by_label) <= {f"p{k}" for k in range(len(plan.phases))}, set(by_label)
    clocks = [0] * plan.world

    for k, ph in enumerate(plan.phases):
        members = plan.members(ph)
        t = len(members)
        want = expected_values(plan, k, ph)
        for r in range(plan.world):
            assert (k in res.values[r]) == (r in members)
        for r in members:
            ins, outs = res.values[r][k]
            wins, wouts = want[r]
            assert len(ins) == len(wins) and len(outs) == len(wouts)
            for n, (a, b) in enumerate(zip(ins, wins)):
                assert_same(a, b, f"phase {k} ({ph.kind}) rank {r} input {n} (must be untouched)")
            for n, (a, b) in enumerate(zip(outs, wouts)):
                assert_same(a, b, f"phase {k} ({ph.kind}) rank {r} result {n}")
        group = (tuple(range(plan.world)), "world", 0) if ph.group is None else \
            (members, f"g{ph.group}", ph.group + 1)
        events = by_label.pop(f"p{k}", [])
        for e in events:
            assert (e.group.ranks, e.group.name, e.group.index) == group
            assert all(m.site.startswith(SITE) for m in e.members), [m.site for m in e.members]
            assert e.phase is None

        if ph.kind in COLLECTIVES:
            assert len(events) == 1, f"phase {k} ({ph.kind}): {len(events)} events"
            (e,) = events
            step = 1 + max(clocks[r] for r in members)
            for r in members:
                clocks[r] = step
            ev_algo = (ph.algo or algo) if ph.kind in (ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER) else None
            params = expected_params(ph, ev_algo)
            for root in ("src", "dst"):
                if root in params:
                    params[root] = members[ph.src_pos]
            assert (e.kind, e.op, e.step, e.params, e.algo) == ("collective", ph.kind, step, params, ev_algo)
            assert e.ranks == list(members)
            ins = {r: want[r][0] for r in members}
            moved = expected_bytes(ph, members, ins)
            for m, r, mv in zip(e.members, members, moved):
                wins, wouts = want[r]
                assert (m.rank, m.ins, m.outs) == (r, tensors(wins), tensors(wouts))
                assert (m.sent, m.recv) == mv, f"phase {k} ({ph.kind}, t={t}) rank {r}: bytes"
                fits = plan.keep and all(a.size <= plan.keep for a in wins + wouts)
                assert m.before == kept(wins, fits) and m.after == kept(wouts, fits)
            if ev_algo == "ring":
                check_hops(ph, e, members, moved)  # a group of one rank has a ring of no hops
            else:
                assert e.hops is None
        else:
            transfers = expected_transfers(plan, ph, clocks)
            assert len(events) == sum(len(v) for v in transfers.values())
            got = defaultdict(list)
            for e in events:
                got[e.params["src"], e.params["dst"]].append(e)
            assert set(got) == set(transfers)
            for (src, dst), lst in transfers.items():
                assert len(got[src, dst]) == len(lst)
                sent = want[src][0]  # every sender sends to one peer only: all its inputs, in FIFO order
                for x, e, (shape, dtype, step) in zip(sent, got[src, dst], lst):
                    assert (e.kind, e.op, e.algo, e.hops, e.step) == ("p2p", P2P, None, None, step)
                    assert e.params == {"src": src, "dst": dst} and e.ranks == [src, dst]
                    a, b = e.members
                    tens = ((tuple(shape), np.dtype(dtype).name),)
                    assert (a.rank, a.ins, a.outs, a.sent, a.recv) == (src, tens, (), x.nbytes, 0)
                    assert (b.rank, b.ins, b.outs, b.sent, b.recv) == (dst, (), tens, 0, x.nbytes)
                    fits = bool(plan.keep) and x.size <= plan.keep
                    assert a.before == kept([x], fits) and b.after == kept([x], fits)
                    assert a.after == b.before == (() if fits else None)
    assert not by_label, f"events nobody asked for: {list(by_label)}"
    check_ownership(res.values)


def check_hops(ph, e, members, moved):
    """A ring's recorded hops: member i sends to member i+1 in group order, the chunk the algorithm names,
    and the bytes summed over hops are the member's sent/received bytes."""
    t = len(members)
    phases_ = {ALL_REDUCE: ["reduce-scatter", "all-gather"], REDUCE_SCATTER: ["reduce-scatter"],
               ALL_GATHER: ["all-gather"]}[ph.kind]
    assert [(h["phase"], h["hop"]) for h in e.hops] == [(p, k) for p in phases_ for k in range(t - 1)]
    sent, recv = defaultdict(int), defaultdict(int)
    for h in e.hops:
        shift = 1 if h["phase"] == "reduce-scatter" else 0
        assert [(tr["src"], tr["dst"], tr["chunk"]) for tr in h["transfers"]] == \
            [(members[i], members[(i + 1) % t], (i - h["hop"] - shift) % t) for i in range(t)]
        for tr in h["transfers"]:
            sent[tr["src"]] += tr["bytes"]
            recv[tr["dst"]] += tr["bytes"]
    assert [(sent[r], recv[r]) for r in members] == moved


# ---------------------------------------------------------------------------------------------
# One op at a time (a few calls in a row, on different groups)

@settings(max_examples=150, **SETTINGS)
@given(plans(kinds=(ALL_REDUCE,)))
def test_all_reduce(plan):
    check_run(plan, run_plan(plan))


@settings(max_examples=120, **SETTINGS)
@given(plans(kinds=(REDUCE_SCATTER,)))
def test_reduce_scatter(plan):
    check_run(plan, run_plan(plan))


@settings(max_examples=120, **SETTINGS)
@given(plans(kinds=(ALL_GATHER,)))
def test_all_gather(plan):
    check_run(plan, run_plan(plan))


@settings(max_examples=80, **SETTINGS)
@given(plans(kinds=(ALL_TO_ALL,), max_phases=3))
def test_all_to_all_uneven_chunks(plan):
    check_run(plan, run_plan(plan))


@settings(max_examples=100, **SETTINGS)
@given(plans(kinds=(REDUCE, SCATTER)))
def test_reduce_and_scatter(plan):
    check_run(plan, run_plan(plan))


@given(plans(kinds=(BROADCAST, BARRIER)))
def test_broadcast_and_barrier(plan):
    check_run(plan, run_plan(plan))


@settings(max_examples=100, **SETTINGS)
@given(plans(kinds=(EXCHANGE,), min_world=2, max_phases=3))
def test_exchange_ring(plan):
    """Every member sends to the next and receives from the previous, in one batch."""
    check_run(plan, run_plan(plan))


@settings(max_examples=100, **SETTINGS)
@given(plans(kinds=(PIPELINE,), min_world=2, max_phases=3))
def test_send_recv_pipeline(plan):
    check_run(plan, run_plan(plan))


# ---------------------------------------------------------------------------------------------
# Everything mixed, determinism, ring against direct

@settings(max_examples=120, **SETTINGS)
@given(plans(kinds=ALL_KINDS, max_phases=6))
def test_mixed_programs_and_determinism(plan):
    a, b = run_plan(plan), run_plan(plan)
    check_run(plan, a)
    assert a.trace.to_json() == b.trace.to_json()


@settings(max_examples=100, **SETTINGS)
@given(plans(kinds=(ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER), max_phases=3))
def test_ring_gives_the_same_results_as_direct(plan):
    for ph in plan.phases:
        ph.algo = None  # the run's default decides
    direct, ring = run_plan(plan, "direct"), run_plan(plan, "ring")
    for r in range(plan.world):
        for k, (_, outs) in direct.values[r].items():
            for a, b in zip(outs, ring.values[r][k][1]):
                assert_same(b, a, f"ring vs direct, phase {k} rank {r}")
    check_run(plan, direct, "direct")  # includes the ring's hops and measured bytes
    check_run(plan, ring, "ring")
    for e, f in zip(direct.trace.events, ring.trace.events):
        assert [(m.sent, m.recv) for m in e.members] == [(m.sent, m.recv) for m in f.members]


@settings(max_examples=100, **SETTINGS)
@given(t=st.integers(2, 16), n=st.integers(0, 40), dtype=st.sampled_from(DTYPES), data=st.data())
def test_ring_all_reduce_bytes_with_uneven_chunks(t, n, dtype, data):
    """n elements need not divide by t: the ring's chunks differ by one, and each member never sends the
    chunk it ends up owning (reduce-scatter) or the one it receives last (all-gather)."""
    ranks = tuple(data.draw(st.permutations(range(t))))
    plan = Plan(t, [ranks], [Phase(ALL_REDUCE, 0, dtype, (n,), op="sum", algo="ring")], data.draw(st.integers(0, 99)))
    res = run_plan(plan)
    check_run(plan, res)
    (e,) = res.trace.events
    itemsize = np.dtype(dtype).itemsize
    assert [(m.sent, m.recv) for m in e.members] == list(ring_bytes(ALL_REDUCE, n * itemsize, t, itemsize))
    total = sum(m.sent for m in e.members)
    assert total == sum(m.recv for m in e.members) == 2 * (t - 1) * n * itemsize


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from((ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER)), nelem=st.integers(0, 200),
       t=st.integers(1, 16), itemsize=st.sampled_from((1, 2, 4, 8)))
def test_ring_bytes_formula(op, nelem, t, itemsize):
    want = sim_ring_bytes(op, nelem, t, itemsize)
    assert list(ring_bytes(op, nelem * itemsize, t, itemsize)) == want
    if t > 1 and nelem % t == 0:
        share = (2 if op == ALL_REDUCE else 1) * (t - 1) * nelem * itemsize // t
        assert set(want) == {(share, share)}


@settings(max_examples=80, **SETTINGS)
@given(world=st.integers(1, 16), data=st.data(), op=st.sampled_from(("sum", "avg", "max", "min")),
       dtype=st.sampled_from(FLOATS), shape=dims(0, 3), seed=st.integers(0, 99))
def test_direct_reductions_run_in_group_order(world, data, op, dtype, shape, seed):
    """Non-integer floats: direct all-reduce and reduce-scatter add ((x0 + x1) + x2) + ... in group order,
    bit for bit."""
    ranks = tuple(data.draw(st.permutations(range(world))))[:data.draw(st.integers(1, world))]
    t = len(ranks)
    rs_shape = (t * 2,) + shape[1:]

    def draw(r, s):
        return np.random.default_rng([seed, r]).normal(size=s).astype(dtype)

    def prog(ctx):
        g = ctx.new_group(ranks, "g")
        if ctx.rank in ranks:
            return (ctx.comm.all_reduce(draw(ctx.rank, shape), op, group=g),
                    ctx.comm.reduce_scatter(draw(ctx.rank, rs_shape), op=op, group=g))

    res = parasim.run(prog, world=world)
    fn = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum}[op]

    def ref(xs):
        out = functools.reduce(fn, xs)
        return (out / t if op == "avg" else out).astype(dtype)

    full = ref([draw(r, shape) for r in ranks])
    parts = np.split(ref([draw(r, rs_shape) for r in ranks]), t)
    for i, r in enumerate(ranks):
        ar, rs = res.values[r]
        assert_same(ar, np.asarray(full), f"all_reduce rank {r}")
        assert_same(rs, parts[i], f"reduce_scatter rank {r}")


@pytest.mark.parametrize("call", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_avg_needs_a_float_dtype(call, dtype):
    def prog(ctx):
        getattr(ctx.comm, call)(np.zeros(4, dtype), op="avg")

    with pytest.raises(CollectiveError, match="avg"):
        parasim.run(prog, world=2)


# ---------------------------------------------------------------------------------------------
# Regressions: bugs this file found once

def test_recv_accepts_a_numpy_scalar_type_as_dtype():
    def prog(ctx):
        if ctx.rank == 0:
            ctx.comm.send(np.arange(3, dtype=np.float32), 1)
        else:
            return ctx.comm.recv(0, (3,), np.float32)

    res = parasim.run(prog, world=2)
    assert res.values[1].tolist() == [0.0, 1.0, 2.0] and res.values[1].dtype == np.float32


@pytest.mark.parametrize("call", [ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL])
def test_numpy_integer_dim_keeps_the_trace_json_serializable(call):
    def prog(ctx):
        x = np.ones((2, 2))
        if call == ALL_TO_ALL:
            return ctx.comm.all_to_all([x, x], dim=np.int64(1))
        return getattr(ctx.comm, call)(x, dim=np.int64(1))

    res = parasim.run(prog, world=2)
    assert res.trace.events[0].params["dim"] == 1
    res.trace.to_json()


def test_group_mismatch_names_the_programs_line():
    def prog(ctx):
        ctx.new_group([0, 1] if ctx.rank == 0 else [1, 0], "dp")

    with pytest.raises(parasim.CollectiveMismatch) as info:
        parasim.run(prog, world=2)
    assert "context.py" not in str(info.value) and SITE in str(info.value)
