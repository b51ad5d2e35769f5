"""`parasim trace` in words: one token's path through a training step of the MoE example, and what one GPU
keeps and joins. The command (cli/trace.py) runs the step; these turn what it found into lines."""

from __future__ import annotations

import textwrap
from typing import Any


def path_text(path: dict, name: str, layout: Any, routing: str, symbolic: bool, show_all: bool) -> list[str]:
    """The token's path (examples/moe16_path.token_path), its bytes by link and its check, line by line;
    backward steps summarised unless `show_all`."""
    out: list[str] = []
    split = "zigzag" if layout.zigzag else "contiguous"
    out.append(
        f"{path['token']!r}: t{path['position']} of sequence {path['sequence']}, micro-batch {path['micro_batch']}, "
        f"on the {name} layout ({layout.world} GPUs, CP split {split}, one training step; g<rank> names a GPU)"
    )
    out.append(
        "routing: "
        + (
            "the post's, drawn: contract -> E3 (0.6) and E8 (0.4), the -> E1 and E2; other tokens by the router"
            if routing == "post"
            else "the run's own router (--routing post: the post's drawn choices)"
            if routing == "learned"
            else f"the {routing} policy, seeded, in place of the router (--routing learned: the run's own router)"
        )
    )
    phase, summary = None, {}
    for step in path["steps"]:
        if step["phase"] != phase:
            _flush_summary(summary, out)
            phase = step["phase"]
            out.append(f"\n{phase}")
        if step.get("direction") == "backward" and not show_all and "event" in step:
            key = f"{step['op'].replace('_', '-')} over {step['group']}"
            summary[key] = summary.get(key, 0) + 1
            continue
        out.append(f"  {'#' + str(step['event']) + ' ' if 'event' in step else ''}{step['text']}")
    _flush_summary(summary, out)
    links = path["bytes_by_link"]
    out.append(
        f"\nbytes sent in the step, all GPUs (nodes of {links['gpus_per_node']}): "
        + "; ".join(
            f"{g} {row['inside']:,} inside a node" + (f", {row['across']:,} across nodes" if row["across"] else "")
            for g, row in sorted(links["by_group"].items())
        )
        # why a group over two nodes still sends most of its bytes inside one: the count is per hop
        + "\n(a byte counts on the link of the hop that carries it: a ring over two nodes crosses only on its"
        "\nhops between them, an all-to-all only between GPUs of different nodes)"
    )
    x = path["exactness"]
    if x is None:
        out.append(
            f"\nnot checked against the unsplit model: it routes by its own router, this run by the {routing} "
            "policy" + (" on symbolic ranks (shapes and bytes, no values)" if symbolic else "")
        )
    else:
        out.append(
            f"\nagainst the unsplit model: loss {x['loss']:.12g} vs {x['unsplit_loss']:.12g}; gradients "
            f"{x['gradients']} and weights after Adam {x['weights_after_adam']} agree: "
            + ("exact" if x["exact"] else "NOT EXACT")
        )
    if not show_all:
        out.append("(backward steps summarised; --all lists every event, --json gives them with event numbers)")
    return "\n".join(out).split("\n")


