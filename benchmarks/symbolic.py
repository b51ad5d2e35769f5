"""Symbolic ranks at real sizes, measured in one run: seconds and this process's peak memory.

    python benchmarks/symbolic.py [--json]

1. The same small training step (train/step.py: TP2 CP2 PP2 DP2, EP4, SP) on virtual and on symbolic
   ranks: the ratio of their times (symbolic pays for shape rules where virtual does tiny arithmetic).
2. DeepSeek-V3's MoE layer at 4,096 tokens per GPU on EP 64 (64 symbolic ranks, one forward).
3. One 27B layer at the estimator's longest sequence for TP8 + SP + CP2 with full recomputation (16 symbolic
   ranks, forward and backward).
4. Megatron-LM 8.3B's step on its 512 GPUs (TP 8), ranks folded, and GPU 0's peak memory; the 27B model's
   whole step at each of the post's nine longest-sequence layouts, at the estimator's longest sequence.
5. The deepseek-v3 preset's whole training step at its real sizes: 2,048 GPUs (PP 16 x EP 64, DP 128),
   61 layers (3 dense), 256 experts top-8, hidden 7,168, 4,096-token sequences, 16 micro-batches, 1F1B,
   ZeRO-1, balanced routing, with the ranks of each stage folded onto one (engine/symbolic/fold.py) and the trace
   left folded (the whole trace is written out afterwards, to count its events and bytes). CPU seconds and the
   growth of this process's peak memory; issue 20's target is 10 s and 2 GB on this 2-core machine, issue 55's
   goal 3 s and 256 MB.
6. The llama3-405b preset's whole step: 16,384 GPUs (TP 8 x PP 16 x DP 128, the Llama 3 paper's Table 4), 126
   layers (7 on the first and last stage), 8,192-token sequences, 16 micro-batches, ranks folded and the trace
   left folded, then GPU 0's peak memory and the step on the clock (`parasim trace --layout llama3-405b
   --symbolic --gpu 0`): CPU seconds and the growth of this process's peak memory. Issue 55's goal is 10 s and
   1 GB. Then its long-context stage, the llama3-405b-long preset: CP 16 by all-gather (the paper's section
   3.3.2), DP 8, 131,072-token sequences; its CP ranks fold too (engine/symbolic/fold.keep_of).

--tiny (for tests/e2e/test_benchmarks.py): item 1 as it is, item 2 at 256 tokens on EP 8, item 3 as it is (symbolic:
cheap at any length), no item 4, item 5 on the 27B model's TP8 + SP + PP2 preset (16 GPUs, 4 micro-batches), and
item 6 with DP 1 (128 GPUs; the long stage's 256 at 4,096 tokens).
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace

import parasim
from parasim.estimate import Plan, fit, gpu_presets
from parasim.train.against import granule
from parasim.train.step import make_step
from parasim.layout import Layout, ModelSpec, model_preset, preset
from parasim.nn import LayerOptions, ParallelContext, Saved
from parasim.nn.layer import TransformerLayer, layer_weights
from parasim.nn.moe import MoE
from parasim.nn.routing import Routing
from parasim.engine.symbolic.fold import fold_of

TARGET_S, TARGET_MB = 10.0, 2000


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def small_step() -> dict:
    model = ModelSpec(name="small", layers=4, hidden=8, heads=4, vocab=16, ffn=16, experts=8, top_k=2,
                      dense_layers=1, seq=8, bias=False)
    layout = Layout(tp=2, cp=2, pp=2, dp=2, ep=4, etp=1, sp=True, model=model)
    program = make_step(layout, m=2)
    virtual, _ = timed(lambda: parasim.run(program, layout.world))
    symbolic, _ = timed(lambda: parasim.run(program, layout.world, backend="symbolic"))
    return {"virtual_s": virtual, "symbolic_s": symbolic, "symbolic_over_virtual": symbolic / virtual}


def moe_program(tokens: int, routing: str = "uniform"):
    """DeepSeek-V3's MoE layer, one forward of `tokens` tokens a rank, every rank in one EP group (benchmarks/peers.py
    sets it beside torch's FakeTensorMode)."""
    ds = preset("deepseek-v3").model
    h, e, f, k = ds.hidden, ds.experts, ds.expert_size, ds.top_k
    policy = Routing.parse(routing)  # one policy for every rank: a sender's draws are made once

    def program(ctx):
        ep = ctx.new_group(range(ctx.world), "ep")
        tp = ParallelContext(ctx, None, ep_group=ep, options=LayerOptions(routing=policy))
        draw = ctx.shared_rng
        experts = [{"w1": draw(f"{i}.w1").normal((h, f), "float16"), "w2": draw(f"{i}.w2").normal((f, h), "float16")}
                   for i in range(e)]
        moe = MoE(tp, ep, draw("router").normal((h, e), "float16"), experts, k, name="moe")
        moe.forward(draw(f"x{ctx.rank}").normal((tokens, h), "float16"), Saved())

    return program


