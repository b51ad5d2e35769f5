"""Silent bugs: gradient sums over the wrong group give a plausible loss and no error. `parasim check` finds
the first wrong collective by comparing every marked gradient with the unsplit model's.

The gradient sync of the 16-GPU example's attention-and-MoE split, without its pipeline: TP 2, CP 2, DP 2
for attention (8 GPUs) and EP 4 x EDP 2 for the experts (folded onto the same 8). Each GPU holds the
gradient its own tokens gave: for its shard of an attention weight (TP), for the norm it holds whole but
saw only its SP share of the tokens for, and for its expert. The right sums: attention over dp-cp, the norm
over tp and then dp-cp, each expert over expert-dp. Each bug below changes one group.
"""
from __future__ import annotations

from parasim.engine import run
from parasim.engine.divergence import first_divergence
from parasim.layout import Layout
from parasim.lesson import Check, Lesson, check

LAYOUT = Layout(tp=2, cp=2, dp=2, ep=4, etp=1, sp=True)
H = 4  # a small hidden size: the attention weight is H x 2H, split by columns over TP
EXPERTS = LAYOUT.ep  # one expert per EP rank
BUGS = {
    "expert-over-dp-cp": "the experts' gradients summed over dp-cp (the attention's group) instead of expert-dp",
    "dense-over-dp": "the attention's gradients summed over dp alone, leaving out the CP halves of the sequence",
    "norm-not-over-tp": "the norm's gradient not summed over tp, although each TP rank saw only its SP share",
}


def _attn(ctx, dp: int, cp: int):
    """The whole attention weight's gradient from the tokens of DP replica dp, CP half cp."""
    return ctx.shared_rng(f"attn.{dp}.{cp}").normal((H, 2 * H))


def _norm(ctx, dp: int, cp: int, tp: int):
    """The norm's gradient from the SP share tp of those tokens."""
    return ctx.shared_rng(f"norm.{dp}.{cp}.{tp}").normal((H,))


def _expert(ctx, e: int, edp: int):
    """Expert e's gradient from the tokens routed to it on expert-data-parallel rank edp."""
    return ctx.shared_rng(f"expert{e}.{edp}").normal((H, H))


def sync(ctx, bug: str | None = None) -> dict:
    ctx.use_layout(LAYOUT)
    c, g = ctx.coords, ctx.groups
    ctx.phase("attention: TP shards, summed over dp-cp")
    cols = slice(c.tp * H, (c.tp + 1) * H)
    attn = ctx.comm.all_reduce(_attn(ctx, c.dp, c.cp)[:, cols], group=g["dp" if bug == "dense-over-dp" else "dp-cp"],
                               label="sum the attention shard's gradient over the ranks that saw other tokens")
    ctx.mark("attn.grad", attn, "Shard(1)", g["tp"])
    ctx.phase("norm: SP partial sums over tp, then dp-cp")
    norm = _norm(ctx, c.dp, c.cp, c.tp)
    if bug != "norm-not-over-tp":
        norm = ctx.comm.all_reduce(norm, group=g["tp"], label="sum the norm's gradient over tp (SP shares)")
    norm = ctx.comm.all_reduce(norm, group=g["dp-cp"], label="sum the norm's gradient over dp-cp")
    ctx.mark("norm.grad", norm, "Replicate()", g["tp"])
    ctx.phase("experts: summed over expert-dp")
    expert = ctx.comm.all_reduce(_expert(ctx, c.ep, c.edp), group=g["dp-cp" if bug == "expert-over-dp-cp" else "expert-dp"],
                                 label="sum the expert's gradient over the ranks holding the same expert")
    ctx.mark(f"expert{c.ep}.grad", expert, "Replicate()", g["expert-dp"])
    return {"attn": attn, "norm": norm, "expert": expert}


def program(ctx):
    return sync(ctx)


def expert_over_dp_cp(ctx):
    return sync(ctx, "expert-over-dp-cp")


def dense_over_dp(ctx):
    return sync(ctx, "dense-over-dp")


def norm_not_over_tp(ctx):
    return sync(ctx, "norm-not-over-tp")


def reference(ctx):
    """One device: every gradient summed over all the tokens that reach it, whole."""
    dp, cp, tp, edp = LAYOUT.dp, LAYOUT.cp, LAYOUT.tp, LAYOUT.world // LAYOUT.ep
    ctx.mark("attn.grad", sum(_attn(ctx, d, k) for d in range(dp) for k in range(cp)))
    ctx.mark("norm.grad", sum(_norm(ctx, d, k, t) for d in range(dp) for k in range(cp) for t in range(tp)))
    for e in range(EXPERTS):
        ctx.mark(f"expert{e}.grad", sum(_expert(ctx, e, r) for r in range(edp)))


VARIANTS = {"expert-over-dp-cp": expert_over_dp_cp, "dense-over-dp": dense_over_dp,
            "norm-not-over-tp": norm_not_over_tp}
# what `parasim check` should name for each bug: (the marked gradient, the wrong group, what would match).
# Here EP 4 folds expert-dp onto the same ranks as dp, so both are named.
EXPECTED = {
    "expert-over-dp-cp": ("expert", "dp-cp", "all_reduce over dp or expert-dp instead of dp-cp would match"),
    "dense-over-dp": ("attn", "dp", "all_reduce over dp-cp instead of dp would match"),
    "norm-not-over-tp": ("norm", "dp-cp", "summing these pieces over tp (they are partial sums) would match"),
}


def divergence(variant) -> dict | None:
    keep = 10 ** 6  # every collective's values, so another group's sum can be tried
    return first_divergence(run(variant, LAYOUT.world, keep_values=keep), run(reference, 1, keep_values=keep))


def checks(result) -> list[Check]:
    right = divergence(program)
    out = [check("the right groups: no divergence from the unsplit model", "none" if right is None else right["name"],
                 "none")]
    for bug, variant in VARIANTS.items():
        got = divergence(variant)
        found = ["none"] if got is None else [got["name"].split(".")[0].rstrip("0123456789"),
                                              got["group"].split("[")[0], got["would_match"]]
        out.append(check(f"{bug}: the first wrong gradient, the group it was summed over, what would match",
                         found, list(EXPECTED[bug])))
    return out


NARRATIVE = {
    "attention: TP shards, summed over dp-cp": """
        Each GPU holds one TP shard (half the columns) of an attention weight, and its gradient comes from
        its own tokens: its DP replica's sequences, its CP half of them. Every GPU holding the same shard saw
        different tokens, so the shard's gradient is summed over dp-cp: 4 GPUs here.""",
    "norm: SP partial sums over tp, then dp-cp": """
        The norm is whole on both GPUs of a TP pair, but with SP each of them normalised only its share of
        the tokens: each holds a partial sum. It must be summed over tp first, then over dp-cp. Leave out the
        tp sum and both copies stay plausible, and different.""",
    "experts: summed over expert-dp": """
        Each GPU holds one expert (EP 4); the GPUs holding the same expert form its expert-dp group (2 GPUs)
        and saw different tokens. Summing over dp-cp instead adds up other experts' gradients: the numbers
        look like gradients, training goes on, and it is wrong. `parasim check silent-bugs --bug NAME`
        points at the collective that did it.""",
}

LESSON = Lesson(
    name="silent-bugs",
    title="Silent bugs: a gradient summed over the wrong group, found by parasim check",
    world=LAYOUT.world,
    worlds=(LAYOUT.world,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    summary="three wrong gradient groups that raise no error, and the collective `parasim check` names for each",
    keep_values=0,
    reference=reference,
    variants=VARIANTS,
)
