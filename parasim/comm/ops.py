"""The op table: one entry per collective, everything about it in one place.

An entry says what the op computes on numpy (`kernel`, every member at once: virtual ranks), how it runs
on torch.distributed (`torch`, one rank: comm/torchdist.py), the bytes each member sends and receives
(`moved`), who sends them to whom (`sends`: a pattern of comm/hops.py, which also gives the clock its
algorithm and the app its sentence for a learner), its bytes as nccl-tests count a bus bandwidth
(`bus_factor`: the estimator's traffic and the clock's measured rates), whether it adds its members' values
up (`reduces`: the rounding a real run's sum may make), what its input and output look like over the group
(`placement`, DTensor's words), how the app draws it (`glyph`, `title`, `colour`), and what a call takes,
so that a recorded call can be made again (`takes`: engine/merge.py replays real ranks' records).
A public Comm method (interface.py) checks a named op's arguments before any of this runs; `Comm.call`
runs any entry by its name.

Adding a collective: an entry here (its functions beside it) and its test; a public method in interface.py
where its arguments need checks of their own. Nothing else changes: the backends, the trace format, the
clock, the estimator and the app read the entry.

No torch here: a torch function gets a handle (`c`, built by torchdist.py) with `c.dist`
(torch.distributed), `c.torch`, the group `c.g`, this rank's place in it `c.me`, `c.perm` (torch's member
index of each of ours: torch orders a group's ranks ascending), `c.run(fn, *args, **kw)` (calls fn on
the group's process group, a time-out named after the call), `c.reduce_op(op)` and `c.ring(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import ring
from .interface import (
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    BARRIER,
    BROADCAST,
    REDUCE,
    REDUCE_SCATTER,
    SCATTER,
    Group,
    broadcast_bytes,
)
from ..errors import CollectiveError
from .kernels import COMBINE, copies, mean, ordered_sum, reduce, ring_sum, torch_members


@dataclass(frozen=True)
class Op:
    name: str  # as the trace writes it, and the name of the public Comm method
    takes: str  # "array", "chunks" (a list, one per member) or "nothing": what the method's first argument is
    # numpy, every member at once: (inputs in group order, group, params, keep_values) -> (results, ring hops)
    kernel: Callable[[list, Group, dict, int], tuple[list, list | None]]
    # torch, this rank: (handle, input, params) -> (result, ring hops, (sent, received) or None: use `moved`)
    torch: Callable[[Any, Any, dict], tuple[Any, list | None, tuple[int, int] | None]]
    # (this member's inputs, its results, group, its index in the group, params) -> (sent, received) bytes
    moved: Callable[[Any, Any, Group, int, dict], tuple[int, int]]
    placement: tuple[str, str]  # the input's and the result's layout over the group; str.format(**params)
    glyph: str  # two characters in the app's grid
    title: str  # the app's name for it (also its style name: timeline--<title>)
    colour: str  # the grid's colour, a CSS colour name
    sends: str  # comm/hops.PATTERNS' key: who sends each member's bytes to whom (and so how the clock times it)
    # nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): the bytes each of t members moves per byte of the
    # whole buffer (2(t-1)/t for an all-reduce, a ring's two passes); None for an op that moves no data
    bus_factor: Callable[[int], float] | None
    reduces: bool = False  # adds its members' values up (a sum rounds in 16-bit floats: engine/tolerance.py)

    def replay(self, comm: Any, xs: list, params: dict, group: Group | None, label: str | None) -> Any:
        """Make a recorded call again with arrays of its recorded shapes (`xs`) and its recorded params
        (`Comm.call`: through the op's public method where it has one, its checks and its signature)."""
        args = {"array": tuple(xs[:1]), "chunks": (xs,), "nothing": ()}[self.takes]
        return comm.call(self.name, *args, group=group, label=label, **params)

    def words(self, side: str, params: dict) -> str:
        """The placement of the input ("in") or the result ("out")."""
        return self.placement[side != "in"].format(**params)


def _root(g: Group, p: dict) -> int:
    return g.ranks.index(p["src"] if "src" in p else p["dst"])


# -- NaN in max and min: torch's rule on every backend ----------------------------------------------------
# torch.maximum and torch.minimum propagate NaN, and so do numpy's (virtual ranks, and the ring on real ranks).
# gloo's max and min are std::max and std::min, which drop a NaN unless the member that ends the chunk holds it;
# so a max or min of floats on torch.distributed also reduces a NaN mask (its max) and puts NaN where any
# member had one. One extra collective of a byte per element, run inside the call (the record is the call's).


def _nan_mask(c, x, p):
    """Which elements are NaN on this member, as bytes to reduce alongside a max or min (None: nothing to do)."""
    if p["op"] not in ("max", "min") or not x.is_floating_point():
        return None
    return c.torch.isnan(x).to(c.torch.uint8)


def _put_nan(out, mask):
    return out if mask is None else out.masked_fill_(mask.bool(), float("nan"))


# -- all-reduce: every member gets the reduction -----------------------------------------------------
# Sums of float16 and bfloat16 add in gloo's ring order, bit for bit (kernels.ring_sum); NCCL adds in an order
# of its own (ring or tree), so a run on NCCL is compared within a sum's rounding bound (engine/tolerance.py).


def _all_reduce(inputs, g, p, keep):
    op, t = p["op"], g.size
    if p["algo"] == "ring":
        return ring.ring_all_reduce(
            inputs, g.ranks, COMBINE[op], t if op == "avg" else None, keep, g.ring_steps(ALL_REDUCE)
        )
    if ordered_sum(inputs, op):
        flat = ring_sum([inputs[i].reshape(-1) for i in torch_members(g)])
        return copies(mean(flat.reshape(inputs[0].shape), op, t), t), None
    return copies(reduce(inputs, op), t), None


def _all_reduce_torch(c, x, p):
    if p["algo"] == "ring":
        return c.ring(x, p["op"], ALL_REDUCE)
    out, mask = x.clone(), _nan_mask(c, x, p)
    c.run(c.dist.all_reduce, out, op=c.reduce_op(p["op"]))
    if mask is not None:
        c.run(c.dist.all_reduce, mask, op=c.reduce_op("max"))
    if p["op"] == "avg":  # gloo has no average: sum, then divide
        out /= c.g.size
    return _put_nan(out, mask), None, None


# -- reduce-scatter: reduce, member i keeps chunk i of dim ---------------------------------------------


def _reduce_scatter(inputs, g, p, keep):
    op, t, dim = p["op"], g.size, p["dim"]
    if p["algo"] == "ring":
        return ring.ring_reduce_scatter(
            inputs, g.ranks, dim, COMBINE[op], t if op == "avg" else None, keep, g.ring_steps(REDUCE_SCATTER)
        )
    cut: dict[int, list] = {}  # a folded symbolic group sends one array many times: split it once
    parts = [cut[id(x)] if id(x) in cut else cut.setdefault(id(x), np.split(x, t, axis=dim)) for x in inputs]
    if ordered_sum(inputs, op):
        return _reduce_scatter_in_order(parts, g, op, dim), None
    return [reduce([q[i] for q in parts], op) for i in range(t)], None


def _reduce_scatter_in_order(parts: list, g: Group, op: str, dim: int) -> list:
    """A 16-bit float reduce-scatter as torch runs it on gloo: each member's chunks laid out in torch's member
    order, dim first, as one flat buffer (`_reduce_scatter_torch`), summed by gloo's all-reduce, then torch
    member j keeps block j."""
    order, t = torch_members(g), g.size
    flat = [np.concatenate([np.moveaxis(parts[m][order[j]], dim, 0).reshape(-1) for j in range(t)]) for m in order]
    total = ring_sum(flat)
    shape = np.moveaxis(parts[0][0], dim, 0).shape
    n = total.size // t
    out = []
    for i in range(t):
        j = order.index(i)  # our member i is torch's member j: it keeps block j, our chunk i
        block = np.moveaxis(total[j * n : (j + 1) * n].reshape(shape), 0, dim)
        out.append(mean(block.copy(), op, t))  # an array of its own, C order
    return out


def _reduce_scatter_torch(c, x, p):
    op, dim, t = p["op"], p["dim"], c.g.size
    if p["algo"] == "ring":
        return c.ring(x, op, REDUCE_SCATTER, dim)
    ordered = [None] * t  # torch member j receives chunk j: put ours where torch expects them
    for i, chunk in enumerate(c.torch.chunk(x, t, dim=dim)):
        ordered[c.perm[i]] = chunk.movedim(dim, 0)
    inp = c.torch.cat([o.contiguous() for o in ordered])
    out = c.torch.empty_like(ordered[0].contiguous())
    c.run(c.reduce_scatter_single, out, inp, op=c.reduce_op(op))
    if op == "avg":
        out /= t
    mask = _nan_mask(c, x, p)
    if mask is not None:  # the same call on the NaN mask: its chunks land where the values' do
        mask = _reduce_scatter_torch(c, mask, {**p, "op": "max"})[0].bool()
    return _put_nan(out.movedim(0, dim).contiguous(), mask), None, None


# -- all-gather: concatenate every member's input along dim, in group order ----------------------------


def _all_gather(inputs, g, p, keep):
    if p["algo"] == "ring":
        return ring.ring_all_gather(inputs, g.ranks, p["dim"], keep, g.ring_steps(ALL_GATHER))
    return copies(np.concatenate(inputs, axis=p["dim"]), g.size), None


def _all_gather_torch(c, x, p):
    dim, t = p["dim"], c.g.size
    if p["algo"] == "ring":
        return c.ring(x, "sum", ALL_GATHER, dim)
    inp = x.movedim(dim, 0).contiguous()
    buf = c.torch.empty((t * inp.shape[0], *inp.shape[1:]), dtype=x.dtype, device=x.device)
    c.run(c.all_gather_single, buf, inp)
    parts = c.torch.chunk(buf, t)
    return c.torch.cat([parts[c.perm[i]] for i in range(t)]).movedim(0, dim).contiguous(), None, None


# -- all-to-all: member i sends chunk j to member j (sizes along dim may differ) ------------------------


def _all_to_all(inputs, g, p, keep):
    t = g.size
    if not all([type(c) is np.ndarray for row in inputs for c in row]):  # symbolic arrays: shapes to copy
        return [[inputs[i][j].copy() for i in range(t)] for j in range(t)], None
    # one buffer per receiving member, its t chunks C-ordered views into it: t fresh allocations, not t x t
    # (a fresh allocation's pages are what a big all-to-all spends its time on; benchmarks/collectives.py)
    out = []
    for j in range(t):
        got = [inputs[i][j] for i in range(t)]
        buf = np.empty(sum([c.size for c in got]), dtype=got[0].dtype)
        views, at = [], 0
        for c in got:
            view = buf[at : at + c.size].reshape(c.shape)
            np.copyto(view, c)
            views.append(view)
            at += c.size
        out.append(views)
    return out, None


def _all_to_all_torch(c, chunks, p):
    dim, t, torch = p["dim"], c.g.size, c.torch
    ours = [c.perm.index(j) for j in range(t)]  # our member index of torch member j
    send = [chunks[ours[j]].movedim(dim, 0).contiguous() for j in range(t)]
    in_sizes = torch.tensor([s.shape[0] for s in send], dtype=torch.int64, device=chunks[0].device)
    out_sizes = torch.empty_like(in_sizes)
    c.run(c.dist.all_to_all_single, out_sizes, in_sizes)  # first the sizes, then the data
    recv_sizes = out_sizes.tolist()
    buf = torch.empty((sum(recv_sizes), *send[0].shape[1:]), dtype=chunks[0].dtype, device=chunks[0].device)
    c.run(c.dist.all_to_all_single, buf, torch.cat(send), recv_sizes, in_sizes.tolist())
    got = list(torch.split(buf, recv_sizes))
    return [got[c.perm[i]].movedim(0, dim).contiguous() for i in range(t)], None, None


def _all_to_all_moved(ins, outs, g, i, p):
    """The chunks sent to / received from the other members."""
    return sum([x.nbytes for x in ins]) - ins[i].nbytes, sum([x.nbytes for x in outs]) - outs[i].nbytes


# -- broadcast: every member gets a copy of src's input -------------------------------------------------


def _broadcast(inputs, g, p, keep):
    x = inputs[_root(g, p)]
    return [x.copy() for _ in range(g.size)], None


def _broadcast_torch(c, x, p):
    out = x.clone()
    c.run(c.dist.broadcast, out, p["src"])
    return out, None, None


# -- reduce: the reduction goes to dst only; the others get None ------------------------------------------


def _reduce(inputs, g, p, keep):
    root, op = _root(g, p), p["op"]
    if ordered_sum(inputs, op):  # gloo's reduce: the all-reduce's ring, with its own segment rule
        out = mean(
            ring_sum([inputs[i].reshape(-1) for i in torch_members(g)], True).reshape(inputs[0].shape), op, g.size
        )
    else:
        out = reduce(inputs, op)
    return [out if i == root else None for i in range(g.size)], None


def _reduce_torch(c, x, p):
    out, mask = x.clone(), _nan_mask(c, x, p)  # torch reduces in place; the root's buffer ends up holding the result
    c.run(c.dist.reduce, out, p["dst"], op=c.reduce_op(p["op"]))
    if mask is not None:
        c.run(c.dist.reduce, mask, p["dst"], op=c.reduce_op("max"))
    if c.g.ranks[c.me] != p["dst"]:
        return None, None, None
    if p["op"] == "avg":
        out /= c.g.size
    return _put_nan(out, mask), None, None


def _reduce_moved(ins, outs, g, i, p):
    """A chain into dst (a broadcast run backwards): every member but dst sends the buffer once."""
    sent, recv = broadcast_bytes(ins[0].nbytes, g.size, i, _root(g, p))
    return recv, sent


# -- scatter: src splits its input along dim, member i gets chunk i -------------------------------------


def _scatter(inputs, g, p, keep):
    parts = np.split(inputs[_root(g, p)], g.size, axis=p["dim"])
    return [q.copy() for q in parts], None


def _scatter_torch(c, x, p):
    dim, t = p["dim"], c.g.size
    shape = list(x.shape)
    shape[dim] //= t
    out = c.torch.empty(shape, dtype=x.dtype, device=x.device)
    chunks = None
    if c.g.ranks[c.me] == p["src"]:
        chunks = [None] * t  # in torch's member order
        for i, chunk in enumerate(c.torch.tensor_split(x, t, dim=dim)):
            chunks[c.perm[i]] = chunk.contiguous()
    c.run(c.dist.scatter, out, chunks, src=p["src"])
    return out, None, None


def _scatter_moved(ins, outs, g, i, p):
    """src sends every other member its chunk; each of them receives one chunk."""
    chunk = outs[0].nbytes
    return ((g.size - 1) * chunk, 0) if i == _root(g, p) else (0, chunk)


# -- barrier ---------------------------------------------------------------------------------------------


def _barrier(inputs, g, p, keep):
    return [None] * g.size, None


def _barrier_torch(c, x, p):
    c.run(c.dist.barrier)
    return None, None, None


# Bytes under the ring algorithm (interface.ring_bytes, kept by the group) of the full buffer: the input of
# a reduction, the result of a gather. Functions of the module, not closures made at import: a mutation
# tester switches a module's functions at call time.


def _ring_of(op: str, x: Any, g: Group, i: int) -> tuple[int, int]:
    return g.ring_bytes(op, x.nbytes, x.itemsize)[i]


def _all_reduce_moved(ins, outs, g, i, p):
    return _ring_of(ALL_REDUCE, ins[0], g, i)


def _reduce_scatter_moved(ins, outs, g, i, p):
    return _ring_of(REDUCE_SCATTER, ins[0], g, i)


def _all_gather_moved(ins, outs, g, i, p):
    return _ring_of(ALL_GATHER, outs[0], g, i)


# nccl-tests' bus-bandwidth factors (src/*.cu, doc/PERFORMANCE.md), as module functions (a mutation tester
# switches them at call time): a ring pass moves (t-1)/t of the buffer from each member, an all-reduce makes two
# (a reduce-scatter, then an all-gather); an all-to-all or a scatter leaves 1/t where it is; a chain moves it
# whole.


def _two_passes(t: int) -> float:
    return 2 * (t - 1) / t


def _one_pass(t: int) -> float:
    return (t - 1) / t


def _whole_buffer(t: int) -> float:
    return 1.0


OPS: dict[str, Op] = {
    op.name: op
    for op in (
        Op(
            ALL_REDUCE,
            "array",
            _all_reduce,
            _all_reduce_torch,
            _all_reduce_moved,
            ("partial sum", "replicated"),
            "AR",
            "all-reduce",
            "red",
            "ring",
            _two_passes,
            True,
        ),
        Op(
            REDUCE_SCATTER,
            "array",
            _reduce_scatter,
            _reduce_scatter_torch,
            _reduce_scatter_moved,
            ("partial sum", "sharded on dim {dim}"),
            "RS",
            "reduce-scatter",
            "magenta",
            "ring",
            _one_pass,
            True,
        ),
        Op(
            ALL_GATHER,
            "array",
            _all_gather,
            _all_gather_torch,
            _all_gather_moved,
            ("sharded on dim {dim}", "replicated"),
            "AG",
            "all-gather",
            "dodgerblue",
            "ring",
            _one_pass,
        ),
        Op(
            ALL_TO_ALL,
            "chunks",
            _all_to_all,
            _all_to_all_torch,
            _all_to_all_moved,
            ("split on dim {dim} by destination", "split on dim {dim} by source"),
            "A2",
            "all-to-all",
            "yellow",
            "pairs",
            _one_pass,
        ),
        Op(
            BROADCAST,
            "array",
            _broadcast,
            _broadcast_torch,
            lambda ins, outs, g, i, p: broadcast_bytes(ins[0].nbytes, g.size, i, _root(g, p)),
            ("on rank {src}", "replicated"),
            "BC",
            "broadcast",
            "cyan",
            "chain",
            _whole_buffer,
        ),
        Op(
            REDUCE,
            "array",
            _reduce,
            _reduce_torch,
            _reduce_moved,
            ("partial sum", "reduced on rank {dst}"),
            "RD",
            "reduce",
            "orange",
            "chain-back",
            _whole_buffer,
            True,
        ),
        Op(
            SCATTER,
            "array",
            _scatter,
            _scatter_torch,
            _scatter_moved,
            ("whole on rank {src}", "sharded on dim {dim}"),
            "SC",
            "scatter",
            "orchid",
            "from-root",
            _one_pass,
        ),
        Op(
            BARRIER,
            "nothing",
            _barrier,
            _barrier_torch,
            lambda ins, outs, g, i, p: (0, 0),
            ("", ""),
            "BA",
            "barrier",
            "white",
            "none",
            None,
        ),
    )
}


def entry(op: str) -> Op:
    """The op table's entry for `op`: what a backend runs a call by; a name the table lacks is refused in one
    line (a backend asks before the members meet)."""
    found = OPS.get(op) if isinstance(op, str) else None
    if found is None:
        raise CollectiveError(f"no collective {op!r:.60} in the op table (comm/ops.py): {', '.join(OPS)}")
    return found


def bus_factor(op: str, t: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective `op` over t members (its entry's): what the clock's
    measured rates and the estimator's traffic multiply a whole buffer by. An op that moves nothing, or that is
    not in the table, is an error, not a silent 1."""
    factor = OPS[op].bus_factor
    if factor is None:
        raise KeyError(f"{op} moves no data")
    return factor(t)