def moe_ep64(tokens: int = 4096, gpus: int = 64) -> dict:
    program = moe_program(tokens)
    seconds, result = timed(lambda: parasim.run(program, gpus, backend="symbolic"))
    sent = sum(m.sent for ev in result.trace.events for m in ev.members)
    return {"seconds": seconds, "gpus": gpus, "tokens": tokens, "bytes_sent": sent}


def layer_27b() -> dict:
    """One 27B layer at the longest sequence the estimator finds for TP8 + SP + CP2 with full recomputation."""
    plan = Plan(tp=8, sp=True, cp=2, recompute="full")
    step = granule(plan)  # zigzag halves, then SP shares
    seq = int(fit(model_preset("27b"), plan, gpu_presets()["h200"].usable).seq) // step * step
    model = replace(model_preset("27b"), seq=seq, flash=True)
    layout = Layout(tp=8, cp=2, sp=True, model=model)

    def program(ctx):
        t = ParallelContext.from_layout(ctx, layout)
        layer = TransformerLayer(t, model, layer_weights(ctx, model, "L0"), key="L0")
        x = ctx.shared_rng("x").normal((len(t.token_positions()), 1, model.hidden))
        saved = Saved()
        _, cache = layer.forward(x, saved)
        layer.backward(cache, x)
        return saved.bytes()
    seconds, result = timed(lambda: parasim.run(program, layout.world, backend="symbolic"))
    return {"seconds": seconds, "gpus": layout.world, "seq": seq, "kept_bytes_per_gpu": result.values[0]}


def megatron_step() -> dict:
    """Megatron-LM 8.3B on its 512 GPUs (TP 8, DP 64), 4,096-token sequences, one step, ranks folded."""
    layout = preset("megatron-8.3b")
    layout = replace(layout, model=replace(layout.model, seq=4096))
    seconds, result = timed(lambda: parasim.run(make_step(layout), layout.world, backend="symbolic",
                                                fold=fold_of(layout)))
    return {"seconds": seconds, "gpus": layout.world, "ranks_run": len(set(fold_of(layout))),
            "peak_gb_gpu0": result.trace.peak(0)["bytes"] / 1e9}


def nine_rows() -> list[dict]:
    """The 27B model's whole step at each of the nine longest-sequence layouts, at the estimator's longest
    sequence for what the step runs (train/against.py), ranks folded: seconds each and GPU 0's peak."""
    from parasim.estimate import get_model
    from parasim.estimate.fit import LONGEST_ROWS
    from parasim.train.against import run_plan
    from parasim.train.differences import as_run
    model, usable = get_model("27b"), gpu_presets()["h200"].usable
    out = []
    for _, label, kw in LONGEST_ROWS:
        plan = as_run(Plan(**kw))
        seq = int(fit(model, plan, usable).seq) // granule(plan) * granule(plan)
        seconds, trace = timed(lambda: run_plan(model, plan, seq, 0))
        out.append({"label": label, "seq": seq, "gpus": plan.world, "seconds": seconds,
                    "peak_gb_gpu0": trace.peak(0)["bytes"] / 1e9})
    return out


