"""What `parasim trace` runs, as the calls a notebook makes too: one training step of a worked example on a
layout (`traced_step`), and what is read of it: the path of one token (`token_trace`) or one GPU's view
(`gpu_view`). At the example's own small size the step runs on virtual ranks (or symbolic ones, routed by a
policy); a model at real size runs on symbolic ranks, the ranks that do the same work folded onto one. Each
result's `to_dict` is the command's --json; the command parses flags into a `TraceQuery` and renders."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UsageError
from ..layout.axes import SIZED
from ..limits import TRACE_EXPERT_LAYERS, TRACE_PASSES, at_most
from .worked import DEFAULT, example

if TYPE_CHECKING:
    from ..comm.trace import Trace
    from ..engine.runner import RunResult
    from ..estimate.memory import Plan
    from ..layout import Layout


@dataclass(frozen=True)
class TraceQuery:
    """One `parasim trace`: the layout (and the name the learner knows it by), the worked example, the step's
    micro-batches (None: the example's, or PP's at real size), its routing, the token to follow, whether to
    run on symbolic ranks, the GPU type timed, and for a step at real size its sequence, attention and
    precision (`job`: the job file the layout was read from (any stack), whose step choices it takes; `source`:
    that job's file, named where the job cannot run as it is)."""

    layout: Layout
    name: str
    example: str = DEFAULT
    microbatches: int | None = None
    routing: str = "learned"
    token: str = "contract"
    symbolic: bool = False
    gpu_model: str = "h200"
    job: Any = None
    source: str | None = None
    seq: int | None = None
    flash: bool = True
    precision: str | None = None

    @property
    def at_scale(self) -> bool:
        """A model at real size (a full-size preset on symbolic ranks, or a Megatron job), not the example's."""
        return (self.symbolic or self.job is not None) and not _is_example(self.layout, example(self.example).seq)


@dataclass(frozen=True)
class TracedStep:
    """One step as run: its result, the layout it ran (at real size: with the sequence and the model's shapes
    of the step), the micro-batches, the routing, and at real size the estimator's plan it ran; at the
    example's size, the data-parallel replicas' sequences and the token followed."""

    result: RunResult
    layout: Layout
    microbatches: int
    routing: str
    plan: Plan | None = None
    replicas: Any = None
    watch: Any = None


def traced_step(q: TraceQuery, gpu: int | None = None, progress: Callable[[str], None] | None = None) -> TracedStep:
    """Run the step `q` asks for: every setting refused in one line before it runs. `gpu`: the GPU to be
    viewed (at real size it runs itself, unfolded); `progress`: told, before a real-size step, what runs."""
    from ..engine.runner import run

    if q.at_scale:
        return _step_at_scale(q, 0 if gpu is None else gpu, progress)
    ex = example(q.example)
    if q.seq is not None:
        raise UsageError("--seq sets a real-size step's sequence: use it with --symbolic and a full-size preset")
    if not q.flash:  # the example's small layers keep their scores already: there are real values to keep
        raise UsageError("--no-flash is a choice of a real-size step: use it with --symbolic and a full-size preset")
    if q.precision is not None:  # the example's token path compares values: it runs exact, in float64
        raise UsageError("--precision is a choice of a real-size step: use it with --symbolic and a full-size preset")
    layout, m = q.layout, q.microbatches or ex.micro_batches
    ex.check_runnable(layout, m, q.routing)
    _check_size(layout, m)
    reps = ex.replicas(layout.dp, m)
    watch = ex.find_token(q.token, [s for rep in reps for s in rep])
    if gpu is not None and not 0 <= gpu < layout.world:
        raise UsageError(f"--gpu {gpu}: the layout has GPUs 0-{layout.world - 1}")
    if q.symbolic and q.routing in ex.routings:
        raise UsageError("--symbolic has no router scores to route by: give --routing uniform, balanced or skewed:F")
    program = ex.make_program(watch, layout, m, q.routing)
    result = run(program, layout.world, "symbolic" if q.symbolic else "virtual", seed=0)
    return TracedStep(result, layout, m, q.routing, replicas=reps, watch=watch)


@dataclass(frozen=True)
class TokenTrace:
    """The path of one token through the step (the example's `token_path`, with the routing, the backend,
    the check against the unsplit model where there is one, and the bytes each group moved inside and
    across nodes)."""

    path: dict[str, Any]
    step: TracedStep

    @property
    def ok(self) -> bool:
        x = self.path["exactness"]
        return x is None or x["exact"]

    def to_dict(self) -> dict[str, Any]:
        return self.path


def token_trace(q: TraceQuery, step: TracedStep | None = None) -> TokenTrace:
    """Follow `q.token` through the example's step (run here unless `step` is given)."""
    ex = example(q.example)
    if q.at_scale:
        raise UsageError("at real size there is no word to follow: give --gpu N for one GPU's view, or --app")
    step = traced_step(q) if step is None else step
    result, layout = step.result, step.layout
    path = ex.token_path(result.trace, step.watch, step.replicas, q.name)
    path["routing"] = q.routing
    path["backend"] = result.trace.backend
    # the unsplit model routes by its own router: a policy's choices (and symbolic ranks' missing values)
    # leave nothing to compare
    path["exactness"] = (
        ex.exactness(result.values, layout, step.microbatches, q.routing) if q.routing in ex.routings else None
    )
    path["bytes_by_link"] = {
        "gpus_per_node": layout.gpus_per_node,
        "by_group": result.trace.bytes_by_link(layout.gpus_per_node),
    }
    return TokenTrace(path, step)


@dataclass(frozen=True)
class GpuView:
    """What one GPU keeps and every kind of call it joins, with its bytes; at real size, what its peak assumes
    and whether it fits the GPU type, and the step's time on the clock. `value`: what the GPU's rank
    returned (its coordinates, what it stores, its tokens)."""

    view: dict[str, Any]
    value: dict[str, Any]
    step: TracedStep

    @property
    def ok(self) -> bool:
        x = self.view["exactness"]
        return x is None or x["exact"]

    def to_dict(self) -> dict[str, Any]:
        return self.view


def gpu_view(q: TraceQuery, gpu: int, step: TracedStep | None = None) -> GpuView:
    """GPU `gpu`'s view of the step (run here unless `step` is given)."""
    from ..estimate.traffic import gpu_spec

    card = gpu_spec(q.gpu_model, "--gpu-model")  # before the step runs: a notebook's typo costs no run
    ex = example(q.example)
    step = traced_step(q, gpu) if step is None else step
    result, layout, m, plan = step.result, step.layout, step.microbatches, step.plan
    value = result.values[gpu]
    out = {
        "gpu": gpu,
        "layout": q.name,
        "sizes": {a: getattr(layout, a) for a in SIZED},
        "coords": value["coords"],
        "stores": value["stores"],
        "experts_per_layer": [[x + 1 for x in layer] for layer in value["experts"]],
        "does": result.trace.joins(gpu),
        "backend": result.trace.backend,
        "peak": result.trace.peak(gpu) if any(mk.kind == "held" for mk in result.trace.ran_marks) else None,
        "exactness": ex.exactness(result.values, layout, m, step.routing) if step.routing in ex.routings else None,
    }
    if plan is not None and out["peak"] is not None:
        from ..estimate.memory import assumptions, items
        from ..train.differences import as_run

        seq, stage = layout.model.seq, value["coords"]["pp"]
        # the estimator's own figure for this GPU's stage, as `parasim memory` gives it (its model's shapes,
        # not the step's code: `parasim memory --symbolic` itemises the difference)
        estimate = sum(float(a + b * seq + c * seq * seq) for a, b, c in items(layout.model, plan, stage).values())
        out["peak"].update(
            assumes=assumptions(as_run(plan)),
            gpu_model=card.name,
            usable=card.usable,
            card=card.memory,
            fits=out["peak"]["bytes"] <= card.usable,
            estimate=estimate,
        )
    if "flops" in result.trace.meta and (q.symbolic or q.at_scale):
        from ..estimate.kernels import NoMeasurement

        try:
            out["time"] = step_times(q.gpu_model, result.trace, layout, gpu, m, plan)
        except NoMeasurement as exc:  # the GPU type's datasheet holds, a kernel table does not: the peak stands
            out["time"] = {"gpu": card.name, "step_s": None, "why": str(exc)}
    return GpuView(out, value, step)


def step_times(
    gpu_model: str,
    trace: Trace,
    layout: Layout,
    g: int,
    m: int,
    plan: Plan | None = None,
    spread: bool = True,
    overlap: tuple[str, ...] = (),
) -> dict:
    """The step on the clock (parasim/clock): every event of the run timed on the GPU type, GPU g's compute,
    communication and idle time, the busiest GPU and the critical path; tokens per second per GPU and MFU
    (the model's FLOPs without recomputation, estimate.traffic.step_flops, over the GPUs' peak); with `spread`,
    the range the held-out runs like it put around the step (clock/uncertainty.py); `overlap`: the clock's
    switches on (clock/overlaps.py, a trace's)."""
    from ..clock.costs import machine
    from ..clock.timeline import simulate
    from ..clock.uncertainty import family_range, held_out, trace_family

    tl = simulate(trace, machine(gpu_model, layout.gpus_per_node), overlap)  # bytes as the run's precision sent them
    busiest = max(range(trace.world), key=lambda r: (tl.busy[r], -r))
    flops = trace.meta.get("flops") or [0] * trace.world
    seq = layout.model.seq
    tokens = seq * m * layout.dp * (plan.micro_batch if plan is not None else 1)
    extra = {"tokens_per_s_per_gpu": tokens / tl.step / trace.world if tl.step else 0.0}
    if plan is not None and tl.step:
        from ..estimate.traffic import step_flops

        model_flops = step_flops(layout.model, replace(plan, recompute="none"), seq)["total"]
        extra["mfu"] = model_flops / (tl.step * trace.world * tl.machine.peak_flops)
    if spread:
        extra["range"] = family_range(trace_family(trace), gpu_model, held_out()).to_dict(tl.step)
    return {
        "gpu": tl.machine.name,
        "step_s": tl.step,
        "critical": tl.critical_split(),
        **extra,
        "this": {"rank": g, "flops": flops[g], "compute_s": tl.busy[g], "comm_s": tl.comm[g], "idle_s": tl.idle(g)},
        "busiest": {"rank": busiest, "compute_s": tl.busy[busiest]},
    }


def _is_example(layout: Layout, seq: int) -> bool:
    """The example's own small model (`seq`-token sequences), which follows a word; else a model at real size."""
    return layout.model is not None and layout.model.seq in (None, seq) and layout.model.hidden <= 64


def _step_at_scale(q: TraceQuery, gpu: int, progress: Callable[[str], None] | None) -> TracedStep:
    """A model at its real size on symbolic ranks: one training step (train/step.py), the ranks of each stage
    folded onto one, GPU `gpu` running itself."""
    from ..engine.runner import run
    from ..engine.symbolic.fold import cp_running, fold_of
    from ..estimate.memory import Plan
    from ..limits import check_symbolic_step
    from ..train.against import step_layout
    from ..train.step import make_step

    layout, job = q.layout, q.job
    if not 0 <= gpu < layout.world:
        raise UsageError(f"--gpu {gpu}: the layout has GPUs 0-{layout.world - 1}")
    model = layout.model
    if model is None:
        raise UsageError(f"{q.name} has no model to run: give a preset with one (deepseek-v3, megatron-8.3b, 27b-...)")
    if q.seq is not None or not model.seq:  # presets of full models leave the sequence to the run
        layout = replace(layout, model=replace(model, seq=q.seq or 4096))
    # the default (learned) has no router scores to route by at real size: the step routes by the balanced
    # policy, what a folded step needs (a dense model routes nothing)
    if layout.model.experts and q.routing not in ("learned", "balanced"):
        raise UsageError(
            "a real-size step folds ranks that do the same work, which needs --routing balanced "
            "(every GPU routes alike)"
        )
    routing = "balanced"
    m = q.microbatches or layout.pp
    check_symbolic_step(layout.model.seq, m, layout.pp, cp_running(layout))
    # one memory model: the step runs the estimator's plan of this layout (FlashAttention unless --no-flash,
    # dropout masks), built as `parasim memory --symbolic` builds it, so this GPU's peak is the one it shows
    # `job`: a Megatron job's step choices, as `memory --megatron` takes them
    choices = (
        {}
        if job is None
        else {
            "dropout": job.step["dropout"],
            "recompute": job.step["recompute"],
            "flash": job.step["flash"] and q.flash,
            "precision": job.step["precision"],
        }
    )
    if q.precision is not None:
        choices["precision"] = q.precision
    plan = Plan.of(layout, **{"microbatches": m, "flash": q.flash, **choices})
    try:
        layout = replace(layout, model=step_layout(layout.model, plan, layout.model.seq).model)
    except UsageError as exc:
        if job is None:
            raise
        raise UsageError(f"{exc}; parasim memory {q.source} estimates the job as it is") from None
    fold = fold_of(layout, around=gpu)  # the GPU asked about runs itself: its values are its own
    if progress is not None:
        progress(
            f"running one step of {q.name} on {layout.world:,} symbolic GPUs ({len(set(fold))} run, the rest "
            f"folded onto them), {m} micro-batch{'es' if m != 1 else ''} of {layout.model.seq:,} tokens ..."
        )
    result = run(make_step(layout, m, routing), layout.world, "symbolic", fold=fold, precision=plan.precision)
    return TracedStep(result, layout, m, routing, plan)


def _check_size(layout: Layout, m: int) -> None:
    """The example's step runs every GPU's layers for every micro-batch on virtual ranks, and holds and
    checks every expert of every layer: both bounded by what runs in seconds."""
    model = layout.model
    at_most(
        f"GPUs x micro-batches x layers of the token trace ({layout.world:,} x {m:,} x {model.layers:,})",
        layout.world * m * model.layers,
        TRACE_PASSES,
        "virtual ranks run each one for real, a few ms each",
    )
    at_most(
        f"experts x layers of the token trace ({model.experts:,} x {model.layers:,})",
        model.experts * model.layers,
        TRACE_EXPERT_LAYERS,
        "every expert's weights are made, run and checked",
    )
