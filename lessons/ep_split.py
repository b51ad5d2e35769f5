"""Expert parallelism on its own: one MoE layer of DeepSeek-V3's breadth (256 experts, top 8) split over 8
GPUs, 32 experts each, run step by step: route, dispatch, compute, combine, then backward. A few tokens a
GPU, at a small hidden size, with real float64 values; one token is followed to the four GPUs its eight
experts live on and back. The layer's output and gradients are checked against one device running every
expert, and the bytes EP moves are set beside what ZeRO-3 would move gathering the experts instead."""

from __future__ import annotations


import numpy as np

from parasim.engine import run
from parasim.examples import ep_vs_zero3 as ratios
from parasim.lesson import Check, Lesson, Table, check
from parasim.nn import ParallelContext, Saved
from parasim.nn.moe import MoE

H, F = 16, 8  # hidden size, an expert's width: small, so the layer runs in a blink
E, K = 256, 8  # DeepSeek-V3's routed experts per layer and picks per token
EP = 8  # GPUs, one EP group
T = 4  # tokens a GPU
B = 8  # bytes a value (float64)
WATCH = (1, 1)  # the followed token: g1's second (its eight experts land on four GPUs, two on each)
PHASES = ("route", "dispatch", "compute", "combine", "backward")


def weights(ctx) -> dict:
    """The layer's weights and every GPU's tokens, the same on every rank (and on one device)."""
    d = ctx.shared_rng
    return {
        "router": d("router").normal((H, E), std=H**-0.5),
        "experts": [
            {"w1": d(f"e{e}.w1").normal((H, F), std=H**-0.5), "w2": d(f"e{e}.w2").normal((F, H), std=F**-0.5)}
            for e in range(E)
        ],
        "x": [d(f"tokens.g{r}").normal((T, H)) for r in range(EP)],
        "dy": [d(f"dy.g{r}").normal((T, H)) for r in range(EP)],  # the output's gradient, as a loss would give it
    }


def _name(rank: int, i: int) -> str:
    return f"t{i + 1} of g{rank}"


def _probe(ctx, key: str, g) -> float:
    """One number of a gradient (its dot with a fixed random array of its shape): linear, so a sum over GPUs
    of the router's partial gradients is the whole gradient's."""
    return float(ctx.xp.sum(g * ctx.shared_rng(f"probe.{key}").normal(g.shape)))


