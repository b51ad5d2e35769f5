"""Why split at all: what one parameter costs under mixed-precision Adam, held by the run, and the 27B model's
state against one GPU's memory; then the six ways to split, each row from the lessons that run it.

Two ranks each hold a small model the way mixed-precision training keeps it (a 16-bit weight and gradient, a
32-bit master copy and Adam's two moments), sum their gradients (data parallelism, the first split) and take
one Adam step. The bytes a parameter come from the arrays the ranks hold; the 27B figures multiply them out
and set them beside the estimator's and the GPU's datasheet.
"""

from __future__ import annotations

import numpy as np

from parasim.comm.interface import dtype_name, numpy_dtype
from parasim.dp.zero import adam
from parasim.estimate import Plan, breakdown, get_model
from parasim.estimate.memory import layer_saved_bytes
from parasim.estimate.traffic import gpu_spec
from parasim.examples.cheatsheet import footnoted
from parasim.examples.quiz import Question
from parasim.layout.precision import precision
from parasim.lesson import Check, Lesson, Table, check

N = 1024  # the small model's parameters on each rank
MODEL, GPU, SEQ = "27b", "h200", 4096  # the post's model, its GPU, one sequence of the worked example
POST = precision("post")  # the post's mixed precision: which dtype each copy of a parameter is kept in
# a parameter's copies, in the order the table lists them: (name, the precision field that sets its dtype)
COPIES = (
    ("weight", "params"),
    ("gradient", "grads"),
    ("master weight", "master"),
    ("Adam's m", "adam"),
    ("Adam's v", "adam"),
)


def program(ctx):
    xp, t = ctx.xp, ctx.world
    world = ctx.new_group(range(t), "dp")
    ctx.phase("one parameter's copies")
    # the same weights on every rank (a DP replica each), a different batch's gradient on each
    w = xp.astype(xp.asarray(np.linspace(-1.0, 1.0, N)), ctx.dtype(POST.params))
    g = xp.astype(xp.asarray(np.cos(np.arange(N) * (ctx.rank + 1.0)) / 8), ctx.dtype(POST.grads))
    master = xp.astype(w, ctx.dtype(POST.master))
    m = xp.astype(xp.zeros(N), ctx.dtype(POST.adam))
    v = xp.astype(xp.zeros(N), ctx.dtype(POST.adam))
    held = dict(zip([name for name, _ in COPIES], (w, g, master, m, v)))
    # each array's bytes from its dtype and length: the same program runs on numpy and torch arrays
    dtypes = {name: dtype_name(a.dtype) for name, a in held.items()}
    per = {name: numpy_dtype(a.dtype).itemsize * int(a.shape[0]) / N for name, a in held.items()}
    ctx.note("holds, a parameter: " + " + ".join(f"{name} {per[name]:g} B" for name in per) + f" = {sum(per.values()):g} B")
    ctx.phase("the gradients summed, one Adam step")
    summed = ctx.comm.all_reduce(g, group=world, label="DP: the replicas' gradients summed")
    grad = xp.astype(summed, ctx.dtype(POST.master)) / t
    master, m, v = adam(xp, master, m, v, grad, 1, 1e-3, (0.9, 0.999), 1e-8)
    w = xp.astype(master, ctx.dtype(POST.params))  # the 16-bit weight the next step computes with
    ctx.note(f"updated the {POST.master} master copy and cast it back to a {POST.params} weight")
    return {
        "bytes": per,
        "weight": xp.astype(w, ctx.dtype("float64")),
        "dtypes": dtypes,
    }


def _per_param(result) -> float:
    return sum(result.values[0]["bytes"].values())


def study(result) -> dict:
    """The 27B figures (`_figures`) and the cheat sheet's rows (every lesson it reads, run once)."""
    from parasim.examples.cheatsheet import cheat_sheet

    return {**_figures(result), "sheet": cheat_sheet()}


def _figures(result) -> dict:
    """The 27B figures from the run's bytes a parameter, the estimator's and the datasheet's."""
    model, gpu = get_model(MODEL), gpu_spec(GPU)
    kw = dict(h=model.hidden, heads=model.heads, kv=model.kv, ffn=model.ffn_size, seq=SEQ, batch=1, tp=1, sp=False)
    return {
        "params": model.total_params(),
        "state": model.total_params() * _per_param(result),
        "estimator": breakdown(model, Plan(), SEQ).model_state,
        "memory": gpu.memory,
        "usable": gpu.usable,
        "activations": {
            kept: layer_saved_bytes(**kw, flash=flash) * model.layers
            for kept, flash in (("scores kept", False), ("FlashAttention", True))
        },
    }


