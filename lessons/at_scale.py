"""The post's figures at their real sizes, counted by runs on symbolic ranks, which carry shapes and bytes
and no values, so 4,096-token batches, 7,168-wide rows and 100,000-token sequences cost nothing to hold.

DeepSeek-V3's MoE layer (hidden 7,168, 256 experts, top 8): token copies and the EP all-to-all. Routing
follows a stated policy (uniform, seeded); the checks work the same figures out by hand from the policy's
own draws. Then one layer of the 27B model at each of the post's nine layouts, at the longest sequence the
estimator finds for it: the bytes a GPU keeps for backward and the weights it holds, measured, against
the estimator's own per-layer figures.
--ep 2, 4 or 16 and --routing balanced change the dispatch: the same checks, worked out for that setting.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

import parasim
from parasim.estimate import Plan, fit, get_model, gpu_presets
from parasim.estimate.fit import LONGEST_ROWS
from parasim.estimate.memory import layer_saved_bytes
from parasim.estimate.models import layer_param_count
from parasim.train.against import granule
from parasim.train.differences import as_run
from parasim.layout import Layout
from parasim.examples import ep_vs_zero3 as ratios
from parasim.lesson import Check, Knob, Lesson, Table, check, knob
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing

T = 4096  # tokens of one TP group (without SP), or of one GPU at EP 8
D = 7168  # hidden size
E, K = 256, 8  # experts, picks per token
F = 2048  # an expert's width
TP, EP = 2, 8
EP_SIZES = (2, 4, 8, 16)  # --ep: TP pairs split the same GPUs, and E experts split evenly
DTYPE = None  # the run's float: its precision's (the post's BF16, 2 bytes a value)
POLICY = "uniform"
WORLD = 8
# one policy object per policy for every rank, so each sender's draws are made once ("balanced" spreads a
# token's K picks evenly over the experts: the post's expectation, exactly)
ROUTINGS = {p: Routing.parse(p) for p in (POLICY, "balanced")}
ROUTING = ROUTINGS[POLICY]


def _block(ctx, tp: ParallelContext, group, name: str) -> MoE:
    """An MoE layer of DeepSeek-V3's shape, its experts over `group` (weights are shapes only here)."""
    draw = ctx.shared_rng
    experts = [{"w1": draw(f"{name}.{e}.w1").normal((D, F), DTYPE), "w2": draw(f"{name}.{e}.w2").normal((F, D), DTYPE)}
               for e in range(E)]
    return MoE(tp, group, draw(f"{name}.router").normal((D, E), DTYPE), experts, K, name=name)


def _copies(saved: Saved) -> int:
    """(token, expert) pairs this rank's experts worked on: the rows of their first matmul's output."""
    return sum(n for _, what, n, _ in saved.items if what == "activation input") // F


