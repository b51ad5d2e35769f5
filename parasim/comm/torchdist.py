"""Real ranks: the collective interface on torch.distributed (gloo on CPU, NCCL on GPUs).

The only module that imports torch.distributed. Each process is one rank; `TorchComm` keeps the same
semantics as the virtual backend (functional calls, group order, ring hop by hop) and records, for
this rank only, what the virtual trace records, plus wall-clock times. Before each collective an
optional signature exchange across the group (every parameter `describe` names: op, shapes, dtype, dim,
src, algo; the group is the one the exchange runs on) turns a mismatch into the same error text as on
virtual ranks, and a gloo/NCCL time-out into a clear error naming the call.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..errors import CollectiveError, CollectiveMismatch, Deadlock
from .interface import (
    ALL_REDUCE,
    BFLOAT16,
    P2P,
    REDUCE_SCATTER,
    Comm,
    Group,
    Recv,
    Send,
    SiteMemo,
    by_text,
    call_site,
    check_algo,
    check_peer,
    describe,
    describe_p2p,
    dtype_name,
    group_members,
    mismatch_error,
    p2p_mismatch_error,
    recv_dtype,
    signature,
    site_name,
)
from .kernels import arrays
from .ops import entry as op_entry
from .ring import RingStep, split_phases

SIG_BYTES = 512  # fixed size of one signature blob
_LONG = b"\x01LONG "  # a blob that only announces a longer signature (JSON text never starts with \x01)


def _head(data: bytes) -> bytes:
    """What a signature's first, fixed-size blob holds: the signature, or the LONG marker and its length."""
    return data if len(data) <= SIG_BYTES else _LONG + str(len(data)).encode()


# torch 2.13 renamed the tensor forms; older releases have only the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_END = "END"


