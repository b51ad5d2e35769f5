"""Where the watched token went in a run of the moe16 example, read from the run's own trace: the notes its
holders left (examples/watch.py) and every event they took part in while working on its micro-batch, in
order; then the gradient sums they joined. `parasim trace` prints it."""

from __future__ import annotations

from typing import Any

from .moe16 import LAYOUT, REPLICAS, words_of
from ..comm.trace import Trace


def token_path(trace: Trace, watch: tuple[str, int], reps: Any = REPLICAS, layout: str = LAYOUT) -> dict:
    """Where the watched token went, from the run's own trace: the notes its holders left and every event
    they took part in while working on its micro-batch, in order; then the gradient sums they joined."""
    seq, pos = watch
    mb = next(i for rep in reps for i, s in enumerate(rep) if s == seq) + 1
    notes = trace.notes("watch")  # (phase, rank, text, data) left by the ranks holding the token
    # each phase's fields: which direction, micro-batch and layer it is (read, never parsed from its name)
    fields = {m.text: m.data for m in trace.marks if m.kind == "phase" and m.data}
    at = {(d["direction"], d["micro_batch"], d["layer"]): name for name, d in fields.items()}
    holders = {fields[ph]["layer"]: r for ph, r, _, _ in notes if ph in fields}  # layer -> holder (forward)
    steps: list[dict] = [
        {"phase": "data", "ranks": [r], "text": f"g{r}: {t}"} for ph, r, t, d in notes if d["watch"] == "holds"
    ]
    layers = sorted({d["layer"] for _, _, _, d in notes if d["watch"] in ("route", "layer")})
    for direction, order in (("forward", layers), ("backward", layers[::-1])):
        for layer in order:
            phase, rank = at[(direction, mb, layer)], holders.get(layer)
            said = [
                {"phase": phase, "direction": direction, "ranks": [r], "text": f"g{r}: {t}"}
                for ph, r, t, _ in notes
                if ph == phase
            ]
            for e in trace.events:
                if e.phase == phase and rank in e.ranks and e.kind != "compute":
                    if e.op == "all_to_all" and said:  # the routing, just before the dispatch it decides
                        steps += said
                        said = []
                    steps.append(
                        {
                            "phase": phase,
                            "direction": direction,
                            "ranks": e.ranks,
                            "event": e.seq,
                            "op": e.op,
                            "group": e.group.name,
                            "text": _say(e, rank),
                        }
                    )
            steps += said
    final = set(holders.values())
    for e in trace.events:  # ZeRO-1: the holders' gradient sums and weight gathers
        if e.phase == "gradient sync" and final & set(e.ranks):
            rank = min(final & set(e.ranks))
            steps.append(
                {
                    "phase": "gradient sync",
                    "ranks": e.ranks,
                    "event": e.seq,
                    "op": e.op,
                    "group": e.group.name,
                    "text": _say(e, rank),
                }
            )
    return {
        "token": words_of(seq)[pos],
        "sequence": seq,
        "position": pos + 1,
        "micro_batch": mb,
        "layout": layout,
        "steps": steps,
    }


def _say(e: Any, rank: int) -> str:
    """One line for an event the token's holder took part in."""
    if e.kind == "p2p":
        src, dst = e.params["src"], e.params["dst"]
        way = f"g{src} -> g{dst}"
    else:
        way = f"{e.op.replace('_', '-')} over {e.group.name} " + "{" + ", ".join(f"g{r}" for r in e.ranks) + "}"
    m = e.member(rank)
    return f"{way}: {e.label or e.op}  (g{rank} sent {m.sent:,} B, received {m.recv:,} B)"


def token_figures(trace: Trace) -> dict:
    """Where the followed token lives and which experts take it, per layer, from the notes its holders left:
    the figures `parasim compare` sets side by side (moe16 at two routings, or two layouts)."""
    notes = trace.notes("watch")
    out: dict = {
        "GPUs holding the token, a stage each": " ".join(f"g{r}" for _, r, _, d in notes if d["watch"] == "holds")
    }
    routes = [(r, d) for _, r, _, d in notes if d["watch"] == "route"]
    for r, d in routes:
        out[f"layer {d['layer']}: its experts (on GPU)"] = ", ".join(
            f"E{e} (g{g})" for e, g in zip(d["experts"], d["gpus"])
        )
    out["copies the dispatch sends off the token's GPU, all layers"] = sum(
        g != r for r, d in routes for g in set(d["gpus"])
    )
    return out