def program(ctx, routing: Routing | None = None):
    ep = ctx.world  # the EP group is every rank; the TP pairs split the same ranks
    routing = routing or ROUTINGS[getattr(ctx, "knobs", {}).get("routing", POLICY)]
    pair = [ctx.new_group([2 * i, 2 * i + 1], "tp") for i in range(ep // TP)][ctx.rank // TP]
    out = {}
    for phase, sp in (("MoE under TP 2, without SP", False), ("MoE under TP 2, with SP", True)):
        ctx.phase(phase, sp=sp)
        tp = ParallelContext(ctx, pair, sp=sp, ep_group=pair, options=LayerOptions(routing=routing))
        moe = _block(ctx, tp, pair, f"moe.sp{int(sp)}")
        saved = Saved()
        # the TP group's 4,096 tokens: every rank holds all of them without SP, its half with SP
        moe.forward(ctx.shared_rng(f"x{ctx.rank // TP}").normal((T // TP if sp else T, D), DTYPE), saved)
        out[phase] = {"copies": _copies(saved)}
        ctx.note(f"routes {T // TP if sp else T:,} tokens; its experts work on {_copies(saved):,} (token, expert) "
                 "pairs", copies=_copies(saved))
    ctx.phase(_dispatch(ep), ep=ep)
    world = ctx.new_group(range(ep), "ep")
    tp = ParallelContext(ctx, None, ep_group=world, options=LayerOptions(routing=routing))
    moe = _block(ctx, tp, world, f"moe.ep{ep}")
    y, cache = moe.forward(ctx.shared_rng(f"tokens{ctx.rank}").normal((T, D), DTYPE), Saved())
    picks = np.asarray([[e for e, _ in row] for row in moe.last_routing])
    moe.backward(cache, y)  # the two all-to-alls again, in reverse: the post's "backward doubles it"
    away = int(((picks // (E // ep)) != ctx.rank).sum())
    out[f"EP {ep}"] = {"pairs away": away, "rows away": sum(len(r) for d, r in enumerate(moe.dispatcher.rows_to(picks))
                                                        if d != ctx.rank)}
    ctx.note(f"{away:,} of its {T * K:,} (token, expert) pairs pick an expert on another GPU", pairs_away=away)
    # what the other ways of splitting would send on the same GPUs: TP's two all-reduces of a dense layer's
    # activations (forward), and ZeRO-3 bringing this layer's experts to the tokens (each GPU's share of their
    # weights, gathered by all)
    ctx.phase(INSTEAD, ep=ep)
    x = ctx.shared_rng("activations").normal((T, D), DTYPE)
    tp_all, dp_all = ctx.new_group(range(ep), "tp"), ctx.new_group(range(ep), "dp")  # the same GPUs, named
    for block in ("attention", "MLP"):
        ctx.comm.all_reduce(x, group=tp_all, label=f"TP {ep}: the {block}'s all-reduce, forward")
    share = ctx.shared_rng(f"experts{ctx.rank}").normal((E // ep * 2 * D * F,), DTYPE)  # its experts' w1 and w2
    ctx.comm.all_gather(share, group=dp_all, label="ZeRO-3: gather this layer's experts to every GPU")
    return out


INSTEAD = "what TP and ZeRO-3 would send"


def _dispatch(ep: int) -> str:
    """The EP phase's name (the post's: EP 8)."""
    return f"EP {ep} dispatch"


def layer_at(model, kw: dict, seq: int) -> dict:
    """One layer of `model`, forward and backward, on symbolic ranks with a row's TP, SP and CP (and full
    recomputation) at `seq` tokens: what each rank keeps between forward and backward, what it works with
    while recomputing, and the weights it holds (every rank alike: one answer, checked)."""
    tp, cp, sp, full = kw.get("tp", 1), kw.get("cp", 1), kw.get("sp", False), kw.get("recompute") == "full"
    # masks kept, scores not, as the estimator's Plan counts them; with CP the engine models no dropout
    shape = replace(model, seq=seq, flash=True, dropout=0.1 if as_run(Plan(**kw)).dropout else 0.0)
    layout = Layout(tp=tp, cp=cp, sp=sp, model=shape)

    def program(ctx):
        t = ParallelContext.from_layout(ctx, layout)
        layer = TransformerLayer(t, shape, layer_weights(ctx, shape, "L0"), key="L0")
        x = ctx.shared_rng("x").normal((len(t.token_positions()), 1, shape.hidden))
        kept = Saved()
        if full:
            kept.keep("L0", "input", x)  # all that stays between forward and backward
            layer.forward(x, Saved())
            work = Saved()  # the same forward again, just before backward
            _, cache = layer.forward(x, work)
        else:
            work = kept
            _, cache = layer.forward(x, kept)
        layer.backward(cache, x)
        return {"kept": kept.bytes(), "work": work.bytes(),
                "params": sum(math.prod(w.shape) for w in layer.params().values())}
    values = parasim.run(program, tp * cp, backend="symbolic").values
    return {k: sorted({v[k] for v in values}) for k in values[0]}


def nine_rows() -> list[dict]:
    """Each of the nine layouts at its longest sequence (the estimator's, cut to a length every split takes):
    the run's per-layer figures and the estimator's."""
    model, usable = get_model("27b"), gpu_presets()["h200"].usable
    out = []
    for _, label, kw in LONGEST_ROWS:
        plan = Plan(**kw)
        step = granule(plan)  # zigzag CP halves, then SP shares
        seq = int(fit(model, plan, usable).seq) // step * step
        got = layer_at(model, kw, seq)
        act = layer_saved_bytes(model.hidden, model.heads, model.kv, model.ffn_size, seq, 1, plan.tp, plan.sp,
                                plan.cp, dropout=as_run(plan).dropout)
        kept = 2 * model.hidden * seq / (plan.cp * (plan.tp if plan.sp else 1)) if kw.get("recompute") else act
        out.append({"label": label, "seq": seq, "got": got, "kept": kept, "work": act,
                    "params": layer_param_count(model.hidden, model.heads, model.kv, model.ffn_size, plan.tp,
                                                model.bias)})
    return out


def tables(result) -> list[Table]:
    """The EP dispatch per GPU (EP 8 on the post's settings): the post's count (every leaving (token, expert) pair, d values at 2 bytes)
    beside what the run sent (each token once per GPU holding one of its picks, its gates beside it); EP beside
    TP and ZeRO-3; the 27B model's nine layouts, measured against the estimator."""
    v, trace, ep = result.values, result.trace, result.world
    dispatch = _a2a(trace, ep, "dispatch:")
    sent = {m.rank: m.sent for m in dispatch.members}
    rows = []
    for r, x in enumerate(v):
        pairs = x[f"EP {ep}"]["pairs away"]
        rows.append((f"g{r}", [pairs, round(pairs * D * 2 / 1e6, 1), round(sent[r] / 1e6, 1),
                                  round(sent[r] / (pairs * D * 2), 3)]))
    mean_pairs = sum(x[f"EP {ep}"]["pairs away"] for x in v) / len(v)
    post = T * K * D * 2 * (ep - 1) / ep
    return [Table(f"One direction of the EP {ep} all-to-all, per GPU, for T = {T:,} tokens, K = {K} picks, d = {D:,}",
                  ["GPU", "pairs leaving", "pairs x d x 2 B (MB)", "the run sent (MB)", "run / pairs"], rows,
                  notes=[f"post: T x K x d x 2 B x (EP-1)/EP = {post / 1e6:,.0f} MB per GPU. run: the pairs that "
                         f"leave, {mean_pairs:,.0f} on average, give {mean_pairs * D * 2 / 1e6:,.0f} MB; the dispatch "
                         f"sent {sum(sent.values()) / len(sent) / 1e6:,.0f} MB. why: a token whose picks land on one "
                         f"GPU twice travels there once, with the {E // ep} gates of that GPU's experts beside it "
                         "(MB = 1e6 bytes)."]),
            _instead_table(result), _ratio_table(result), nine_table(nine_rows())]


def _ratio_table(result) -> Table:
    """The ZeRO-3-over-EP ratio of this run (GPU 0's rows a token, out and back) beside the other two lessons'."""
    f, ep = _instead(result), result.world
    mine = ep_vs_zero3(ep, f["ep forward"] / (T * (2 * D + E // ep) * 2))
    return ratios.ratio_table("at-scale", mine, "the experts the others lack",
                        f"{knob(result, 'routing', POLICY)} routing, GPU 0's")


def nine_table(rows: list[dict]) -> Table:
    """The 27B model's nine layouts, one layer each at its longest sequence: what the run kept for backward,
    held while recomputing and the weights it held per GPU, each beside the estimator's per-layer figure."""
    gb = lambda n: round(n / 1e9, 3)  # noqa: E731
    m = lambda n: round(n / 1e6, 2)  # noqa: E731
    out = []
    for r in rows:
        (kept,), (work,), (params,) = r["got"]["kept"], r["got"]["work"], r["got"]["params"]  # every rank alike
        out.append((r["label"], [r["seq"], gb(kept), gb(work), m(params),
                                 [kept, work, params] == [r["kept"], r["work"], r["params"]]]))
    apart = [f"{r['label']}: est. {gb(r['kept'])} / {gb(r['work'])} GB, {m(r['params'])} M" for r, (_, row) in
             zip(rows, out) if not row[-1]]
    return Table("One layer of the 27B model at each of the post's nine layouts, at the longest sequence the "
                 "estimator finds for it on H200s, per GPU: the run's bytes and weights, and whether the "
                 "estimator gives the same (GB = 1e9 bytes, M = 1e6 parameters)",
                 ["layout", "seq (tokens)", "kept (GB)", "recomp. (GB)", "weights (M)", "same as est."], out,
                 notes=["kept: the bytes a GPU keeps from forward to backward; recomp.: what it holds while it "
                        "redoes the forward just before backward (what it kept, but with full recomputation, which "
                        "keeps only the layer's input, the larger); weights: the layer's parameters on one GPU; same "
                        "as est.: the estimator's per-layer figures equal the run's, all three, to the byte and the "
                        "parameter. seq: the estimator's longest, cut to a length every split of the layout "
                        "takes. Under CP the engine models no dropout, so no masks are counted on either side."]
                 + (["where the estimator differs, its figures: " + "; ".join(apart)] if apart else []))


def _instead_table(result) -> Table:
    """The post's comparisons, from the run: EP's all-to-alls forward and backward, beside TP's all-reduces and
    ZeRO-3's gather of the experts on the same GPUs, for one MoE layer."""
    f, ep = _instead(result), result.world
    gb = lambda n: round(n / 1e9, 3)  # noqa: E731
    rows = [("EP: dispatch + combine, forward", [gb(f["ep forward"]), gb(f["post"])]),
            ("EP: the same two, backward", [gb(f["ep backward"]), gb(f["post"])]),
            (f"TP {ep}: two all-reduces of the activations, forward", [gb(f["tp"]), gb(4 * T * D * 2 * (ep - 1) / ep)]),
            ("ZeRO-3: this layer's experts gathered to every GPU", [gb(f["zero3"]), "-"])]
    return Table(f"What one GPU sends for one MoE layer at EP {ep}, against TP and ZeRO-3 on the same GPUs (GB)",
                 ["what", "the run", "the post's count"], rows,
                 notes=[f"the post counts every leaving (token, expert) pair, 2 x T x K x d x b x (EP - 1)/EP for "
                        f"dispatch and combine: about {f['post'] / 1e9:.1f} GB forward, and backward doubles it. The run sends a "
                        "token once to each GPU holding one of its picks, so less. TP's all-reduces forward, "
                        "2 x T x d x b x 2(t - 1)/t, are the post's comparison. ZeRO-3 is EP's mirror image: it brings the "
                        f"weights to the tokens, {f['zero3'] / f['ep forward']:.0f}x the bytes EP moves bringing the "
                        "tokens to the weights forward (this run's experts have two matrices each; DeepSeek-V3's have "
                        "three); the next table sets that ratio beside ep-split's and all-to-all-hidden's."])



def ep_vs_zero3(ep: int = EP, rows: float | None = None) -> dict:
    """This lesson's ZeRO-3-over-EP ratio in the shared formula: a GPU's share of the gather, the (EP - 1)/EP of
    the experts the others lack, against `rows` rows a token (the run's; else the average under uniform
    routing)."""
    rows = ratios.uniform_rows(E, ep, K) if rows is None else rows
    return ratios.parts(share=(ep - 1) / ep, experts=E, ep=ep, hidden=D, width=F, tokens=T, rows=rows)


def _a2a(trace, ep: int, said: str):
    """The EP phase's all-to-all whose label says `said` ("dispatch:", "combine:", "dispatch backward:", ...)."""
    (e,) = [e for e in trace.events if e.op == "all_to_all" and e.phase == _dispatch(ep) and said in e.label]
    return e


def _instead(result) -> dict:
    """Bytes GPU 0 sends for one MoE layer: EP's all-to-alls forward and backward (the run's), TP's two
    all-reduces and ZeRO-3's gather of the experts on the same GPUs (the run's), and the post's count."""
    trace, ep = result.trace, result.world
    sent = lambda e: e.member(0).sent  # noqa: E731
    fwd = sum(sent(_a2a(trace, ep, f"{w}:")) for w in ("dispatch", "combine"))
    bwd = sum(sent(_a2a(trace, ep, f"{w} backward:")) for w in ("dispatch", "combine"))
    other = [e for e in trace.events if e.phase == INSTEAD]
    tp = sum(sent(e) for e in other if e.op == "all_reduce")
    zero3 = sum(sent(e) for e in other if e.op == "all_gather")
    return {"ep forward": fwd, "ep backward": bwd, "post": 2 * T * K * D * 2 * (ep - 1) / ep, "tp": tp,
            "zero3": zero3}


def checks(result) -> list[Check]:
    v, trace, ep, policy = result.values, result.trace, result.world, knob(result, "routing", POLICY)
    pairs = [sum(x[p]["copies"] for x in v[:TP]) for p in ("MoE under TP 2, without SP", "MoE under TP 2, with SP")]
    # the policy's own draws, by hand: which GPU each of rank r's tokens picks, in the dispatch's call
    routing, per = Routing.parse(policy), E // ep
    drawn = [routing.choose(f"moe.ep{ep}#0", r, r * T, T, E, K) // per for r in range(ep)]
    away = [int((d != r).sum()) for r, d in enumerate(drawn)]
    rows = [sum(int((d == g).any(axis=1).sum()) for g in range(ep) if g != r) for r, d in enumerate(drawn)]
    dispatch = _a2a(trace, ep, "dispatch:")
    row_bytes = (D + per) * 2  # a token's row and the gates of that GPU's experts, 2 bytes each
    post = T * K * D * 2 * (ep - 1) / ep  # the post's count: every (token, expert) pair that leaves, once each
    return [
        check(f"(token, expert) pairs the experts work on for one TP group of T = {T:,} tokens, t = {TP}, K = {K}: "
              "without SP every TP rank routes them all (t x T x K), with SP each its half (T x K)",
              pairs, [TP * T * K, T * K]),
        check(f"pairs leaving each GPU at EP {ep} ({policy} routing): the run's routing against its policy's draws",
              [x[f"EP {ep}"]["pairs away"] for x in v], away),
        check("... which is the post's (EP - 1) / EP of T x K in expectation (within 2%)",
              float(np.mean(away)) / (T * K * (ep - 1) / ep), 1.0, rtol=0.02),
        check(f"the post's one-direction all-to-all (decimal MB): every leaving pair's d = {D:,} values at 2 bytes, "
              "from the run's draws, against T x K x d x 2 x (EP - 1) / EP", round(float(np.mean(away)) * D * 2 / 1e6),
              round(post / 1e6), atol=8),
        check("what the run sends instead: a token once per GPU holding one of its picks, with its gates: the "
              "dispatch's bytes equal rows away x (d + E / EP) x 2", [m.sent for m in dispatch.members],
              [r * row_bytes for r in rows]),
        fewer_check(dispatch, away, rows, row_bytes),
        ep_in_the_pair(trace),
        *_instead_checks(result),
    ] + [check(f"27B, {r['label']}, one layer at {r['seq']:,} tokens: bytes kept for backward, while recomputing, "
               "and weights held per GPU, measured against the estimator" + (" (no dropout masks: the engine "
                                                                             "models no dropout under CP)" if "CP" in
                                                                             r["label"] else ""), [r["got"]["kept"], r["got"]["work"],
                                                                             r["got"]["params"]],
               [[r["kept"]], [r["work"]], [r["params"]]]) for r in nine_rows()]


def ep_in_the_pair(trace) -> Check:
    """The two TP 2 phases' all-to-alls: their group is a TP pair, which is also the EP group there (EP 2): each
    dispatch row carries a token's d values and the gates of the E / 2 experts on the GPU it goes to."""
    calls = [e for e in trace.events if e.op == "all_to_all" and e.phase.startswith("MoE under TP")]
    got = sorted({(e.group.name, len(e.ranks), t.shape[1]) for e in calls if "dispatch" in e.label
                  for m in e.members for t in m.ins})
    return check(f"in the TP {TP} phases the TP pair is the EP group: every dispatch is an all-to-all over a pair, its "
                 f"rows d values plus the gates of E / {TP} experts", got, [("tp", TP, D + E // TP)])


def _instead_checks(result) -> list[Check]:
    """The post's EP comparisons, worked out by hand from the run's own sizes."""
    f, ep, trace = _instead(result), result.world, result.trace
    every = lambda said: sum(m.sent for m in _a2a(trace, ep, said).members)  # noqa: E731
    return [
        check("backward's two all-to-alls send, over all GPUs, exactly what forward's did (the post: backward "
              "doubles it)", every("dispatch backward:") + every("combine backward:"),
              every("dispatch:") + every("combine:")),
        check(f"TP {ep}'s two all-reduces forward, by the post's formula 2 x T x d x b x 2(t - 1)/t (a ring "
              "sends 2(t - 1)/t of each)", f["tp"], 2 * T * D * 2 * 2 * (ep - 1) // ep),
        check(f"ZeRO-3 gathering the experts: each GPU sends its {E // ep} experts' two d x f matrices to the "
              f"{ep - 1} others, (EP - 1)/EP x E x 2 d f x 2 bytes", f["zero3"], (ep - 1) * E // ep * 2 * D * F * 2),
        check("... more than ten times what EP's all-to-alls send forward: weights are the heavier thing to move",
              f["zero3"] > 10 * f["ep forward"], True),
    ]


def fewer_check(dispatch, away: list[int], rows: list[int], row_bytes: int) -> Check:
    """Whether the run sends fewer bytes than the pair count, per GPU: a token with two picks on one GPU goes
    there once, but each row carries its gates. Uniform routing at the post's EP 8 has enough such tokens;
    balanced routing at EP 8 puts each pick on its own GPU, so there the gates make the run send more."""
    fewer = [r * row_bytes < a * D * 2 for r, a in zip(rows, away)]  # from the policy's draws, by hand
    got = [m.sent < a * D * 2 for m, a in zip(dispatch.members, away)]
    if all(fewer):
        return check("... fewer than the pair count's bytes on every GPU (a token with two picks on one GPU goes "
                     "once)", all(got), True)
    return check("... not fewer than the pair count's bytes on some GPU here: too few of its tokens put two picks "
                 "on one GPU to outweigh the gates each row carries", got, fewer)


NARRATIVE = {
    "MoE under TP 2, without SP": f"""
        DeepSeek-V3's MoE layer at its real size: its hidden size, its experts and its picks per token. A TP
        pair holds one batch of tokens. Without SP the all-reduce at attention's end leaves every token on both
        GPUs, each GPU routes all of them, and the experts work on every (token, expert) pair twice. In this
        phase and the next the pair is also the layer's EP group: its {E} experts are split EP {TP} over the
        same two GPUs, {E // TP} on each, so the dispatch and combine are all-to-alls within the pair, and
        the trace names them by the pair's group (tp[0, 1], ...).""",
    "MoE under TP 2, with SP": """
        With SP each GPU of the pair holds its own half of the tokens and routes only those: half the pairs,
        the same answer. The run counts the rows each expert multiplies; no array holds a value.""",
    **{_dispatch(n): f"""
        The EP group: {n} GPUs (eight on the post's settings), each with its own tokens, the experts split
        evenly between them ({E // n} each). Under uniform routing most of a token's picks land on other
        GPUs; the post multiplies out every leaving pair at 2 bytes a value. The run sends each token once to each GPU that
        holds one of its picks, with the gates beside it, so it sends less, and the trace says exactly how
        much. (--routing balanced spreads each token's picks evenly over the GPUs: the post's count of
        pairs then holds exactly, and where every pick lands on its own GPU, at EP 8 or 16, no token is
        merged and the gates make the run send a little more than the count.)""" for n in EP_SIZES},
    INSTEAD: """
        The same GPUs, split two other ways, for comparison. TP would all-reduce the whole activation twice in
        a layer's forward. ZeRO-3 would leave the tokens where they are and gather the experts' weights to
        every GPU instead: EP's mirror image, and for an MoE layer the far heavier load.""",
}

LESSON = Lesson(
    no_picture='its figures are counts at real size, read best in its tables',
    name="at-scale", title="The post's figures at real size, on symbolic ranks: MoE token copies, the EP "
                           "all-to-all, the 27B model's layers at their longest sequences",
    section="The post's figures at real size (symbolic ranks)",
    order=250,
    world=WORLD, worlds=EP_SIZES, program=program, narrative=NARRATIVE, checks=checks, backend="symbolic", tables=tables,
    summary="DeepSeek-V3's MoE layer at full size: token copies without and with SP, the post's all-to-all "
            "volume and what is sent once per GPU; one 27B layer per nine-row layout at its longest sequence",
    knobs={"ep": Knob(EP, choices=EP_SIZES, world=True), "routing": Knob(POLICY, choices=tuple(ROUTINGS))},
)