DEEPSEEK_GOAL_S, DEEPSEEK_GOAL_MB = 3.0, 256  # issue 55


def deepseek_step(name: str = "deepseek-v3", m: int = 16) -> dict:
    layout = preset(name)
    layout = replace(layout, model=replace(layout.model, seq=4096))
    before = peak_mb()
    t = time.process_time()
    result = parasim.run(make_step(layout, m=m), layout.world, backend="symbolic", fold=fold_of(layout))
    cpu = time.process_time() - t
    grew = peak_mb() - before  # the step's, before the whole trace is written out below
    trace = result.trace
    return {"layout": name, "cpu_s": cpu, "seconds": cpu, "peak_growth_mb": grew, "gpus": layout.world,
            "ranks_run": len(set(fold_of(layout))), "micro_batches": m, "events_run": len(trace.ran_events),
            "events": len(trace.events), "bytes_sent": sum(mm.sent for e in trace.events for mm in e.members),
            "over_target": cpu / TARGET_S, "over_goal": cpu / DEEPSEEK_GOAL_S}


LLAMA3_GOAL_S, LLAMA3_GOAL_MB = 10.0, 1000


def llama3_step(dp: int | None = None, name: str = "llama3-405b", seq: int = 8192) -> dict:
    """Llama 3 405B's pre-training step on its 16,384 GPUs (or the same layout on `dp` data-parallel groups), as
    `parasim trace --layout llama3-405b --symbolic --gpu 0 --seq 8192` runs it: the estimator's plan of the layout
    (FlashAttention), ranks folded, the trace left folded (engine/symbolic/fold.FoldedTrace); then GPU 0's peak
    memory and the step on the clock (H100s, 8 a node, as Llama 3 trained). CPU seconds of the whole, and the
    growth of this process's peak memory. `name` "llama3-405b-long" at 131,072 tokens: its long-context stage
    (CP 16 by all-gather, DP 8)."""
    from parasim.examples.tracing import TraceQuery, gpu_view

    layout = preset(name)
    if dp is not None:
        layout = replace(layout, dp=dp, world=None)
    before = peak_mb()
    t = time.process_time()
    view = gpu_view(TraceQuery(layout, name, symbolic=True, seq=seq, gpu_model="h100"), 0)
    cpu = time.process_time() - t
    trace = view.step.result.trace
    return {"gpus": layout.world, "ranks_run": len(set(trace.meta["fold"])), "micro_batches": view.step.microbatches,
            "seq": seq, "cp": layout.cp,
            "cpu_s": cpu, "events_run": len(trace.ran_events), "peak_growth_mb": peak_mb() - before,
            "peak_gb_gpu0": view.view["peak"]["bytes"] / 1e9, "step_s": view.view["time"]["step_s"],
            "mfu": view.view["time"].get("mfu"), "over_goal": cpu / LLAMA3_GOAL_S}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--tiny", action="store_true", help="small sizes, no item 4: seconds, for tests")
    args = ap.parse_args()
    if args.tiny:
        out = {"small_step": small_step(), "deepseek_v3_moe_layer_ep64": moe_ep64(256, 8),
               "layer_27b_821k": layer_27b(), "deepseek_v3_step": deepseek_step("27b-tp8-sp-pp2", 4),
               "llama3_405b_step": llama3_step(dp=1),
               "llama3_405b_long_step": llama3_step(dp=1, name="llama3-405b-long", seq=4096)}
    else:
        out = {"small_step": small_step(), "deepseek_v3_moe_layer_ep64": moe_ep64(), "layer_27b_821k": layer_27b(),
               "megatron_8b_step": megatron_step(), "rows_27b": nine_rows(), "deepseek_v3_step": deepseek_step(),
               "llama3_405b_step": llama3_step(),
               "llama3_405b_long_step": llama3_step(name="llama3-405b-long", seq=131072)}
    out["peak_mb"] = peak_mb()
    out["target"] = {"seconds": TARGET_S, "mb": TARGET_MB, "met": out["deepseek_v3_step"]["seconds"] <= TARGET_S
                     and out["peak_mb"] <= TARGET_MB}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    s = out["small_step"]
    print(f"small step, 16 ranks: virtual {s['virtual_s']:.2f} s, symbolic {s['symbolic_s']:.2f} s "
          f"(symbolic / virtual = {s['symbolic_over_virtual']:.2f})")
    e = out["deepseek_v3_moe_layer_ep64"]
    print(f"DeepSeek-V3 MoE layer, {e['tokens']:,} tokens x {e['gpus']} GPUs, one forward: {e['seconds']:.2f} s, "
          f"{e['bytes_sent'] / 1e9:.2f} GB sent")
    l27 = out["layer_27b_821k"]
    print(f"27B layer at {l27['seq']:,} tokens (TP8 + SP + CP2's longest with full recomputation) on TP8 + SP + "
          f"CP2: {l27['seconds']:.2f} s, "
          f"{l27['kept_bytes_per_gpu'] / 1e9:.2f} GB kept per GPU")
    if "megatron_8b_step" in out:
        mg = out["megatron_8b_step"]
        print(f"megatron-8.3b step, {mg['gpus']} GPUs ({mg['ranks_run']} run): {mg['seconds']:.1f} s; GPU 0's peak "
              f"{mg['peak_gb_gpu0']:.1f} GB")
    for r in out.get("rows_27b", []):
        print(f"27B step, {r['label']} ({r['gpus']} GPUs) at {r['seq']:,} tokens: {r['seconds']:.1f} s; GPU 0's peak "
              f"{r['peak_gb_gpu0']:.1f} GB")
    d = out["deepseek_v3_step"]
    print(f"{d['layout']} step, {d['gpus']:,} GPUs ({d['ranks_run']} run, the rest folded), {d['micro_batches']} "
          f"micro-batches: {d['cpu_s']:.1f} s CPU, {d['events_run']:,} events run ({d['events']:,} in the whole "
          f"trace), {d['bytes_sent'] / 1e12:.2f} TB sent at the run's precision, peak memory "
          f"+{d['peak_growth_mb']:.0f} MB; {d['over_target']:.2f}x the {TARGET_S:g} s target, {d['over_goal']:.2f}x "
          f"issue 55's {DEEPSEEK_GOAL_S:g} s goal (and {DEEPSEEK_GOAL_MB} MB)")
    for key, name in (("llama3_405b_step", "llama3-405b"), ("llama3_405b_long_step", "llama3-405b-long")):
        ll = out[key]
        print(f"{name} step, {ll['gpus']:,} GPUs ({ll['ranks_run']} run, the rest folded), {ll['micro_batches']} "
              f"micro-batches of {ll['seq']:,} tokens (CP {ll['cp']}): GPU 0's peak {ll['peak_gb_gpu0']:.1f} GB, "
              f"{ll['step_s']:.2f} s a step on H100s (MFU {ll['mfu']:.0%}); {ll['cpu_s']:.1f} s CPU, "
              f"{ll['events_run']:,} events run, peak memory +{ll['peak_growth_mb']:.0f} MB; {ll['over_goal']:.2f}x "
              f"the {LLAMA3_GOAL_S:g} s goal (and {LLAMA3_GOAL_MB} MB)")
    print(f"peak memory of this process: {out['peak_mb']:.0f} MB (target {TARGET_MB} MB); target met: "
          f"{'yes' if out['target']['met'] else 'no'}")


if __name__ == "__main__":
    main()
