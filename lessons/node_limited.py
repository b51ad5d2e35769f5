"""Node-limited routing at real size: DeepSeek-V3's MoE layer at EP 64 over 8 nodes of 8 GPUs, each token's
8 picks drawn uniformly, once from all 256 experts and once from the experts of 4 of the 8 nodes only (the
groups a token keeps; nn/routing.py's GroupLimit). On symbolic ranks: shapes and bytes, no values.

The run's dispatch sends a token once to every GPU holding one of its picks. The bytes that cross nodes are
read from the trace, hop by hop (comm/hops.py); the checks count them again by hand from the policy's own
draws, and work the expected rows out in closed form. The cap cuts the rows that leave a node only a little
when each GPU is sent its own copy, and much more when a token is sent once per node and passed on inside
it (DeepSeek-V3's dispatch): that count is worked out from the run's picks beside it.

The run is in the post's precision (BF16 rows). The capped layer runs once more at DeepSeek-V3's precision
(layout/precision.py: the dispatch in FP8, the combine in BF16), the post's second claim: the same rows at
half the bytes.
"""
from __future__ import annotations

from math import comb

import numpy as np

import parasim
from parasim.comm.hops import ACROSS, INSIDE, event_transfers, split_by_link
from parasim.layout.precision import precision
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.moe import MoE
from parasim.nn.routing import GroupLimit, Routing

T = 4096  # tokens each GPU routes
D = 7168  # hidden size (DeepSeek-V3's)
E, K = 256, 8  # experts, picks per token
F = 2048  # an expert's width
NODES, PER_NODE = 8, 8  # 8 nodes of 8 GPUs: EP 64, 4 experts a GPU, 32 a node
WORLD = NODES * PER_NODE
KEPT = 4  # nodes (groups) a token may pick from under the cap: DeepSeek-V3's topk_group
CAPS = {"no cap": None, f"at most {KEPT} nodes": GroupLimit(NODES, KEPT)}  # one group of experts per node
CAPPED = f"at most {KEPT} nodes"
FP8 = "deepseek-v3"  # the precision entry whose dispatch is FP8
POLICY = Routing.parse("uniform")  # one policy for every rank, so each sender's draws are made once


def phase(cap: str) -> str:
    return f"uniform routing, {cap}"


def _name(cap: str) -> str:
    return "moe.capped" if CAPS[cap] is not None else "moe.free"


