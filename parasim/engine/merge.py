"""One trace from the records of real ranks, on the same logical clock as the virtual engine."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..comm.interface import Recv, Send
from ..comm.ops import OPS
from ..comm.trace import Event, Member, Trace
from .virtual import run_virtual


# -- merging the ranks' records into one trace -----------------------------------------------------


def merge(results: list[dict], backend: str) -> tuple[Trace, dict[tuple[int, int], tuple[float, float]]]:
    """One trace from every rank's records, laid out exactly as virtual ranks lay out the same calls.

    The virtual engine replays each rank's recorded calls (same groups, ops, shapes, marks, in the same
    order), so seq and step come from the very scheduler the virtual run used; then every member is
    filled in with what the real rank recorded (bytes, call site, values, ring hops) and its measured time."""
    world = len(results)
    replay = run_virtual(_replayer(results), world)
    own: dict[tuple, dict] = {}  # (kind key) -> the real record
    for res in results:
        r, computes = res["rank"], 0
        for rec in res["records"]:
            if rec["kind"] == "collective":
                own[("c", r, rec["group"][0], rec["call"])] = rec
            elif rec["kind"] == "p2p":
                own[("p", rec["role"], *_key(rec))] = rec
            elif rec["kind"] == "compute":
                own[("k", r, computes)] = rec
                computes += 1
    calls: dict[tuple, int] = {}
    events, times = [], {}
    for e in replay.trace.events:
        recs = []
        for i, m in enumerate(e.members):
            key: tuple  # a rank's calls on one group, one channel's sends or receives, or its compute steps
            if e.kind == "collective":
                key = ("c", m.rank, e.group.index)
            elif e.kind == "p2p":
                key = ("p", "send" if i == 0 else "recv", e.params["src"], e.params["dst"])
            else:
                key = ("k", m.rank)
            n = calls.get(key, 0)
            calls[key] = n + 1
            recs.append(own[(*key, n)])
        members = [
            Member(
                m.rank,
                m.ins,
                m.outs,
                rec["sent"],
                rec["recv"],
                rec["site"],
                _tuple(rec["before"]),
                _tuple(rec["after"]),
            )
            if e.kind != "compute"
            else m._replace(site=rec["site"])
            for m, rec in zip(e.members, recs)
        ]
        for m, rec in zip(e.members, recs):
            times[(e.seq, m.rank)] = (rec["t0"] * 1e6, max(rec["t1"] - rec["t0"], 0.0) * 1e6)
        hops = _merge_hops([rec.get("hops") for rec in recs]) if e.hops is not None else None
        events.append(
            Event(e.seq, e.step, e.kind, e.op, e.group, members, e.label, e.phase, e.params, e.algo, hops, e.tags)
        )
    trace = Trace(world, backend, replay.trace.groups, events, replay.trace.marks, {"backend": backend})
    return trace, times


def _replayer(results: list[dict]):
    """A program that makes, on each rank, the calls the real rank recorded (arrays of zeros, same shapes)."""

    def program(ctx):
        res = results[ctx.rank]
        groups = [None] + [ctx.new_group(ranks, name) for _, name, ranks in res["groups"][1:]]
        recs, i = res["records"], 0
        while i < len(recs):
            rec = recs[i]
            if rec["kind"] == "mark" and rec["mark"] == "held":
                if rec["data"]["bytes"]:
                    ctx.hold(rec["text"], rec["data"]["bytes"], rec["data"]["kind"])
                else:
                    ctx.free(rec["text"])
            elif rec["kind"] == "mark" and rec["mark"] == "tensor":  # where and how it was marked (no values)
                ctx._recorder.mark(ctx.rank, "tensor", rec["text"], rec["data"])
            elif rec["kind"] == "mark":
                (ctx.phase if rec["mark"] == "phase" else ctx.note)(rec["text"], **(rec.get("data") or {}))
            elif rec["kind"] == "compute":
                ctx.compute(rec["op"], rec["params"].get("flops", 0))
            elif rec["kind"] == "p2p":
                batch = [rec]
                while (
                    i + 1 < len(recs) and recs[i + 1]["kind"] == "p2p" and recs[i + 1]["post"] == batch[-1]["post"] + 1
                ):
                    i += 1
                    batch.append(recs[i])
                ops = [  # each transfer under its own label, as the real run named it (a ring's K and V apart)
                    Send(_zeros(b["ins"][0]), b["peer"], label=b.get("label"))
                    if b["role"] == "send"
                    else Recv(b["peer"], tuple(b["outs"][0][0]), b["outs"][0][1], label=b.get("label"))
                    for b in batch
                ]
                ctx.comm.exchange(ops, group=groups[rec["group"][0]], label=rec["label"], tags=rec.get("tags"))
            else:
                _replay_collective(ctx, rec, groups[rec["group"][0]])
            i += 1

    return program


def _replay_collective(ctx, rec: dict, group) -> None:
    """The recorded call again, through the op table: the same op, params, group and label; zeros in."""
    OPS[rec["op"]].replay(ctx.comm, [_zeros(t) for t in rec["ins"]], rec["params"], group, rec["label"])


def _zeros(t) -> np.ndarray:
    shape, dtype = t
    return np.zeros(tuple(shape), dtype=np.dtype(dtype))


def _key(rec: dict) -> tuple[int, int, int]:
    return rec["params"]["src"], rec["params"]["dst"], rec["chan"]


def _merge_hops(per_rank: list[list[dict] | None]) -> list[dict] | None:
    every = [h for h in per_rank if h is not None]
    if len(every) < len(per_rank):  # a rank without its ring hops: no hops for the event
        return None
    merged = []
    for k, hop in enumerate(every[0]):
        merged.append(
            {"phase": hop["phase"], "hop": hop["hop"], "transfers": [t for hops in every for t in hops[k]["transfers"]]}
        )
    return merged


def _tuple(v: Any) -> tuple | None:
    return None if v is None else tuple(v)