def program(ctx):
    w, r = weights(ctx), ctx.rank
    group = ctx.new_group(range(ctx.world), "ep")
    moe = MoE(ParallelContext(ctx, None, ep_group=group), group, w["router"], w["experts"], K, name="moe")
    x, saved, per = w["x"][r], Saved(), moe.per
    watched = WATCH[1] if r == WATCH[0] else None

    ctx.phase("route")
    routed = moe.gate.forward(x, saved, moe.dispatcher.me * T)
    picks = [[int(e) for e in row] for row in routed.chosen]
    gates = [[float(g) for g in row] for row in routed.gates.tolist()]
    spans = [len({e // per for e in row}) for row in picks]
    ctx.note(
        f"holds experts E{moe.first + 1}-E{moe.first + per}; routes its {T} tokens, each to {K} experts on "
        f"{', '.join(map(str, spans))} GPUs",
        spans=spans,
    )

    ctx.phase("dispatch")
    recv, plan, rows, sizes = moe.dispatcher.dispatch(routed)
    sent_to = [[d for d in range(EP) if i in rows[d]] for i in range(T)]
    if watched is not None:
        mine = sorted(zip(picks[watched], gates[watched]), key=lambda p: p[0])
        ctx.note(
            f"{_name(r, watched)} picks "
            + ", ".join(f"E{e + 1} (g{e // per})" for e, _ in mine)
            + f": sent once to each of {', '.join(f'g{d}' for d in sent_to[watched])}",
            token=_name(r, watched),
            experts=[e + 1 for e, _ in mine],
            gpus=sent_to[watched],
        )

    ctx.phase("compute")
    xs, ws = recv[:, :H], recv[:, H:]
    out, caches = moe.local_experts.forward(xs, ws, None, saved)
    pairs = sum(0 if c is None else len(c[0]) for c in caches)
    ctx.note(
        f"received {xs.shape[0]} token rows; its experts ran {pairs} (token, expert) pairs",
        rows=xs.shape[0],
        pairs=pairs,
    )

    ctx.phase("combine")
    y = moe.dispatcher.combine(out, plan, rows, sizes, x)

    ctx.phase("backward")
    cache = ((T, H), routed, plan, sizes, [xs.shape[0]], xs, ws, caches)
    dx = moe.backward(cache, w["dy"][r])
    return {
        "y": y,
        "dx": dx,
        "picks": picks,
        "gates": gates,
        "sent_to": sent_to,
        "first": moe.first,
        "per": per,
        "received": int(xs.shape[0]),
        "pairs": pairs,
        "grads": {k: _probe(ctx, k, g) for k, g in moe.grads.items()},
        "expert_params": sum(int(np.prod(a.shape)) for e in moe.experts for a in e.values()),
    }


def unsplit(ctx) -> dict:
    """The same layer on one device: every expert, every GPU's tokens at once, no all-to-all."""
    w = weights(ctx)
    moe = MoE(ParallelContext(ctx, None), None, w["router"], w["experts"], K, name="moe")
    y, cache = moe.forward(ctx.xp.concat(w["x"], axis=0), Saved())
    dx = moe.backward(cache, ctx.xp.concat(w["dy"], axis=0))
    return {"y": y, "dx": dx, "grads": {k: _probe(ctx, k, g) for k, g in moe.grads.items()}}


def numpy_forward(w: dict) -> np.ndarray:
    """The layer's output written out in numpy, token by token: top 8 of the router's scores, a softmax over
    those 8, each chosen expert's MLP (tanh GeLU) weighted by its gate."""
    out = []
    for x in np.concatenate([np.asarray(a) for a in w["x"]]):
        s = x @ np.asarray(w["router"])
        top = np.argsort(-s, kind="stable")[:K]
        g = np.exp(s[top] - s[top].max())
        g /= g.sum()
        y = np.zeros(H)
        for gate, e in zip(g, top):
            h = x @ np.asarray(w["experts"][e]["w1"])
            a = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
            y += gate * (a @ np.asarray(w["experts"][e]["w2"]))
        out.append(y)
    return np.asarray(out)


def _sent(result, phase: str) -> dict[int, int]:
    """Bytes each GPU sent in a phase's all-to-alls."""
    out = {r: 0 for r in range(result.world)}
    for e in result.trace.events:
        if e.op == "all_to_all" and e.phase == phase:
            for m in e.members:
                out[m.rank] += m.sent
    return out


def _rows(result) -> list[list[int]]:
    """[from][to]: token rows each GPU handed the dispatch for each GPU, read from the trace."""
    (e,) = [e for e in result.trace.events if e.op == "all_to_all" and e.phase == "dispatch"]
    return [[c.shape[0] for c in e.member(r).ins] for r in range(result.world)]


def followed(result) -> dict:
    """The followed token's picks, gates and the GPUs the dispatch sent it to, from its GPU's values."""
    r, i = WATCH
    v = result.values[r]
    order = np.argsort(v["picks"][i], kind="stable")
    return {
        "home": r,
        "experts": [v["picks"][i][j] for j in order],
        "gates": [v["gates"][i][j] for j in order],
        "sent_to": v["sent_to"][i],
    }


def zero3_bytes(per_gpu_experts: int, world: int) -> int:
    """ZeRO-3's all-gather of the layer's expert weights (two h x f matrices each): every GPU sends its share
    to the world - 1 others (a ring), in all world x (world - 1) shares."""
    return world * (world - 1) * per_gpu_experts * 2 * H * F * B



def ep_vs_zero3(rows: float | None = None) -> dict:
    """This lesson's ZeRO-3-over-EP ratio in the shared formula: a GPU's share of the gather, the (EP - 1)/EP of
    the experts the others lack, against `rows` rows a token (the run's; else the average of random picks, which
    a router of random weights makes)."""
    rows = ratios.uniform_rows(E, EP, K) if rows is None else rows
    return ratios.parts(share=(EP - 1) / EP, experts=E, ep=EP, hidden=H, width=F, tokens=T, rows=rows)


def tables(result) -> list[Table]:
    v, f = result.values, followed(result)
    per = v[0]["per"]
    held = [
        (
            f"g{r}",
            [
                f"E{x['first'] + 1}-E{x['first'] + x['per']}",
                x["per"],
                x["received"],
                x["pairs"],
                _sent(result, "dispatch")[r],
            ],
        )
        for r, x in enumerate(v)
    ]
    row_bytes = (H + per) * B
    where = []
    for g in f["sent_to"]:
        mine = [(e, gate) for e, gate in zip(f["experts"], f["gates"]) if e // per == g]
        where.append(
            (
                f"g{g}",
                [
                    " ".join(f"E{e + 1}" for e, _ in mine),
                    " ".join(f"{gate:.3f}" for _, gate in mine),
                    1,
                    row_bytes,
                    H * B,
                ],
            )
        )
    fwd = sum(_sent(result, "dispatch").values()) + sum(_sent(result, "combine").values())
    bwd = sum(_sent(result, "backward").values())
    z = zero3_bytes(per, result.world)
    mine = ep_vs_zero3(fwd / (result.world * T * (2 * H + per) * B))  # the run's rows a token, out and back
    mirror = [
        ("EP: dispatch + combine (the run)", [fwd, "the tokens' rows, to their experts and back"]),
        ("EP: the same two, backward (the run)", [bwd, "gradients along the same rows"]),
        ("ZeRO-3: gather every expert to every GPU", [z, f"{EP} x {EP - 1} shares of {per} experts x 2hf"]),
        ("ZeRO-3: gather again, then reduce-scatter", [2 * z, "backward: weights again, gradients back"]),
    ]
    return [
        Table(
            f"The layer's {E} experts over {EP} GPUs, and what each GPU's dispatch did",
            ["GPU", "experts held", "count", "rows received", "(token, expert) pairs", "dispatch bytes sent"],
            held,
            notes=[
                "rows received: one per token that picked at least one of the GPU's experts, counted once "
                "however many of them it picked; pairs: the expert MLP runs those rows made."
            ],
        ),
        Table(
            f"Where {_name(*WATCH)} goes: its {K} experts on {len(f['sent_to'])} GPUs",
            ["GPU", "its experts there", "their gates", "rows sent", "bytes out", "bytes back"],
            where,
            notes=[
                f"a row out is the token's h = {H} values plus the gates of the {per} experts on that GPU "
                f"(zero where not picked): ({H} + {per}) x {B} bytes; the combine brings back h values, "
                "the gate-weighted sum of that GPU's experts' outputs."
            ],
        ),
        Table(
            f"Mirror images, one step of this layer, all {EP} GPUs (bytes, float64)",
            ["what moves", "bytes", "what it is"],
            mirror,
            notes=[
                f"EP moves {EP * T} tokens to the weights; ZeRO-3 would move the weights to the tokens: "
                f"{z / fwd:.0f}x the bytes forward here, and the gap grows with the width of an expert "
                "(at-scale and all-to-all-hidden count it at DeepSeek-V3's real size; the table below sets the "
                "three ratios side by side)."
            ],
        ),
        formula_table(result),
        ratios.ratio_table("ep-split", mine, "the experts the others lack", "its router's picks, this run's"),
    ]


def tp_bytes(t: int = EP) -> int:
    """Bytes one GPU sends for TP's two forward all-reduces (attention's and the MLP's) of this lesson's T x h
    activations over t GPUs, from a run of just those two (the post's comparison; this lesson runs no TP)."""

    def two(ctx):
        x = ctx.shared_rng("activations").normal((T, H))
        for _ in range(2):
            ctx.comm.all_reduce(x)

    return sum(m.sent for e in run(two, t).trace.events if e.kind == "collective" for m in e.members if m.rank == 0)


def formula_table(result) -> Table:
    """The post's formulas of 'the numbers' at this lesson's size, beside the run's: expert weights a GPU holds;
    the all-to-alls' bytes forward against TP's all-reduces; and why the run's all-to-all differs (rows merge,
    gates ride along)."""
    v, world = result.values, result.world
    per, p_e = v[0]["per"], 2 * H * F
    fwd = [_sent(result, "dispatch")[r] + _sent(result, "combine")[r] for r in range(world)]
    mean = sum(fwd) / world
    rows_out = sum(_sent(result, "combine").values()) // (H * B)  # rows that crossed (each comes back as h values)
    gate_bytes = rows_out * per * B
    dispatch = sum(_sent(result, "dispatch").values())
    r = rows_out / (world * T)
    held = sorted({x["expert_params"] for x in v})
    rows = [
        ("expert weights a GPU holds (values)", ["E x P_e/(EP x ETP x PP)", E * p_e // (EP * 1 * 1),
                                                 held[0] if len(held) == 1 else held]),
        ("all-to-alls forward (bytes, a GPU, mean)", ["2 x T x K x d x b x (EP-1)/EP",
                                                                   round(2 * T * K * H * B * (EP - 1) / EP), mean]),
        (f"TP all-reduces instead, t = {EP} (bytes)", ["2 x T x d x b x 2(t-1)/t",
                                                                 round(2 * T * H * B * 2 * (EP - 1) / EP), tp_bytes()]),
    ]
    return Table(
        f"The post's EP numbers at this lesson's size: E = {E}, P_e = 2 x d x f = {p_e}, EP = {EP}, ETP = PP = 1, "
        f"T = {T} tokens a GPU, K = {K}, d = {H}, b = {B} (float64)",
        ["figure", "the post's formula", "at this size", "the run"],
        rows,
        notes=[
            f"post / run / why: the post counts K = {K} copies a token, (EP - 1)/EP of them leaving, d values "
            f"each way; the run sends a token once to each other GPU holding one of its picks, r = {r:.2f} rows "
            f"a token, and each row out carries {per} gates beside its {H} values: T x r x (2d + E/EP) x b = "
            f"{T * r * (2 * H + per) * B:,.0f} bytes. The TP row is two all-reduces run apart (this lesson "
            "runs no TP).",
            f"The gates are parasim's packing, not EP's: a row carries a gate for each of the receiving GPU's "
            f"{per} experts (zero where not picked), {gate_bytes:,} of the {sum(fwd):,} bytes forward "
            f"({gate_bytes / sum(fwd):.0%}; {gate_bytes / dispatch:.0%} of the dispatch). A real dispatcher "
            f"sends a token's K = {K} gates (and the numbers of its experts): {K} gates a row would make this "
            f"dispatch {rows_out * (H + K) * B:,} bytes, not {dispatch:,}.",
        ],
    )


def checks(result) -> list[Check]:
    v, world = result.values, result.world
    w = run(weights, 1).values[0]
    one = run(unsplit, 1).values[0]
    y = np.concatenate([np.asarray(x["y"]) for x in v])
    dx = np.concatenate([np.asarray(x["dx"]) for x in v])
    per = E // world
    f = followed(result)
    owners = sorted({e // per for e in f["experts"]})
    router = sum(x["grads"]["router"] for x in v)
    expert_grads = {k: g for x in v for k, g in x["grads"].items() if k != "router"}
    picks = [np.asarray(x["picks"]) for x in v]
    # rows from GPU s to GPU d: tokens of s with at least one pick among d's experts (the wire skips s = d)
    rows = [[int(((p // per) == d).any(axis=1).sum()) for d in range(world)] for p in picks]
    crossing = [sum(n for d, n in enumerate(row) if d != s) for s, row in enumerate(rows)]
    return [
        check(f"experts a GPU holds: {E} / {world}", [x["per"] for x in v], [E // world] * world),
        check(
            "each GPU's experts a contiguous block, in GPU order",
            [x["first"] for x in v],
            [d * (E // world) for d in range(world)],
        ),
        check(
            f"{_name(*WATCH)}: the GPUs the dispatch sent it to are its {K} experts' distinct owners (expert // {per})",
            f["sent_to"],
            owners,
        ),
        check(
            f"... {len(owners)} GPUs for its {K} experts: one row each, however many of its experts a GPU holds",
            len(f["sent_to"]),
            4,
        ),
        check(
            "token rows each GPU handed the dispatch, to each GPU: its tokens with a pick among that GPU's experts",
            _rows(result),
            rows,
        ),
        check(
            f"dispatch bytes each GPU sent: rows crossing x (h + {per} gates) x {B}",
            list(_sent(result, "dispatch").values()),
            [n * (H + per) * B for n in crossing],
        ),
        check(
            f"combine bytes each GPU sent back: the same rows, h = {H} values each",
            sum(_sent(result, "combine").values()),
            sum(crossing) * H * B,
        ),
        check(
            "the output of all tokens equals one device's written out in numpy (every expert, no all-to-all)",
            y,
            numpy_forward(w),
            rtol=1e-12,
            atol=1e-14,
        ),
        check(
            "the input gradient equals the unsplit layer's on one device",
            dx,
            np.asarray(one["dx"]),
            rtol=1e-12,
            atol=1e-14,
        ),
        check(
            "every expert's weight gradients (a probe of each) equal the unsplit layer's, each on the GPU "
            "holding that expert",
            [expert_grads[k] for k in sorted(expert_grads)],
            [one["grads"][k] for k in sorted(expert_grads)],
            rtol=1e-12,
            atol=1e-14,
        ),
        check(
            "the router's gradient, summed over the GPUs (each saw its own tokens), equals the unsplit layer's",
            router,
            one["grads"]["router"],
            rtol=1e-12,
        ),
        check(
            "backward's two all-to-alls send exactly what forward's did",
            sum(_sent(result, "backward").values()),
            sum(_sent(result, "dispatch").values()) + sum(_sent(result, "combine").values()),
        ),
        check(
            "expert weights each GPU holds, the post's E x P_e / (EP x ETP x PP) with P_e = 2 x d x f, ETP = PP = 1",
            [x["expert_params"] for x in v],
            [E * 2 * H * F // world] * world,
        ),
        check(
            "TP's two forward all-reduces of the same T x d tokens over 8 GPUs (run apart): the post's "
            "2 x T x d x b x 2(t - 1)/t",
            tp_bytes(),
            2 * T * H * B * 2 * (world - 1) // world,
        ),
        check(
            "ZeRO-3's gather of the experts moves more than ten times what EP's forward all-to-alls move",
            zero3_bytes(per, world) > 10 * (sum(crossing) * (2 * H + per) * B),
            True,
        ),
    ]


NARRATIVE = {
    "route": f"""
        One MoE layer as wide as DeepSeek-V3's: {E} experts, each token taking its top {K}, split over {EP}
        GPUs by expert parallelism, so GPU d keeps experts 32d+1 to 32d+32 and nothing else. Each GPU holds
        {T} tokens of its own (a hidden size of {H}, so the run is instant) and scores them against all {E}
        experts with the small router every GPU keeps whole. It keeps the best {K} scores per token and
        turns them into gates with a softmax. Routing is local: no GPU talks to another yet.""",
    "dispatch": f"""
        The first all-to-all. For every GPU, a GPU packs one row per token that picked any expert living
        there: the token's {H} values and the gates of all {E // EP} of that GPU's experts, zero where not
        picked (parasim's packing: a real dispatcher sends only the token's {K} gates, and the tables count
        what that would save). A token whose picks sit two to a GPU still travels there only once. The followed token, t2 of g1, picked eight experts that live in
        pairs on four GPUs, none of them its own, so four rows leave g1 for it.""",
    "compute": """
        No traffic: each GPU runs each of its experts on the rows that picked it, batched, and weights every
        result by its gate. A row that picked two of the GPU's experts comes out as the sum of both.""",
    "combine": """
        The second all-to-all, the first one in reverse: every row goes home carrying one vector, its GPU's
        gate-weighted share. The home GPU adds the shares up, and the token has its layer output, the same
        numbers one device holding every expert would compute.""",
    "backward": """
        Backward runs the two all-to-alls again in the other order: output gradients out along the same
        rows, then input and gate gradients home. Each expert's weight gradient appears only on the GPU that
        owns it; the router's is summed over the GPUs, since each routed different tokens. The table at the
        end sets these bytes beside ZeRO-3, which keeps tokens in place and moves weights instead.""",
}

LESSON = Lesson(
    name="ep-split",
    title="Expert parallelism: 256 experts over 8 GPUs, tokens sent to them and back",
    section="Expert parallelism: split the experts",
    order=165,
    world=EP,
    worlds=(EP,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="one MoE layer (256 experts, top 8) at EP 8: route, dispatch, compute, combine; a token's four GPUs",
    no_picture="its token's eight experts on four GPUs are a table; moe16 --plot draws a top-2 token's dispatch",
    keep_values=0,
    tables=tables,
)