def program(ctx, caps: tuple[str, ...] = tuple(CAPS)):
    group = ctx.new_group(range(WORLD), "ep")
    out = {}
    for cap in caps:
        limit = CAPS[cap]
        ctx.phase(phase(cap), cap=cap)
        tp = ParallelContext(ctx, None, ep_group=group, options=LayerOptions(routing=POLICY))
        draw, name = ctx.shared_rng, _name(cap)
        # weights and tokens in the run's float (its precision's: BF16 at the post's)
        experts = [{"w1": draw(f"{name}.{e}.w1").normal((D, F)), "w2": draw(f"{name}.{e}.w2").normal((F, D))}
                   for e in range(E)]
        moe = MoE(tp, group, draw(f"{name}.router").normal((D, E)), experts, K, name=name, limit=limit)
        moe.forward(ctx.shared_rng(f"tokens{ctx.rank}").normal((T, D)), Saved())
        picks = moe.last_picks
        reach = np.zeros((T, NODES), dtype=bool)  # the nodes each token's picks lie on, its own included
        reach[np.arange(T)[:, None], picks // (E // NODES)] = True
        away = int(reach.sum() - reach[:, ctx.rank // PER_NODE].sum())
        out[cap] = {"most nodes": int(reach.sum(axis=1).max()), "other nodes": away}
        ctx.note(f"its {T:,} tokens' picks lie on {away:,} (token, other node) pairs", other_nodes=away)
    return out


def dispatch_bytes(trace, cap: str) -> dict[str, list[int]]:
    """Each GPU's dispatch bytes inside its node and across nodes, read from the trace hop by hop."""
    (event,) = [e for e in trace.events if e.op == "all_to_all" and e.phase == phase(cap) and "dispatch" in e.label]
    transfers = event_transfers(event)
    out = {INSIDE: [0] * WORLD, ACROSS: [0] * WORLD}
    for src in range(WORLD):
        mine = split_by_link([t for t in transfers if t[0] == src], PER_NODE)
        out[INSIDE][src], out[ACROSS][src] = mine[INSIDE], mine[ACROSS]
    return out


def _capped_only(ctx):
    return program(ctx, (CAPPED,))


def dispatch_sent(trace, cap: str) -> list[int]:
    """Each GPU's dispatch bytes, as the trace records them."""
    (event,) = [e for e in trace.events if e.op == "all_to_all" and e.phase == phase(cap) and "dispatch" in e.label]
    return [m.sent for m in sorted(event.members, key=lambda m: m.rank)]


def study(result) -> dict:
    out = {cap: {**dispatch_bytes(result.trace, cap), "other nodes": [v[cap]["other nodes"] for v in result.values],
                 "most nodes": max(v[cap]["most nodes"] for v in result.values)} for cap in CAPS}
    # the capped layer once more at DeepSeek-V3's precision: its dispatch in FP8
    fp8 = parasim.run(_capped_only, WORLD, backend="symbolic", precision=FP8)
    out["bytes"] = precision((result.trace.meta.get("precision") or {}).get("name")).bytes("dispatch")
    out["fp8"] = {"sent": dispatch_sent(fp8.trace, CAPPED), "across": dispatch_bytes(fp8.trace, CAPPED)[ACROSS],
                  "bytes": precision(FP8).bytes("dispatch"), "dtype": precision(FP8).short("dispatch")}
    return out


def tables(result, s) -> list[Table]:
    rows = []
    for cap in CAPS:
        across, inside = s[cap][ACROSS], s[cap][INSIDE]
        once = [n * D * s["bytes"] for n in s[cap]["other nodes"]]
        rows.append((phase(cap), [round(float(np.mean(across)) / 1e6, 1), round(min(across) / 1e6, 1),
                                  round(max(across) / 1e6, 1), round(sum(across) / 1e9, 2),
                                  round(float(np.mean(inside)) / 1e6, 1),
                                  round(float(np.mean(s[cap]["other nodes"])) / T, 2),
                                  round(float(np.mean(once)) / 1e6, 1)]))
    free, capped = (s[cap] for cap in CAPS)
    per_gpu = [(f"g{g}", [round(free[ACROSS][g] / 1e6, 1), round(capped[ACROSS][g] / 1e6, 1),
                          f"{1 - capped[ACROSS][g] / free[ACROSS][g]:.1%}"]) for g in range(PER_NODE)]
    title = (f"DeepSeek-V3's MoE layer ({E} experts of width {F:,}, top {K}, d = {D:,}) at EP {WORLD} over {NODES} "
             f"nodes of {PER_NODE} GPUs, {T:,} tokens per GPU: one dispatch's bytes (MB = 1e6 bytes)")
    return [
        Table(title, ["routing", "across nodes, per GPU (MB)", "fewest (MB)", "most (MB)",
                      f"across nodes, all {WORLD} GPUs (GB)", "inside the node, per GPU (MB)",
                      "other nodes a token reaches", "once per node instead (MB per GPU)"], rows,
              notes=[f"across and inside: the dispatch's bytes on each link, read from the trace hop by hop. A row is "
                     f"a token's {D:,} values and the gates of the receiving GPU's {E // WORLD} experts, at {s['bytes']} "
                     "bytes each (BF16), sent once to every GPU that holds one of its picks.",
                     "once per node instead: a token sent once to each other node its picks lie on and passed on "
                     "inside that node (as DeepSeek-V3's dispatch does), its values only, counted from the run's "
                     f"picks. There the cap bounds what crosses at {KEPT} nodes a token, and saves far more than "
                     "when every GPU is sent its own copy."]),
        Table(f"Node 0's GPUs: bytes each sends across nodes, without and with the {KEPT}-node cap",
              ["GPU", "no cap (MB)", f"at most {KEPT} nodes (MB)", "saved"], per_gpu,
              notes=[f"{sum(c < f for c, f in zip(capped[ACROSS], free[ACROSS]))} of the {WORLD} GPUs send fewer bytes "
                     "across nodes with the cap"]),
        Table(f"The capped dispatch in BF16 and in {s['fp8']['dtype']} (DeepSeek-V3's precision: the dispatch in "
              f"{s['fp8']['dtype']}, the combine in BF16), per GPU (MB)",
              ["dispatch", "sent, per GPU (MB)", "across nodes, per GPU (MB)", f"across nodes, all {WORLD} GPUs (GB)"],
              [(f"BF16, {s['bytes']} bytes a value", [round(float(np.mean(dispatch_sent(result.trace, CAPPED))) / 1e6, 1),
                                                       round(float(np.mean(capped[ACROSS])) / 1e6, 1),
                                                       round(sum(capped[ACROSS]) / 1e9, 2)]),
               (f"{s['fp8']['dtype']}, {s['fp8']['bytes']} byte a value",
                [round(float(np.mean(s['fp8']['sent'])) / 1e6, 1), round(float(np.mean(s['fp8']['across'])) / 1e6, 1),
                 round(sum(s['fp8']['across']) / 1e9, 2)])],
              notes=["the same rows to the same GPUs (the same draws): only the bytes of a value change. parasim "
                     "sends a token's values and its gates as one row, so both go in FP8; the per-block scale "
                     "factors an FP8 recipe sends beside the values (one FP32 number per 128 values in DeepSeek-V3's, "
                     "about 3% more) are not modelled."]),
    ]


def by_hand(cap: str) -> dict[str, list[int]]:
    """From the policy's own draws: for each GPU, the rows its dispatch sends to GPUs on other nodes (a token
    once per such GPU holding one of its picks) and its (token, other node) pairs."""
    rows, pairs = [], []
    for g in range(WORLD):
        picks = POLICY.choose(f"{_name(cap)}#0", g, g * T, T, E, K, CAPS[cap])
        home = g // PER_NODE
        away_gpu = np.zeros((T, WORLD), dtype=bool)
        away_gpu[np.arange(T)[:, None], picks // (E // WORLD)] = True
        away_gpu[:, home * PER_NODE:(home + 1) * PER_NODE] = False
        away_node = np.zeros((T, NODES), dtype=bool)
        away_node[np.arange(T)[:, None], picks // (E // NODES)] = True
        away_node[:, home] = False
        rows.append(int(away_gpu.sum()))
        pairs.append(int(away_node.sum()))
    return {"rows": rows, "pairs": pairs}


def checks(result, s) -> list[Check]:
    free, capped = (s[cap] for cap in CAPS)
    hand = {cap: by_hand(cap) for cap in CAPS}
    row_bytes = (D + E // WORLD) * s["bytes"]  # a token's values and the receiving GPU's gates
    # closed forms, per token: a GPU (a node) on another node is reached unless none of its experts is among
    # the K picks; under the cap only when its node is among the KEPT of NODES kept, and then the K picks come
    # from the `allowed` experts of the nodes kept, not from all E
    per_gpu, node, away_gpus = E // WORLD, E // NODES, WORLD - PER_NODE
    allowed = KEPT * E // NODES
    free_rows = away_gpus * (1 - comb(E - per_gpu, K) / comb(E, K))
    capped_rows = away_gpus * KEPT / NODES * (1 - comb(allowed - per_gpu, K) / comb(allowed, K))
    free_nodes = (NODES - 1) * (1 - comb(E - node, K) / comb(E, K))
    capped_nodes = (NODES - 1) * KEPT / NODES * (1 - comb(allowed - node, K) / comb(allowed, K))
    mean_rows = {cap: float(np.mean(hand[cap]["rows"])) / T for cap in CAPS}
    mean_pairs = {cap: float(np.mean(hand[cap]["pairs"])) / T for cap in CAPS}
    saved_gpu = 1 - sum(capped[ACROSS]) / sum(free[ACROSS])
    saved_node = 1 - sum(capped["other nodes"]) / sum(free["other nodes"])
    return [
        *[check(f"{phase(cap)}: each GPU's dispatch bytes across nodes, from the trace, against rows to GPUs on "
                f"other nodes (from the policy's draws, by hand) x (d = {D:,} values + {E // WORLD} gates) x "
                f"{s['bytes']} bytes (BF16)", s[cap][ACROSS], [r * row_bytes for r in hand[cap]["rows"]]) for cap in CAPS],
        check(f"the capped dispatch at DeepSeek-V3's precision: each GPU's bytes across nodes are its rows to other "
              f"nodes (by hand) x (d + gates) x {s['fp8']['bytes']} byte ({s['fp8']['dtype']})", s["fp8"]["across"],
              [r * (D + E // WORLD) * s["fp8"]["bytes"] for r in hand[CAPPED]["rows"]]),
        check(f"... half the BF16 dispatch's, GPU by GPU: what each sent in {s['fp8']['dtype']} x 2 is what it sent "
              "in BF16", [2 * n for n in s["fp8"]["sent"]], dispatch_sent(result.trace, CAPPED)),
        check(f"with the cap every GPU sends strictly fewer bytes across nodes: how many of the {WORLD} do",
              sum(c < f for c, f in zip(capped[ACROSS], free[ACROSS])), WORLD),
        check("... and so do all of them together", sum(capped[ACROSS]) < sum(free[ACROSS]), True),
        check(f"the most nodes any token's picks lie on, its own counted, with the cap: {KEPT} (its bound, met)",
              capped["most nodes"], KEPT),
        check(f"... while without it some token's picks lie on more (the most: {free['most nodes']})",
              free["most nodes"] > KEPT, True),
        check(f"rows to GPUs on other nodes per token, in expectation: {away_gpus} x (1 - C({E - per_gpu},{K})/"
              f"C({E},{K})) = {free_rows:.3f} without the cap, {away_gpus} x {KEPT}/{NODES} x "
              f"(1 - C({allowed - per_gpu},{K})/C({allowed},{K})) = {capped_rows:.3f} with it (the draws' mean, "
              "within 1%)",
              [mean_rows[cap] for cap in CAPS], [free_rows, capped_rows], rtol=0.01),
        check("(token, other node) pairs from the run's picks, against the policy's draws by hand",
              [s[cap]["other nodes"] for cap in CAPS], [hand[cap]["pairs"] for cap in CAPS]),
        check(f"... per token in expectation: {NODES - 1} x (1 - C({E - node},{K})/C({E},{K})) = {free_nodes:.3f} "
              f"without the cap, {NODES - 1} x {KEPT}/{NODES} x (1 - C({allowed - node},{K})/C({allowed},{K})) = "
              f"{capped_nodes:.3f} with it (within 1%)",
              [mean_pairs[cap] for cap in CAPS], [free_nodes, capped_nodes], rtol=0.01),
        check(f"the share of the bytes across nodes the cap saves: {saved_gpu:.1%} when every GPU is sent its own "
              f"copy, {saved_node:.1%} when a token is sent once per node, against the closed forms above",
              [saved_gpu, saved_node], [1 - capped_rows / free_rows, 1 - capped_nodes / free_nodes], atol=0.005),
        check("every byte the dispatch sends is on one link: inside plus across is what each GPU sent",
              [[i + a for i, a in zip(s[cap][INSIDE], s[cap][ACROSS])] for cap in CAPS],
              [[m.sent for m in sorted(e.members, key=lambda m: m.rank)] for cap in CAPS
               for e in result.trace.events if e.op == "all_to_all" and e.phase == phase(cap)
               and "dispatch" in e.label]),
    ]


NARRATIVE = {
    phase("no cap"): f"""
        {E} experts over {WORLD} GPUs on {NODES} nodes: {E // WORLD} experts a GPU, {E // NODES} a node. Each
        GPU routes {T:,} tokens, {K} uniform picks each from all {E} experts. Most picks lie on other nodes, and
        the dispatch sends a token once to every GPU that holds one of its picks.""",
    phase(f"at most {KEPT} nodes"): f"""
        The same layer under DeepSeek-V3's cap: each token first keeps {KEPT} of the {NODES} nodes (drawn here;
        a router keeps the {KEPT} whose two best experts score highest) and then picks its {K} experts among
        their {KEPT * E // NODES} only. About half of the other nodes are out of its reach, but its picks crowd
        onto the nodes it kept, and it still reaches nearly as many GPUs there: copies sent GPU by GPU shrink
        only a little. Sent once per node and handed on inside it, a token crosses to at most {KEPT} nodes,
        and that is where the cap pays. The last table runs this capped layer again with the dispatch in FP8,
        one byte a value instead of BF16's two: the same rows to the same GPUs, half the bytes. The combine
        that brings the expert outputs home stays in BF16.""",
}

LESSON = Lesson(
    no_picture='its figures are bytes across nodes under two policies, read best side by side in its table',
    name="node-limited", title="Node-limited routing: DeepSeek-V3's 4-node cap at EP 64 over 8 nodes, the bytes "
                               "that cross nodes",
    section="Expert parallelism: DeepSeek-V3 caps the nodes a token's experts lie on (symbolic ranks)",
    order=200,
    world=WORLD, worlds=(WORLD,), program=program, narrative=NARRATIVE, checks=checks, tables=tables, study=study,
    backend="symbolic",
    summary="DeepSeek-V3's MoE layer at EP 64 over 8 nodes, uniform routing without and with a 4-node cap per "
            "token: the dispatch's bytes across nodes per GPU and in all, what a once-per-node dispatch saves, and "
            "the capped dispatch in FP8 against BF16",
)
