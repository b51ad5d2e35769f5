"""What one GPU's kernels do at the sizes parasim's models and layouts give them: one JSON file of timings.

The clock (parasim/clock) times a step from a GPU's datasheet and a share of its peak. This sweep measures
what those figures stand for, at the shapes parasim's own presets produce after their TP, CP and EP splits:
- matrix products, bf16 and fp8 (torch._scaled_mm with float8_e4m3fn where the device takes it, Hopper on):
  tokens x hidden into QKV, the attention's output, the MLP's up and down (gated: gate and up together),
  the logits, and each expert's up and down at EP (its tokens: what top-k routing sends it, evenly), for
  every preset's layout, the models alone (27b, deepseek-v3, megatron-8.3b, moe16 on one GPU) and the post's
  nine longest-sequence rows of the 27B model (their longest sequence, from parasim's estimator); the same
  (m, k, n) from several places is timed once and names them all;
- attention through torch.nn.functional.scaled_dot_product_attention, causal, on its flash, cuDNN and
  memory-efficient backends where present, over sequence x (heads per TP rank, head size) of those models;
- elementwise passes and norms over tokens x hidden (HBM bandwidth), and a device-to-device copy (its ceiling);
- the host's share: eager PyTorch's time to launch one tiny kernel, a host-device synchronisation (.item()), and
  one GPU's local experts of an MoE layer (deepseek-v3's at EP 8: its tokens sorted to their experts, each
  expert's products in turn) with the experts' token counts read to the host first, as a dropless dispatcher
  must, and with them known beforehand: the difference is what that read costs;
- the SM clock, power draw and power limit sampled during the sweep (nvidia-smi, or pynvml; said when neither).
Each item: warm-up runs, then the median of timed repeats (CUDA events). What the budget leaves out is listed.

    python scripts/gpu_kernels.py --dry-run [--budget S]      # every item and its estimated time; no torch
    python scripts/gpu_kernels.py --out FILE.json [--budget S] # on a CUDA GPU
    python scripts/gpu_kernels.py --device cpu --tiny --out FILE.json   # a handful of small items on the CPU

Exit status: 0 the file was written (or the dry run listed), 2 nothing could run (no GPU, a bad flag).
docs/gpu.md gives the file's format.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # parasim from this checkout, installed or not

FORMAT = "parasim-gpu-kernels/1"
SEQ = 4096  # tokens per sequence where a preset states none (parasim memory's and fit's default --seq)
MODELS = ("27b", "deepseek-v3", "megatron-8.3b", "moe16")  # each also on one GPU, unsplit
ATTENTION_SEQS = (2048, 8192, 32768)
ATTENTION_BACKENDS = ("flash", "cudnn", "efficient")
ELEMENTWISE_ELEMENTS = (1 << 26, 1 << 28)  # 128 MiB and 512 MiB of bf16
COPY_BYTES = 1 << 30
FP8_STEP = 16  # torch._scaled_mm wants k and n in multiples of 16
MAX_PRODUCTS = 128  # distinct (m, k, n) at most: more are listed as left out, the first ones found kept
WARMUP, REPEATS = 3, 10
START_S = 20.0  # the estimate's start: CUDA, cuBLAS and the first allocations
EACH_S = 0.15  # the estimate's cost of one item beside its kernels: allocation, random fill, synchronisation
PLAN_S = 0.5  # an attention backend's first call at a new shape (cuDNN builds its plan then)
KERNEL_FLOOR_S = 10e-6  # no kernel is estimated shorter than a launch
HOST_OPS, HOST_SYNCS = 200, 20  # tiny kernels, and synchronisations, a host item issues back to back
HOST_OP_S = 20e-6  # the estimate's time for one of them (eager PyTorch: a few to tens of microseconds)
HOST_MOE_MODEL, HOST_MOE_EP = "deepseek-v3", 8  # the MoE layer whose local experts the host items run


@dataclass
class Item:
    """One thing to time: a kind, its sizes, the figure its time turns into, and where it comes from."""

    kind: str  # copy, elementwise, norm, matmul, attention, host
    name: str
    sizes: dict[str, Any]
    work: float  # FLOPs (matmul, attention) or bytes moved (copy, elementwise, norm)
    unit: str  # "flop", "byte" or "op" (a host item's launches or synchronisations)
    sources: list[str] = field(default_factory=list)
    estimate_s: float = 0.0  # the whole item: warm-up, repeats and its own cost

    def key(self) -> tuple:
        return (self.kind, self.name, tuple(sorted(self.sizes.items())))


# ---------------------------------------------------------------------------------------------
# What to time, from parasim's models and layouts

@dataclass(frozen=True)
class Split:
    """One GPU's share of a model's layer: its TP, CP and EP splits and the tokens of one micro-batch."""

    label: str
    model: Any  # parasim.layout.ModelSpec
    tp: int
    cp: int
    ep: int
    etp: int
    tokens: int  # tokens the GPU's products run over (the sequence over CP, times the micro-batch)


def splits() -> list[Split]:
    """The presets' layouts, each model on one GPU, and the post's nine longest-sequence rows (27B)."""
    from parasim.estimate import Plan, fit, get_model
    from parasim.estimate.fit import LONGEST_ROWS
    from parasim.estimate.traffic import gpu_presets
    from parasim.layout.presets import PRESETS

    out = []
    for name, p in PRESETS.items():
        if p.layout is not None:
            m, lay = p.model, p.layout
            out.append(Split(name, m, lay.tp, lay.cp, lay.ep, lay.etp or lay.tp,
                             (m.seq or SEQ) * (m.micro_batch or 1) // lay.cp))
    for name in MODELS:
        m = get_model(name)
        out.append(Split(f"{name} (one GPU)", m, 1, 1, 1, 1, (m.seq or SEQ) * (m.micro_batch or 1)))
    model, usable = get_model("27b"), gpu_presets()["h200"].usable
    for _, label, kw in LONGEST_ROWS:
        f = fit(model, Plan(**kw), usable)
        out.append(Split(f"27b longest sequence, {label} ({f.seq:,} tokens)", model, f.plan.tp, f.plan.cp, 1, 1,
                         f.seq // f.plan.cp))
    return out


def products(s: Split) -> list[tuple[str, int, int, int]]:
    """(what, m, k, n) of the split's forward products: out[m, n] = in[m, k] @ weight[k, n]."""
    m, t = s.model, s.tokens
    d = m.head_dim
    mats = 2 if m.gated else 1  # a gated MLP's gate and up run as one product
    out = [("QKV", t, m.hidden, (m.heads + 2 * m.kv) * d // s.tp), ("attention output", t, m.heads * d // s.tp, m.hidden),
           ("logits", t, m.hidden, m.vocab // s.tp)]
    if m.experts == 0 or m.dense_layers:
        out += [("MLP up", t, m.hidden, mats * m.ffn_size // s.tp), ("MLP down", t, m.ffn_size // s.tp, m.hidden)]
    if m.experts:
        routed = t * s.ep * m.top_k // m.experts  # each local expert's tokens: every EP rank's top-k, evenly
        out += [("expert up", routed, m.hidden, mats * m.expert_size // s.etp),
                ("expert down", routed, m.expert_size // s.etp, m.hidden)]
        if m.shared_experts:
            out += [("shared expert up", t, m.hidden, mats * m.shared_size // s.tp),
                    ("shared expert down", t, m.shared_size // s.tp, m.hidden)]
    return [p for p in out if min(p[1:]) >= 1]


def heads_and_sizes(all_splits: list[Split]) -> list[tuple[int, int]]:
    """(heads per TP rank, head size) of every split, once each, head sizes the kernels take (8 and up)."""
    seen: list[tuple[int, int]] = []
    for s in all_splits:
        pair = (s.model.heads // s.tp, s.model.head_dim)
        if pair[0] >= 1 and pair[1] >= 8 and pair not in seen:
            seen.append(pair)
    return seen


def plan(tiny: bool = False, cap: int = MAX_PRODUCTS) -> tuple[list[Item], list[dict]]:
    """Every item, in the order they run: the copy and the bandwidth passes first (short), then the bf16
    products, attention, and the fp8 products; and what was left out, with why. `tiny`: a handful of small
    ones, for the CPU. `cap`: distinct products at most."""
    all_splits = splits()
    matmuls: dict[tuple[int, int, int], Item] = {}
    left: list[dict] = []
    for s in all_splits:
        for what, m, k, n in products(s):
            if (m, k, n) not in matmuls and len(matmuls) >= cap:
                left.append({"kind": "matmul", "name": "bf16", "m": m, "k": k, "n": n, "sources": [f"{s.label}: {what}"],
                             "why": f"past the cap of {cap} distinct products"})
                continue
            item = matmuls.setdefault((m, k, n), Item("matmul", "bf16", {"m": m, "k": k, "n": n, "dtype": "bfloat16"},
                                                      2.0 * m * k * n, "flop"))
            item.sources.append(f"{s.label}: {what}")
    hidden = sorted({s.model.hidden for s in all_splits})
    pairs = heads_and_sizes(all_splits)
    if tiny:
        small = sorted(matmuls.values(), key=lambda i: i.work)[:3]
        return ([Item("copy", "device-to-device copy", {"bytes": 1 << 20}, 2.0 * (1 << 20), "byte"),
                 Item("elementwise", "add", {"elements": 1 << 16, "dtype": "bfloat16"}, 6.0 * (1 << 16), "byte"),
                 Item("norm", "layer_norm", {"tokens": 64, "hidden": hidden[0], "dtype": "bfloat16"},
                      4.0 * 64 * hidden[0], "byte")]
                + small + [_fp8(small[-1]), _attention("math", 64, *pairs[0])]  # the CPU's one backend
                + host_items(experts=4, tokens_per_expert=8, hidden=16, expert_ffn=8, ops=20, syncs=4)), []
    items = host_items()
    items += [Item("copy", "device-to-device copy", {"bytes": COPY_BYTES}, 2.0 * COPY_BYTES, "byte")]
    for n in ELEMENTWISE_ELEMENTS:  # bf16: add reads two and writes one, scale reads one and writes one
        items += [Item("elementwise", "add", {"elements": n, "dtype": "bfloat16"}, 6.0 * n, "byte"),
                  Item("elementwise", "scale", {"elements": n, "dtype": "bfloat16"}, 4.0 * n, "byte")]
    tokens = 16384
    for h in hidden:
        if h < 1024:  # the toy's hidden of 8: nothing a GPU's bandwidth would show
            left.append({"kind": "norm", "name": "layer_norm, rms_norm", "hidden": h,
                         "why": "a hidden size under 1,024 times the launch, not the memory"})
            continue
        for op in ("layer_norm", "rms_norm"):
            items.append(Item("norm", op, {"tokens": tokens, "hidden": h, "dtype": "bfloat16"}, 4.0 * tokens * h,
                              "byte"))
    bf16 = list(matmuls.values())
    items += bf16
    for seq in ATTENTION_SEQS:
        for heads, size in pairs:
            items += [_attention(b, seq, heads, size) for b in ATTENTION_BACKENDS]
    for i in bf16:
        if i.sizes["k"] % FP8_STEP == 0 and i.sizes["n"] % FP8_STEP == 0:
            items.append(_fp8(i))
        else:
            left.append({"kind": "matmul", "name": "fp8", "m": i.sizes["m"], "k": i.sizes["k"], "n": i.sizes["n"],
                         "sources": i.sources, "why": f"fp8 products take k and n in multiples of {FP8_STEP}"})
    return items, left


def host_items(experts: int | None = None, tokens_per_expert: int | None = None, hidden: int | None = None,
               expert_ffn: int | None = None, ops: int = HOST_OPS, syncs: int = HOST_SYNCS) -> list[Item]:
    """The host's items: a tiny kernel's launch, a synchronisation, and HOST_MOE_MODEL's local experts at
    HOST_MOE_EP (its experts over EP, each with the tokens balanced top-k routing sends it from every EP rank),
    dropless (the counts read to the host) and static (the counts known); smaller sizes where given (the CPU)."""
    from parasim.estimate import get_model
    m = get_model(HOST_MOE_MODEL)
    e = experts or m.experts // HOST_MOE_EP
    per = tokens_per_expert or SEQ * HOST_MOE_EP * m.top_k // m.experts
    h, f = hidden or m.hidden, expert_ffn or m.expert_size
    mats = 2 if m.gated else 1
    sizes = {"model": HOST_MOE_MODEL, "ep": HOST_MOE_EP, "experts": e, "tokens_per_expert": per, "hidden": h,
             "expert_ffn": f, "gated": m.gated, "dtype": "bfloat16"}
    flops = 2.0 * e * per * h * f * (mats + 1)
    where = [f"{HOST_MOE_MODEL}: its local experts at EP {HOST_MOE_EP}, forward"]
    return [Item("host", "launch", {"ops": ops}, float(ops), "op"),
            Item("host", "sync", {"syncs": syncs}, float(syncs), "op"),
            Item("host", "moe-dropless", sizes, flops, "flop", list(where)),
            Item("host", "moe-static", dict(sizes), flops, "flop", list(where))]


def _fp8(bf16: Item) -> Item:
    s = bf16.sizes
    return Item("matmul", "fp8", {"m": s["m"], "k": s["k"], "n": s["n"], "dtype": "float8_e4m3fn"}, bf16.work, "flop",
                list(bf16.sources))


def _attention(backend: str, seq: int, heads: int, size: int) -> Item:
    # causal: half of QK^T and PV (4 s^2 h d FLOPs for both, unmasked) is skipped
    return Item("attention", backend, {"seq": seq, "heads": heads, "head_dim": size, "causal": True,
                                       "dtype": "bfloat16"}, 2.0 * seq * seq * heads * size, "flop")


def estimate(items: list[Item], warmup: int = WARMUP, repeats: int = REPEATS) -> None:
    """Each item's estimated seconds on an H200 at parasim's own figures (the clock's kernel costs,
    clock/kernels_time.py: a product at the share its shape measures, attention at FlashAttention's for its
    sequence and head size, a pass over memory at the streaming rate)."""
    from parasim.clock.costs import machine
    from parasim.clock.kernels_time import attention_share, gemm_seconds, hbm_rate
    m = machine("h200")
    for it in items:
        z = it.sizes
        if it.kind == "host":
            launches = it.work if it.unit == "op" else z["experts"] * (4 if z["gated"] else 3)
            kernel = launches * HOST_OP_S + (0.0 if it.unit == "op" else gemm_seconds(
                m.memo, m.key, m.peak_flops, z["experts"] * z["tokens_per_expert"], z["expert_ffn"], z["hidden"],
                "bf16") * (3 if z["gated"] else 2))
        elif it.unit == "byte":
            kernel = it.work / hbm_rate(m.memo, m.key, m.hbm)
        elif it.kind == "attention":
            kernel = it.work / (m.peak_flops * attention_share(m.memo, m.key, z["seq"], z["head_dim"], True, False))
        else:
            kernel = gemm_seconds(m.memo, m.key, m.peak_flops, z["m"], z["n"], z["k"],
                                  "fp8" if it.name == "fp8" else "bf16")
        it.estimate_s = EACH_S + (PLAN_S if it.kind == "attention" else 0.0) + \
            (warmup + repeats) * max(kernel, KERNEL_FLOOR_S)


def within(items: list[Item], budget: float) -> tuple[list[Item], list[dict]]:
    """The items that fit the budget by their estimates, in order, and the rest with why: an item is left out
    when it would take the estimated total past the budget (later, shorter ones may still fit)."""
    kept, skipped, total = [], [], START_S
    for it in items:
        if total + it.estimate_s <= budget:
            kept.append(it)
            total += it.estimate_s
        else:
            skipped.append({**_describe(it), "why": f"--budget {budget:g} s: estimated {it.estimate_s:.2f} s would "
                                                   f"take the estimate to {total + it.estimate_s:.1f} s"})
    return kept, skipped


def _describe(it: Item) -> dict:
    return {"kind": it.kind, "name": it.name, **it.sizes}


def _line(it: Item) -> str:
    sizes = " ".join(f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}"
                     for k, v in it.sizes.items())
    where = f"  [{it.sources[0]}{f' and {len(it.sources) - 1} more' if len(it.sources) > 1 else ''}]" \
        if it.sources else ""
    return f"{it.kind:<11} {it.name:<22} {sizes}  ~{it.estimate_s:.2f} s{where}"


# ---------------------------------------------------------------------------------------------
# Timing

def timer(torch: Any, device: Any) -> Callable[[Callable[[], Any], int, int], list[float]]:
    """fn timed `repeats` times after `warmup` runs: CUDA events on a GPU, the wall clock on the CPU (seconds)."""
    if device.type == "cuda":
        def on_gpu(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            out = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end) / 1e3)
            return out
        return on_gpu

    def on_cpu(fn: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out
    return on_cpu


def kernel(torch: Any, it: Item, device: Any) -> tuple[Callable[[], Any], Any]:
    """The call to time for an item, its tensors made once here, and the context it runs in (attention's
    backend, chosen once outside the timed calls). Raises what torch raises when the device does not take it
    (an fp8 product on a GPU before Hopper, a backend that is not there)."""
    bf16 = torch.bfloat16
    s = it.sizes
    if it.kind == "copy":
        src = torch.empty(s["bytes"], dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        return (lambda: dst.copy_(src)), contextlib.nullcontext()
    if it.kind == "elementwise":
        a = torch.randn(s["elements"], dtype=bf16, device=device)
        b, out = torch.randn_like(a), torch.empty_like(a)
        return ((lambda: torch.add(a, b, out=out)) if it.name == "add" else (lambda: torch.mul(a, 0.5, out=out)),
                contextlib.nullcontext())
    if it.kind == "norm":
        x = torch.randn(s["tokens"], s["hidden"], dtype=bf16, device=device)
        w = torch.ones(s["hidden"], dtype=bf16, device=device)
        if it.name == "rms_norm":
            if not hasattr(torch.nn.functional, "rms_norm"):
                raise RuntimeError("this torch has no torch.nn.functional.rms_norm")
            return (lambda: torch.nn.functional.rms_norm(x, (s["hidden"],), w)), contextlib.nullcontext()
        return (lambda: torch.nn.functional.layer_norm(x, (s["hidden"],), w)), contextlib.nullcontext()
    if it.kind == "matmul":
        a = torch.randn(s["m"], s["k"], dtype=bf16, device=device)
        w = torch.randn(s["n"], s["k"], dtype=bf16, device=device)  # a weight as nn.Linear holds it: [out, in]
        if it.name == "bf16":
            return (lambda: torch.matmul(a, w.t())), contextlib.nullcontext()
        return _fp8_product(torch, a, w, device), contextlib.nullcontext()
    if it.kind == "host":
        return _host(torch, it, device), contextlib.nullcontext()
    if it.kind == "attention":
        q, k, v = (torch.randn(1, s["heads"], s["seq"], s["head_dim"], dtype=bf16, device=device) for _ in range(3))
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None), "math": SDPBackend.MATH}[it.name]
        if backend is None:
            raise RuntimeError("this torch has no cuDNN attention backend")

        def attend() -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel([backend]):
            attend()  # a backend that cannot take these tensors says so here, before any timing
        return attend, sdpa_kernel([backend])
    raise ValueError(f"unknown kind {it.kind!r}")


def _host(torch: Any, it: Item, device: Any) -> Callable[[], Any]:
    """A host item's call. launch: `ops` in-place adds on one value, back to back (the GPU waits on the CPU, so
    the events time the CPU's launches); sync: `syncs` adds each read back with .item(); moe-*: the local
    experts' forward (tokens sorted to their experts, each expert's up, activation and down in turn, the
    results put back in token order), the per-expert counts read to the host with .tolist() (dropless) or known
    beforehand (static). Routing is balanced, as the published MoE benchmarks force it."""
    s = it.sizes
    x = torch.zeros(1, device=device)
    if it.name == "launch":
        def launches() -> Any:
            for _ in range(s["ops"]):
                x.add_(1.0)
        return launches
    if it.name == "sync":
        def syncs() -> Any:
            for _ in range(s["syncs"]):
                x.add_(1.0).item()
        return syncs
    bf16, e, per, h, f = torch.bfloat16, s["experts"], s["tokens_per_expert"], s["hidden"], s["expert_ffn"]
    mats = 2 if s["gated"] else 1
    tokens = torch.randn(e * per, h, dtype=bf16, device=device)
    up = torch.randn(e, h, mats * f, dtype=bf16, device=device) / h ** 0.5
    down = torch.randn(e, f, h, dtype=bf16, device=device) / f ** 0.5
    owner = torch.randperm(e * per, device=device) % e  # each token's expert: balanced, in no order
    known = [per] * e
    dropless = it.name == "moe-dropless"

    def layer() -> Any:
        order = torch.argsort(owner, stable=True)
        ordered = tokens.index_select(0, order)
        counts = torch.bincount(owner, minlength=e).tolist() if dropless else known
        outs = []
        for i, part in enumerate(torch.split(ordered, counts)):
            a = part @ up[i]
            if mats == 2:
                gate, lin = a.chunk(2, dim=-1)
                a = torch.nn.functional.silu(gate) * lin
            else:
                a = torch.nn.functional.gelu(a)
            outs.append(a @ down[i])
        back = torch.empty_like(ordered)
        return back.index_copy_(0, order, torch.cat(outs))
    layer()
    return layer


def _fp8_product(torch: Any, a: Any, w: Any, device: Any) -> Callable[[], Any]:
    """a @ w.T in float8_e4m3fn with unit scales, out in bf16 (torch._scaled_mm: the second operand column-major)."""
    if device.type != "cuda":
        raise RuntimeError("fp8 products run on CUDA GPUs only")
    if torch.cuda.get_device_capability(device) < (8, 9):
        raise RuntimeError(f"fp8 products need compute capability 8.9 or above, this GPU has "
                           f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))}")
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is None or not hasattr(torch, "_scaled_mm"):
        raise RuntimeError("this torch has no float8_e4m3fn or torch._scaled_mm")
    a8, w8 = a.to(f8), w.to(f8)
    one = torch.tensor(1.0, device=device)
    b8 = w8.t()  # [k, n], column-major: what _scaled_mm takes

    # scales by keyword: torch 2.1 to 2.3 take them so (and give back a pair), later ones too
    def product() -> Any:
        return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    product()  # sizes or a torch it does not suit are refused here, before any timing
    return product


def measure(torch: Any, it: Item, device: Any, time_it: Callable, warmup: int, repeats: int) -> dict:
    """One item's entry: its sizes, sources, times and the rate they give; or the error that stopped it."""
    out = {**_describe(it), "work": it.work, "unit": it.unit, "sources": it.sources, "estimate_s": it.estimate_s}
    fn: Any = None
    try:
        fn, context = kernel(torch, it, device)
        with context:
            times = time_it(fn, warmup, repeats)
    except Exception as exc:  # the device or this torch cannot run it: a finding, kept in the file
        out["error"] = " ".join((str(exc).strip().splitlines() or [type(exc).__name__])[0].split())[:300]
        return out
    finally:
        fn = None  # its tensors go back to torch's cache, and the cache back to the device: the next may be large
        if device.type == "cuda":
            torch.cuda.empty_cache()
    median = statistics.median(times)
    out.update(times_s=times, median_s=median)
    if it.unit == "op":  # microseconds for one launch or synchronisation
        out["us_per_op"] = median / it.work * 1e6
        return out
    out["tflops" if it.unit == "flop" else "gb_per_s"] = (it.work / median / (1e12 if it.unit == "flop" else 1e9)
                                                          if median > 0 else None)
    return out


# ---------------------------------------------------------------------------------------------
# The clock and the power while it runs

QUERY = "clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu"


class Clocks:
    """Samples the SM clock, power and temperature every `every` seconds in a thread of its own, through
    pynvml if it imports, else nvidia-smi; `source` None and `why_not` say when neither is there."""

    def __init__(self, every: float = 1.0, gpu: int = 0):
        self.every, self.gpu, self.samples, self.now = every, gpu, [], "start"
        self._stop = threading.Event()
        self.source, self.why_not, self._read = self._reader()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = time.monotonic()

    def _reader(self) -> tuple[str | None, str | None, Callable[[], dict] | None]:
        try:
            import pynvml  # type: ignore[import-not-found]
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(self.gpu)

            def nvml() -> dict:
                return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        "sm_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                        "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
                        "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
            return "pynvml", None, nvml
        except Exception:  # not installed, or no NVML here: try the command line tool
            pass
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None, "neither pynvml nor nvidia-smi is there: the clock and power were not read", None

        def cli() -> dict:
            line = subprocess.run([smi, f"--id={self.gpu}", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
            keys = ("sm_mhz", "sm_max_mhz", "power_w", "power_limit_w", "temp_c")
            return {k: _number(v) for k, v in zip(keys, line.split(","))}
        return "nvidia-smi", None, cli

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        if self._read is None:
            return
        try:
            got = self._read()
        except Exception as exc:  # a failed read is one sample's loss, said in it
            got = {"error": str(exc)[:120]}
        self.samples.append({"t_s": round(time.monotonic() - self._t0, 3), "during": self.now, **got})

    def __enter__(self) -> "Clocks":
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        self.now = "end"
        self.sample()

    def summary(self) -> dict:
        out: dict[str, Any] = {"source": self.source, "why_not": self.why_not, "every_s": self.every,
                               "samples": self.samples}
        for k in ("sm_mhz", "power_w", "power_limit_w", "temp_c"):
            vals = [s[k] for s in self.samples if isinstance(s.get(k), (int, float))]
            if vals:
                out[k] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
        return out


def _number(text: str) -> float | None:
    try:
        v = float(text.strip())
    except ValueError:
        return None  # "[N/A]" and the like
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------
# Where it ran

def provenance(torch: Any, device: Any) -> dict:
    """The device, driver, CUDA, torch, the date and the commit: what the numbers belong to."""
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git_commit": _commit(), "torch": str(torch.__version__), "cuda": getattr(torch.version, "cuda", None),
           "python": platform.python_version(), "device_kind": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(device=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                   memory_bytes=int(props.total_memory), sms=int(props.multi_processor_count),
                   driver=_driver(), cudnn=torch.backends.cudnn.version())
    else:
        out.update(device=platform.processor() or platform.machine(), driver=None, cudnn=None)
    return out


def _commit() -> str | None:
    """The checkout's commit: git's answer, else PARASIM_COMMIT (a copy without .git: docs/gpu.md)."""
    try:
        got = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if got.returncode == 0 and got.stdout.strip():
            return got.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("PARASIM_COMMIT") or None


def _driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        got = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
        return (got.stdout.strip().splitlines() or [None])[0]
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------------------

def sweep(torch: Any, device: Any, items: list[Item], skipped: list[dict], budget: float, warmup: int,
          repeats: int, clock: Callable[[], float] = time.monotonic,
          save: Callable[[dict], None] | None = None) -> dict:
    """Time every item in order; once the budget is spent, the rest are listed as skipped (out of time).
    `save`, when given, gets the results so far after each item ("complete": false), so a sweep stopped from
    outside still leaves what it measured; and the whole at the end."""
    start = clock()
    time_it = timer(torch, device)
    results: list[dict] = []
    with Clocks(every=1.0, gpu=device.index or 0) if device.type == "cuda" else _NoClocks() as clocks:
        for i, it in enumerate(items):
            spent = clock() - start
            if spent + it.estimate_s > budget:
                skipped = skipped + [{**_describe(x), "why": f"out of time: {spent:.1f} s of --budget {budget:g} s "
                                                             "spent"} for x in items[i:]]
                break
            clocks.now = f"{it.kind} {it.name} " + " ".join(f"{k}={v}" for k, v in it.sizes.items())
            results.append(measure(torch, it, device, time_it, warmup, repeats))
            if save is not None:
                save({"complete": False, "items": results, "skipped": skipped + [
                    {**_describe(x), "why": "not reached yet"} for x in items[i + 1:]], "clocks": clocks.summary(),
                      "elapsed_s": round(clock() - start, 3)})
    done = {"complete": True, "items": results, "skipped": skipped, "clocks": clocks.summary(),
            "elapsed_s": round(clock() - start, 3)}
    if save is not None:
        save(done)
    return done


class _NoClocks:
    now = ""

    def __enter__(self) -> "_NoClocks":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def summary(self) -> dict:
        return {"source": None, "why_not": "the CPU has no SM clock to read", "samples": []}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1 <= value <= 3600:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"seconds must be a number from 1 to 3600, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]  # one line, as parasim's own commands do
        print(f"gpu_kernels: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="gpu_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list every item with its estimated time; run nothing "
                    "(torch is not imported)")
    ap.add_argument("--budget", type=_seconds, default=210.0, metavar="S",
                    help="seconds for the whole sweep (default 210): items past it by their estimates are left out, "
                         "and once it is spent the rest; both are listed as skipped")
    ap.add_argument("--out", metavar="FILE.json", help="where to write the results (default gpu-kernels.json)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default), or cpu with --tiny")
    ap.add_argument("--tiny", action="store_true", help="a handful of small items, one warm-up and three repeats: "
                    "the timing and the file checked end to end on any machine")
    args = ap.parse_args(argv)
    if args.device == "cpu" and not (args.tiny or args.dry_run):
        ap.error("--device cpu times only the --tiny items (a CPU at the models' sizes would take hours)")
    warmup, repeats = (1, 3) if args.tiny else (WARMUP, REPEATS)
    items, left = plan(args.tiny)
    estimate(items, warmup, repeats)
    kept, skipped = within(items, args.budget)
    skipped = left + skipped
    if args.dry_run:
        total = START_S + sum(i.estimate_s for i in kept)
        print(f"{len(kept)} items, estimated {total:.0f} s of --budget {args.budget:g} s on an H200 (parasim's "
              f"figures; {START_S:g} s to start):")
        for it in kept:
            print("  " + _line(it))
        for s in skipped:
            print(f"  skipped: {s['kind']} {s['name']} " + " ".join(f"{k}={v}" for k, v in s.items()
                                                                   if k not in ("kind", "name", "why", "sources"))
                  + f": {s['why']}")
        return 0
    try:
        import torch
    except ImportError:
        print(f"gpu_kernels: {sys.executable} cannot import torch", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_kernels: no CUDA GPU visible to {sys.executable}: nothing to time (--dry-run lists the items, "
              "--device cpu --tiny runs a few on the CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    head = {"format": FORMAT, "provenance": provenance(torch, device),
            "settings": {"budget_s": args.budget, "warmup": warmup, "repeats": repeats, "tiny": args.tiny,
                         "estimate": "parasim's H200 figures (clock/costs.py), fp8 at twice bf16's peak"}}
    out = Path(args.out or "gpu-kernels.json")

    def save(part: dict) -> None:  # written whole each time, through a temporary: never half a file
        tmp = out.with_name(out.name + ".part")
        tmp.write_text(json.dumps({**head, **part}, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, out)
    done = sweep(torch, device, kept, skipped, args.budget, warmup, repeats, save=save)
    ok = sum("error" not in r for r in done["items"])
    print(f"gpu_kernels: {ok} of {len(done['items'])} items timed, {len(done['skipped'])} skipped, "
          f"{done['elapsed_s']:.0f} s; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