def _tensor_meta(x: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(x.shape), dtype_name(x.dtype)


# torch.from_numpy and Tensor.numpy refuse ml_dtypes' bfloat16 (numpy's own dtypes have no bfloat16), so its
# 16 bits cross as int16 and are read back as bfloat16 on the other side: the same bits, not a conversion.
def to_torch(a: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A numpy array (bfloat16 included) as a torch tensor on `device`, bit for bit."""
    if a.dtype == BFLOAT16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


def _torch_dtype(o: Recv, peer: int) -> torch.dtype:
    """The torch dtype a receive allocates, by its numpy name; a name torch has no number type for is refused
    as virtual ranks refuse it."""
    dtype = getattr(torch, recv_dtype(o, peer), None)
    if not isinstance(dtype, torch.dtype):
        raise CollectiveError(f"recv from rank {peer}: bad shape {o.shape!r} or dtype {o.dtype!r}")
    return dtype


def to_numpy(x: torch.Tensor) -> np.ndarray:
    """A torch tensor (bfloat16 included) as a numpy array on the host, bit for bit."""
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy().view(BFLOAT16)
    return x.numpy()


class TorchComm(Comm):
    """One real rank's collective interface and its record of every call."""

    def __init__(
        self,
        rank: int,
        world: int,
        device: torch.device,
        *,
        keep_values: int = 0,
        algo: str = "direct",
        check: bool = True,
        timeout: datetime.timedelta | None = None,
        watch: Any = None,
        wire: torch.device | None = None,
    ):
        check_algo(algo)
        # told when each call starts and ends (rank_errors.Watch): the launcher's watchdog sees the run move,
        # and tells a rank stuck outside any call from one waiting in a call
        self.watch = watch
        self.rank, self.world, self.device = rank, world, device
        # where the backend's buffers live: the program's device, or the host for gloo with CUDA tensors (gloo
        # runs every collective on the CPU; its few CUDA paths do not cover all of them), staged both ways
        self.wire = device if wire is None else wire
        self.keep, self.algo, self.check = keep_values, algo, check
        self.world_group = Group(tuple(range(world)), "world", 0)
        self.groups: list[Group] = [self.world_group]
        self._pgs: list[Any] = [None]  # torch process group of each Group (None: the default group)
        self._ncalls: dict[int, int] = {}
        self._sites = SiteMemo()  # this rank's memo of call sites (sites.call_site)
        self._channels: dict[tuple[int, int], int] = {}
        self.records: list[dict] = []
        self.phase: str | None = None
        self.t_start = time.perf_counter()
        # torch gives a new group its backend's default time-out (30 minutes on gloo), not the run's: a
        # rank waiting in a call on a group nobody else joins would hang that long. Groups get the run's.
        self.pg_timeout = timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """fn(*args, **kw) as one call the launcher's watch sees: in a call until it returns or raises."""
        if self.watch is None:
            return fn(*args, **kw)
        self.watch.enter()
        try:
            return fn(*args, **kw)
        finally:
            self.watch.leave()

    def start(self) -> None:
        """Every rank has loaded the program (its file's top level has run): start it together. The clock of
        this rank's records starts here."""
        self._call(
            self._timed,
            dist.barrier,
            "the start of the program (every rank loads it first)",
            self.world_group,
            "the start of the run",
        )
        self.t_start = time.perf_counter()

    # -- groups --------------------------------------------------------------------------------
    def new_group(self, ranks: Sequence[int], name: str) -> Group:
        return self._call(self._new_group, ranks, name)

    def _new_group(self, ranks: Sequence[int], name: str) -> Group:
        site = site_name(call_site(2, self._sites))
        members = group_members(ranks, self.world, name, site)
        g = Group(members, name, len(self.groups))
        if self.check:  # every rank must create the same groups in the same order
            mine = json.dumps([g.index, name, list(members)])
            blobs = self._gather_blobs(mine + "|" + site, None)
            for r, blob in enumerate(blobs):
                theirs, other_site = blob.rsplit("|", 1)
                if theirs != mine:
                    idx, oname, oranks = json.loads(theirs)
                    raise CollectiveMismatch(
                        f"rank {self.rank} created group #{g.index} as {g} at {site}, but rank {r} created it as "
                        f"{oname}{oranks} at {other_site}; every rank must create every group in the same order",
                        calls=[site, other_site],
                    )
        self._pgs.append(dist.new_group(sorted(members), timeout=self.pg_timeout))
        self.groups.append(g)
        return g

    def _resolve(self, group: Group | None, op: str) -> tuple[Group, Any]:
        if group is None:
            return self.world_group, None
        if not (0 <= group.index < len(self.groups)) or self.groups[group.index] != group:
            raise CollectiveError(f"{op}: group {group} was not created in this run")
        if self.rank not in group.ranks:
            raise CollectiveError(f"{op}: rank {self.rank} is not a member of group {group}")
        return group, self._pgs[group.index]

    # -- the signature exchange ------------------------------------------------------------------
    # A signature travels in one blob of SIG_BYTES; a longer one (a deep path, a long description) sends a
    # LONG marker with its length there, then the whole text in a second message sized to fit.
    def _blob(self, data: bytes, size: int = SIG_BYTES) -> torch.Tensor:
        blob = torch.zeros(size, dtype=torch.uint8, device=self.wire)
        blob[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return blob

    def _gather_blobs(self, text: str, pg: Any) -> list[str]:
        data = text.encode()
        rows = self._gather_rows(_head(data), SIG_BYTES, pg)
        if any(r.startswith(_LONG) for r in rows):  # every member sees the same rows, so all take this turn
            size = max(int(r[len(_LONG) :]) if r.startswith(_LONG) else len(r) for r in rows)
            rows = self._gather_rows(data, size, pg)
        return [r.decode(errors="replace") for r in rows]

    def _gather_rows(self, data: bytes, size: int, pg: Any) -> list[bytes]:
        t = dist.get_world_size(pg)
        out = torch.empty(t * size, dtype=torch.uint8, device=self.wire)
        _all_gather_single(out, self._blob(data, size), group=pg)
        return [bytes(row).rstrip(b"\0") for row in out.cpu().numpy().reshape(t, size)]

    def _p2p_blobs(self, desc: str, site: str) -> list[torch.Tensor]:
        data = json.dumps([desc, site]).encode()
        head = _head(data)
        return [self._blob(head)] + ([self._blob(data, len(data))] if head is not data else [])

    def _recv_p2p_blob(self, peer: int, pg: Any, g: Group, site: str) -> list:
        def take(size: int) -> bytes:
            blob = torch.zeros(size, dtype=torch.uint8, device=self.wire)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, blob, peer, group=pg)])
            self._timed(lambda: [r.wait() for r in reqs], "exchange", g, site)
            return bytes(blob.cpu().numpy()).rstrip(b"\0")

        data = take(SIG_BYTES)
        if data.startswith(_LONG):
            data = take(int(data[len(_LONG) :]))
        return json.loads(data.decode())

    def _check(self, g: Group, pg: Any, call: int, sig: str, desc: str, site: str) -> None:
        """Compare this call with every member's before running it (group order = torch's sorted order)."""
        blobs = self._gather_blobs(json.dumps([call, sig, desc, site]), pg)
        entries = dict(zip(sorted(g.ranks), (json.loads(b) for b in blobs)))
        if all(e[1] == sig and e[0] == call for e in entries.values()):
            return
        if any(e[1] == _END for e in entries.values()):
            waiting = {
                r: "finished" if e[1] == _END else f"waits in {e[2]} on group {g} at {e[3]}" for r, e in entries.items()
            }
            raise Deadlock(
                "every unfinished rank is waiting and none can go on:\n" + "\n".join(by_text(waiting)), waiting
            )
        raise mismatch_error(call, g, {r: f"{e[2]} at {e[3]}" for r, e in entries.items()})

    def finish(self) -> None:
        """Called when the program returns: ranks still waiting in a world collective learn that it never comes.
        From here on this rank is in parasim's own steps (the check, sending its results), not its program."""
        if self.watch is not None:
            self.watch.enter()
        if self.check:
            # a time-out here is a Deadlock like any other: this rank finished and waited for the rest
            self._timed(
                lambda: self._check(self.world_group, None, -1, _END, "finished", ""),
                "the end-of-run check (this rank had finished)",
                self.world_group,
                "the end of the run",
            )

    # -- recording ---------------------------------------------------------------------------------
    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t_start

    def _values(self, xs: Sequence[torch.Tensor]) -> list | None:
        if self.keep and all(x.numel() <= self.keep for x in xs):
            return [x.tolist() for x in xs]
        return None

    def _record(
        self,
        kind: str,
        op: str,
        g: Group,
        params: dict,
        label: str | None,
        ins,
        outs,
        moved,
        site: str,
        t0: float,
        hops: list | None = None,
        **extra: Any,
    ) -> None:
        before, after = self._values(ins), self._values(outs)
        if before is None or after is None:
            before = after = None
        self.records.append(
            {
                "kind": kind,
                "op": op,
                "group": [g.index, g.name, list(g.ranks)],
                "params": params,
                "label": label,
                "phase": self.phase,
                "ins": [_tensor_meta(x) for x in ins],
                "outs": [_tensor_meta(x) for x in outs],
                "sent": int(moved[0]),
                "recv": int(moved[1]),
                "site": site,
                "before": before,
                "after": after,
                "hops": hops,
                "t0": t0,
                "t1": self._now(),
                **extra,
            }
        )

    def mark(self, rank: int, kind: str, text: str, data: dict | None = None) -> None:
        if kind == "phase":
            self.phase = text
        self.records.append({"kind": "mark", "mark": kind, "text": str(text), "data": data, "t0": self._now()})

    def compute(self, rank: int, name: str, flops: float, site: str) -> None:
        now = self._now()
        self.records.append(
            {
                "kind": "compute",
                "op": name,
                "params": {"flops": flops},
                "phase": self.phase,
                "site": site,
                "t0": now,
                "t1": now,
            }
        )

    # -- collectives -------------------------------------------------------------------------------
    def _begin(self, g: Group, pg: Any, sig: str, desc: str, site: str) -> tuple[int, float]:
        call = self._ncalls.get(g.index, 0)
        self._ncalls[g.index] = call + 1
        if self.check:
            self._timed(lambda: self._check(g, pg, call, sig, desc, site), desc, g, site)
        return call, self._now()

    def _timed(self, fn, desc: str, g: Group, site: str):
        """Run fn; a backend time-out becomes an error that names this rank's call."""
        try:
            return fn()
        except RuntimeError as exc:
            if "imed out" in str(exc) or "timeout" in str(exc).lower():
                raise Deadlock(
                    f"rank {self.rank} timed out in {desc} on group {g} at {site}: a member skipped this "
                    f"call, waits in another one, or died ({str(exc).splitlines()[0]})",
                    {self.rank: f"waits in {desc} on group {g} at {site}"},
                ) from exc
            raise

    def _perm(self, g: Group) -> list[int]:
        """Torch orders a group's members ascending; ours keeps the order given. perm[i]: torch index of ours i."""
        order = sorted(g.ranks)
        return [order.index(r) for r in g.ranks]

    # -- the backend hooks of Comm: every collective runs its op table entry's torch call ------------------
    def _check_array(self, x, op):
        if not isinstance(x, torch.Tensor):
            raise CollectiveError(f"{op} expects a torch tensor on real ranks, got {type(x).__name__}")

    def _group(self, group, op):
        return self._resolve(group, op)[0]

    def _collective(self, op, x, params, group, label, site, sig=None):
        return self._call(self._run_collective, op, x, params, group, label, site, sig)

    def _run_collective(self, op, x, params, group, label, site, sig=None):
        entry, site, desc = op_entry(op), site_name(site), describe(op, x, **params)
        pg = self._pgs[group.index]
        sig = sig or signature(op, x, params)
        call, t0 = self._begin(group, pg, repr(sig), desc, site)
        staged = self.wire != self.device
        out, hops, moved = entry.torch(_Call(self, group, pg, desc, site), self._to_wire(x) if staged else x, params)
        if staged:
            out = self._from_wire(out)
        ins, outs = arrays(x), arrays(out)
        if moved is None:
            moved = entry.moved(ins, outs, group, group.group_rank(self.rank), params)
        self._record("collective", op, group, params, label, ins, outs, moved, site, t0, hops, call=call)
        return out

    # -- point-to-point ------------------------------------------------------------------------------
    def exchange(self, ops, *, group=None, label=None, tags=None):
        return self._call(self._exchange, ops, group, label, tags)

    def _exchange(self, ops, group, label, tags):
        site = site_name(call_site(2, self._sites))
        g, pg = self._resolve(group, "exchange")
        posts = []
        for o in ops:
            if isinstance(o, Send):
                self._check_array(o.x, "send")
                posts.append(
                    (
                        True,
                        check_peer(o.dst, self.rank, g, "send to"),
                        o.x.to(self.wire).contiguous(),
                        tuple(o.x.shape),
                        o.x.dtype,
                        o.label or label,
                    )
                )
            elif isinstance(o, Recv):
                peer = check_peer(o.src, self.rank, g, "recv from")
                dtype = _torch_dtype(o, peer)
                shape = tuple(int(n) for n in o.shape)
                posts.append(
                    (False, peer, torch.empty(shape, dtype=dtype, device=self.wire), shape, dtype, o.label or label)
                )
            else:
                raise CollectiveError(f"exchange takes Send and Recv entries, got {type(o).__name__}")
        # Sends never wait for this rank's own receives (a neighbour may need our data before it can send
        # us anything), so every send goes out at once: its signature, then its data. Each receive then
        # takes the signature first, checks it, and posts the data receive, so messages between a pair
        # are taken in exactly the order they were sent, however the two sides batch them.
        sends = []
        for send, peer, buf, shape, dtype, _ in posts:
            if send:
                if self.check:
                    sends += [
                        dist.P2POp(dist.isend, b, peer, group=pg)
                        for b in self._p2p_blobs(describe_p2p(True, peer, shape, dtype), site)
                    ]
                sends.append(dist.P2POp(dist.isend, buf, peer, group=pg))
        t0 = self._now()
        pending = list(dist.batch_isend_irecv(sends)) if sends else []
        for send, peer, buf, shape, dtype, _ in posts:
            if send:
                continue
            if self.check:
                other, other_site = self._recv_p2p_blob(peer, pg, g, site)
                if other != describe_p2p(True, self.rank, shape, dtype):
                    raise p2p_mismatch_error(
                        peer,
                        f"{other} at {other_site}",
                        self.rank,
                        f"{describe_p2p(False, peer, shape, dtype)} at {site}",
                    )
            pending += dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer, group=pg)])
        self._timed(lambda: [r.wait() for r in pending], "exchange", g, site)
        results = []
        for k, (send, peer, buf, _, _, named) in enumerate(posts):
            src, dst = (self.rank, peer) if send else (peer, self.rank)
            chan = self._channels.get((src, dst), 0)
            self._channels[(src, dst)] = chan + 1
            n = _nbytes(buf)
            self._record(
                P2P,
                P2P,
                g,
                {"src": src, "dst": dst},
                named,
                [buf] if send else [],
                [] if send else [buf],
                (n, 0) if send else (0, n),
                site,
                t0,
                role="send" if send else "recv",
                peer=peer,
                chan=chan,
                post=k,
                tags=tags,
            )
            if not send:
                results.append(buf.to(self.device))
        return results

    def _to_wire(self, x: Any) -> Any:
        """A collective's input (a tensor, or all_to_all's chunks) copied to where the backend works."""
        return [c.to(self.wire) for c in x] if isinstance(x, (list, tuple)) else None if x is None else x.to(self.wire)

    def _from_wire(self, out: Any) -> Any:
        """A collective's result back on the program's device."""
        if isinstance(out, (list, tuple)):
            return [None if c is None else c.to(self.device) for c in out]
        return None if out is None else out.to(self.device)

    # -- the ring, hop by hop, over real point-to-point transfers --------------------------------------
    def _ring(self, g: Group, x: torch.Tensor, op: str, kind: str, dim: int = 0):
        """This rank's part of ring collective `kind`: its own row of each of the ring's steps (ring.ring_steps,
        kept by the group)."""
        t, i = g.size, g.group_rank(self.rank)
        if kind == ALL_REDUCE:
            bufs = [c.clone() for c in torch.tensor_split(x.reshape(-1), t)]
        elif kind == REDUCE_SCATTER:
            bufs = [c.clone() for c in torch.chunk(x, t, dim=dim)]
        else:
            bufs = [x.clone() if j == i else torch.empty_like(x) for j in range(t)]
        combine: Any = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum}[op]
        hops: list[dict] = []
        received = 0

        def play(step: RingStep) -> int:
            send, recv = step.send[i], step.recv[i]
            payload = bufs[send].contiguous()
            got = torch.empty_like(bufs[recv].contiguous())
            reqs = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, payload, g.ranks[step.to[i]]),
                    dist.P2POp(dist.irecv, got, g.ranks[step.source[i]]),
                ]
            )
            for r in reqs:
                r.wait()
            bufs[recv] = combine(got, bufs[recv]) if step.reduce else got
            value = payload.tolist() if self.keep and payload.numel() <= self.keep else None
            hops.append(
                {
                    "phase": step.phase,
                    "hop": step.hop,
                    "transfers": [
                        {
                            "src": self.rank,
                            "dst": g.ranks[step.to[i]],
                            "chunk": send,
                            "bytes": _nbytes(payload),
                            "value": value,
                        }
                    ],
                }
            )
            return _nbytes(got)

        reducing, gathering = split_phases(g.ring_steps(kind))
        for step in reducing:
            received += play(step)
        if op == "avg":  # this rank's chunk is finished: divide it before it travels (an all-gather passes "sum")
            bufs[i] = (bufs[i] / t).to(x.dtype)
        for step in gathering:
            received += play(step)
        moved = (sum(tr["bytes"] for h in hops for tr in h["transfers"]), received)
        if kind == REDUCE_SCATTER:
            return bufs[i].contiguous(), hops, moved
        if kind == ALL_REDUCE:
            return torch.cat(bufs).reshape(x.shape), hops, moved
        return torch.cat(bufs, dim=dim).contiguous(), hops, moved


class _Call:
    """What an op's torch call (ops.py) needs for one call: torch, the group, and waits named after the call."""

    __slots__ = ("comm", "g", "pg", "desc", "site", "perm", "me")
    dist, torch = dist, torch
    all_gather_single, reduce_scatter_single = staticmethod(_all_gather_single), staticmethod(_reduce_scatter_single)

    def __init__(self, comm: TorchComm, g: Group, pg: Any, desc: str, site: str):
        self.comm, self.g, self.pg, self.desc, self.site = comm, g, pg, desc, site
        self.perm = comm._perm(g)
        self.me = g.group_rank(comm.rank)

    def run(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        """fn(*args, **kw) on this call's process group; a backend time-out names the call."""
        return self.comm._timed(lambda: fn(*args, group=self.pg, **kw), self.desc, self.g, self.site)

    @staticmethod
    def reduce_op(op: str) -> Any:
        return _REDUCE.get(op, dist.ReduceOp.SUM)  # avg: a sum, divided afterwards

    def ring(self, x: torch.Tensor, op: str, kind: str, dim: int = 0):
        return self.comm._ring(self.g, x, op, kind, dim)


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()