def gpu_text(view: dict, value: dict, name: str, routing: str) -> list[str]:
    """`--gpu N` in words: what the GPU stores, its tokens, its peak, its work and every call it joins."""
    out: list[str] = []
    g, ok = view["gpu"], view["exactness"] is None or view["exactness"]["exact"]
    c, s = value["coords"], value["stores"]
    out.append(f"g{g} on the {name} layout: " + ", ".join(f"{k} rank {v}" for k, v in c.items()))
    # at TP 1 nothing is split over TP: the attention and MLP weights are whole, like the norms
    split = view.get("sizes", {}).get("tp", 2) > 1
    out.append(
        f"  stores: {s['tp shards']:,} values of "
        + ("TP shards (attention, MLP), " if split else "whole weights (attention, MLP: TP 1 splits nothing), ")
        + f"{s['whole copies']:,} of "
        + ("whole copies (norms, router), " if split else "norms and router, ")
        + (
            f"{s['experts']:,} of experts, its MoE layers together ({_experts_once(view['experts_per_layer'])}), "
            if s["experts"]
            else ""
        )
        + f"{s['optimizer']:,} optimizer values (its ZeRO-1 share of master, m, v)"
    )
    out.append(
        f"  tokens: {_spans(s['tokens between matmuls'])} between matmuls, {_spans(s['tokens in attention'])} "
        "inside attention"
    )
    if view["peak"] is not None:
        pk = view["peak"]
        out.append(
            f"  peak held: {pk['bytes'] / 1e9:,.2f} GB in '{pk['phase']}' ("
            + ", ".join(f"{kind} {b / 1e9:,.2f}" for kind, b in pk["by_kind"].items() if b)
            + " GB; training "
            "dtypes: 2-byte weights, gradients and activations, 4-byte optimizer state)"
        )
        if "assumes" in pk:  # a real-size step: the estimator's plan, as `parasim memory` counts it
            from ..estimate.memory import assumption_words, fit_words

            out.append(
                textwrap.fill(
                    "; ".join(assumption_words(pk["assumes"], view["sizes"]["cp"])),
                    100,
                    initial_indent="    assumes: ",
                    subsequent_indent=" " * 13,
                )
            )
            out.append(
                textwrap.fill(
                    fit_words(pk["bytes"], pk["usable"], pk["gpu_model"], pk["card"]),
                    100,
                    initial_indent="    ",
                    subsequent_indent=" " * 6,
                )
            )
            out.append(
                textwrap.fill(
                    f"the estimator says {pk['estimate'] / 1e9:,.2f} GB for this stage: it counts the model's shapes "
                    "(embeddings, every MLP matrix, shared experts, logits), this step only the layers it runs; "
                    "parasim memory --symbolic sets the two side by side, item by item",
                    100,
                    initial_indent="    ",
                    subsequent_indent=" " * 6,
                )
            )
    if "time" in view and view["time"]["step_s"] is None:
        out.append(
            textwrap.fill(
                f"time: not timed on {view['time']['gpu']}: {view['time']['why']}",
                100,
                initial_indent="  ",
                subsequent_indent="    ",
            )
        )
    elif "time" in view:
        from .estimate_text import range_words

        tm = view["time"]
        t, busy, crit = tm["this"], tm["busiest"], tm["critical"]
        out.append(
            textwrap.fill(
                f"time: one step on {tm['gpu']}s takes {tm['step_s']:,.2f} s on the clock (every event timed, no "
                f"overlap; parasim hardware lists the constants)"
                + (f"; {range_words(tm['range'])}" if tm.get("range") else "")
                + f". This GPU computes {t['compute_s']:,.2f} s "
                f"({t['flops']:.4g} FLOPs), communicates {t['comm_s']:,.2f} s and waits {t['idle_s']:,.2f} s; "
                f"the busiest GPU, g{busy['rank']}, computes {busy['compute_s']:,.2f} s. The critical path is "
                f"{crit['compute']:,.2f} s of compute and {crit['comm']:,.2f} s of communication: "
                f"{tm['tokens_per_s_per_gpu']:,.0f} tokens per second per GPU"
                + (f", MFU {tm['mfu']:.0%}." if "mfu" in tm else "."),
                100,
                initial_indent="  ",
                subsequent_indent="    ",
            )
        )
    out.append("  joins:")
    for d in view["does"]:
        out.append(
            f"    {d['calls']:>4} x {d['op'].replace('_', '-')} over {d['group']}: sent {d['sent']:,} B, "
            f"received {d['received']:,} B"
        )
    if view["exactness"] is None:
        out.append(f"not checked against the unsplit model (routing by the {routing} policy)")
    else:
        out.append(f"exact against the unsplit model: {'yes' if ok else 'NO'}")
    return "\n".join(out).split("\n")


def _experts_once(per_layer: list[list[int]]) -> str:
    """The experts a GPU holds, each list once, with the layers it holds it in: under EP every MoE layer of
    a stage holds the same experts ("E5/E6 in each of its 2 MoE layers"); dense layers hold none."""
    lists: dict[tuple[int, ...], int] = {}
    for layer in per_layer:
        if layer:
            lists[tuple(layer)] = lists.get(tuple(layer), 0) + 1
    if not lists:
        return "(none)"
    if len(lists) == 1:
        ((ids, n),) = lists.items()
        return f"{_expert_names(ids)} in " + (f"each of its {n} MoE layers" if n > 1 else "its one MoE layer")
    return ", ".join(f"{_expert_names(ids)} in {n} of its MoE layers" for ids, n in lists.items())


def _expert_names(ids: tuple[int, ...]) -> str:
    """E1-E8 for a run of three or more, E5/E6 otherwise."""
    runs: list[list[int]] = []
    for e in ids:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return "/".join(f"E{a}-E{b}" if b - a >= 2 else "/".join(f"E{x}" for x in range(a, b + 1)) for a, b in runs)


def _spans(tokens: list[int]) -> str:
    """Token numbers as runs: t1-t4096, or t1-t2 t7-t8 for a zigzag slice (a real sequence has thousands)."""
    runs: list[list[int]] = []
    for t in tokens:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return " ".join(f"t{a}" if a == b else f"t{a}-t{b}" for a, b in runs) or "none"


def _flush_summary(summary: dict[str, int], out: list[str]) -> None:
    if summary:
        out.append("  the same path in reverse: " + ", ".join(f"{n} x {k}" for k, n in summary.items()))
        summary.clear()