def tables(result, got) -> list[Table]:
    per, dtypes = result.values[0]["bytes"], result.values[0]["dtypes"]
    copies = Table(
        "One parameter under mixed-precision Adam, as each rank holds it",
        ["copy", "dtype", "bytes"],
        [(name, [dtypes[name], per[name]]) for name in per] + [("all of them", ["", sum(per.values())])],
        notes=["bytes: the array's size over its parameters (the run's arrays, not a table of dtypes)."],
    )
    gb = 1e9
    model = Table(
        f"The {MODEL.upper()} model on one {GPU.upper()} (GB = 10^9 bytes)",
        ["what", "GB"],
        [
            ("weights, gradients and Adam's state", [round(got["state"] / gb, 1)]),
            ("the same, from the estimator", [round(got["estimator"] / gb, 1)]),
            ("one GPU's memory (datasheet)", [round(got["memory"] / gb, 1)]),
            ("of it usable for training (the post's share)", [round(got["usable"] / gb, 1)]),
        ]
        + [
            (f"activations of one {SEQ:,}-token sequence, {kept}", [round(v / gb, 1)])
            for kept, v in got["activations"].items()
        ],
        notes=[
            f"{got['params'] / 1e9:g}B parameters x {_per_param(result):g} B = "
            f"{got['state'] / gb:,.0f} GB: {got['state'] / got['memory']:.1f} GPUs' memory before one "
            "activation is kept; lesson memory takes the activations apart"
        ],
    )
    rows = got["sheet"].rows
    cells, notes = footnoted(rows, ("splits", "communication"))  # a cell with a note marked [n], the note under
    ways = Table(
        "Six ways to split, each read from the lessons that run it (parasim cheatsheet has them all)",
        ["method", "what it splits", "what moves", "lessons"],
        [(r.method, [*c, ", ".join(r.lessons)]) for r, c in zip(rows, cells)],
        notes=notes,
    )
    return [copies, model, ways]


def checks(result, got) -> list[Check]:
    per = result.values[0]["bytes"]
    want = {name: np.dtype(np.float32).itemsize if getattr(POST, field) == "float32" else 2 for name, field in COPIES}
    return [
        check("bytes a parameter of each copy, from the arrays the run holds", per, want),
        check(
            "bytes a parameter in all: the estimator's model state over its parameters",
            _per_param(result),
            got["estimator"] / got["params"],
        ),
        check("the model's state does not fit one GPU", got["state"] > got["memory"], True),
        check(
            "both replicas hold the same weights after the step (their gradients were summed)",
            bool(np.array_equal(result.values[0]["weight"], result.values[-1]["weight"])),
            True,
        ),
    ]


def quiz(result) -> list[Question]:
    got = _figures(result)
    return [
        Question(
            f"The {got['params'] / 1e9:g}B-parameter model, trained with mixed-precision Adam: how many GB do its "
            "weights, gradients and optimizer state take, before any activation?",
            got["state"] / 1e9,
            "GB",
            "a 16-bit weight (2 B) and gradient (2 B), a 32-bit master weight and two Adam moments (4 B each): 16 B a "
            f"parameter, x {got['params'] / 1e9:g}B = {got['state'] / 1e9:,.0f} GB",
        )
    ]


NARRATIVE = {
    "one parameter's copies": """
        Mixed-precision training computes with 16-bit numbers but updates in 32 bits: each parameter is kept
        as a bfloat16 weight and a bfloat16 gradient for the products, and as a float32 master copy with
        Adam's two running averages for the update. The ranks below hold a small model that way; the bytes
        each copy takes come from their arrays.""",
    "the gradients summed, one Adam step": """
        The two ranks are data-parallel replicas: the same weights, different data, so different gradients.
        One all-reduce sums them, each rank takes the same Adam step on its float32 master copy and casts it
        back to bfloat16. Multiplied out to a 27B model, the copies outgrow any single GPU several times
        over, before the activations backward needs are counted: hence the six ways to split, one lesson
        each after this.""",
}

LESSON = Lesson(
    name="why-split",
    title="Why split at all: 16 bytes a parameter, and the six ways to split",
    section="Introduction: why a 27B model is split, and the six ways",
    order=5,
    world=2,
    worlds=(2,),
    program=program,
    narrative=NARRATIVE,
    checks=checks,
    study=study,
    tables=tables,
    quiz=quiz,
    summary="a parameter's five copies under mixed-precision Adam, held by two DP ranks; the 27B model's 432 GB "
    "against an H200's 141 GB; the six ways to split, each from its lessons",
    no_picture="its figures are a few sums; parasim memory --model 27b --plot FILE.png draws the 27B model's memory",
)
