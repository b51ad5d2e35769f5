"""Kernel costs as data: what matrix products, attention, memory passes and collectives reach on a GPU type,
from published measurements, each table with its source (SOURCES; docs/notes/kernel-costs.md quotes every
figure). Nothing here is fitted to a training run, and the clock does not read it yet.

Each lookup answers a `Lookup`: the value (a share of hardware.py's datasheet figure, or bytes per second),
the sources it read, and notes saying what it clamped, stood in for or assumed. Between measured points it
interpolates linearly in the logarithm of the size (so it is monotone between two neighbours and returns a
measured point's own figure there); outside them it holds the nearest edge and says so, and says when the
asked size is more than 2x past the edge. A GPU type hardware.py does not know is refused.

The large tables are JSON under data/ (one table a line): gemm.json, attention.json, collectives.json."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import product
from math import log2, prod
from numbers import Integral
from pathlib import Path
from typing import Any

from ..comm.ops import OPS, bus_factor
from ..errors import UsageError
from ..limits import read_json
from .hardware import GPUS
from .hardware import table as datasheet_table

DATA = Path(__file__).resolve().parent / "data"
READ = "2026-12-05"  # the date every source below was read for this table


@dataclass(frozen=True)
class Source:
    """Where a table's numbers come from: the document, its address, where in it, and what was measured."""

    document: str
    address: str
    where: str  # table, figure or file, and the version read
    measured: str  # GPU, clocks or power where said, library versions where said


SOURCES: dict[str, Source] = {
    "xla-gemm": Source(
        "OpenXLA, GPU cost model's default matmul performance table",
        "https://github.com/openxla/xla/blob/main/xla/service/gpu/model/default_matmul_perf_table.txtpb",
        "key sm_90, entries with b: 1, flops 'bf16xbf16->bf16'; read in the ROCm/xla mirror of openxla main, "
        "commit 183fa00cb5d8 (2026-08-22)",
        "H100 (sm_90; commit b2766086ec 'Update ... cost model for GEMMS on H100'; the SKU is not stated, but "
        "805 TFLOP/s at its best exceeds the PCIe card's 756 dense peak); xla/tools/matmul_perf_table_gen: FLOP/s "
        "= 2bmnk / runtime of the HLO dot; CUDA, cuBLAS and clocks not stated",
    ),
    "xla-gemm-b200": Source(
        "OpenXLA, GPU cost model's default matmul performance table",
        "https://github.com/openxla/xla/blob/"
        "336bb15c32a11820a81b226ae502d9ebbfab4412/xla/service/gpu/model/default_matmul_perf_table.txtpb",
        "key sm_100_B200, entries with b: 1 (m, n, k each 256-4096), flops 'bf16xbf16->bf16' and "
        "'f8e4m3fnxf8e4m3fn->bf16'; openxla/xla commit 336bb15c32a1 (its sm_90 entries are the xla-gemm table's, "
        "value for value)",
        "B200 (sm_100); xla/tools/matmul_perf_table_gen: FLOP/s = 2bmnk / runtime of the HLO dot; CUDA, cuBLAS and "
        "clocks not stated. Its best BF16 product at b: 1 is 1417 TFLOP/s (4096 cubed), below MAMF's search best "
        "(1745 at 1792x16128x3072): a B200 is not yet full at 4096 cubed (the same table's b: 4 at 4096 cubed, four "
        "such products in one launch, reaches 1670)",
    ),
    "cuda11-blog": Source(
        "NVIDIA Developer Blog, 'CUDA 11 Features Revealed' (2020), Figure 6 'Mixed-precision matrix multiply on "
        "A100 with cuBLAS'",
        "https://developer.nvidia.com/blog/cuda-11-features-revealed/",
        "the figure as ml-engineering reproduces it (compute/accelerator/images/nvidia-a100-matmul-tflops.png, "
        "commit 744d01e18b); BF16 points read off the plot by pixel position, +-4 TFLOP/s",
        "A100 at launch (2020: the 40GB SXM4 card; the figure does not say), cuBLAS of CUDA 11.0, m = n = k",
    ),
    "mamf": Source(
        "S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table'",
        "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md",
        "FP8 (float8_e4m3fn) rows, commit 744d01e18b (2026-08-22)",
        "torch.mm, mean of 100 iterations after 50 warmup, best shape of a brute-force search; H100 SXM torch "
        "2.7.0+cu126, H200 SXM torch 2.7.1+cu128; 'Theory' column 1979 = FP8 dense peak, twice BF16's 989",
    ),
    "mamf-bf16": Source(
        "S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table'",
        "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md",
        "the BF16 table's A100 row, commit 744d01e18b (2026-08-22): '| NVIDIA A100 SXM | 271.2 | 312 | 86.9% | "
        "1024x10240x5120 | 2.6.0+cu126 |'",
        "A100 SXM (the table's 'Theory' 312 TFLOP/s), torch.mm, mean of 100 iterations after 50 warmup, the best "
        "shape of a brute-force search over shapes, torch 2.6.0+cu126",
    ),
    "fa2-a100": Source(
        "T. Dao, FlashAttention-2 (arXiv 2307.08691), Figure 4: attention forward + backward speed on A100",
        "https://arxiv.org/abs/2307.08691",
        "Figure 4 as the repository prints it: Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png "
        "(commit 4f285b35, 2023-07-17); bar labels, two hidden by the legend read from bar heights",
        "A100 80GB SXM4, FP16/BF16, hidden 2048, batch x sequence = 16k tokens; library versions not stated",
    ),
    "fa2-h100": Source(
        "T. Dao, FlashAttention-2 (arXiv 2307.08691), Figure 7: attention forward + backward speed on H100",
        "https://arxiv.org/abs/2307.08691",
        "assets/flash2_h100_fwd_bwd_benchmark.png in Dao-AILab/flash-attention (commit 4f285b35); bar labels",
        "H100 80GB SXM5, the A100 code without Hopper instructions, FP16/BF16, hidden 2048, 16k tokens",
    ),
    "fa3-paper": Source(
        "J. Shah et al., FlashAttention-3 (arXiv 2407.08608v2), Figures 5 (forward) and 6 (backward)",
        "https://arxiv.org/abs/2407.08608",
        "the bar labels of Figures 5 and 6 in the PDF's text layer (pdftotext); backward is published without "
        "the causal mask only",
        "H100 80GB SXM5, FP16, hidden 2048, 16k tokens; FlashAttention-3 beta of July 2024 (CUDA >= 12.3)",
    ),
    "cudnn-b200": Source(
        "NVIDIA cudnn-frontend, SDPA training benchmark (benchmark/sdpa_benchmark_training)",
        "https://github.com/NVIDIA/cudnn-frontend/tree/0b1577c/benchmark/sdpa_benchmark_training",
        "artifacts/sdpa_fp8_benchmark_results_NVIDIA_B200.csv, its bf16 rows (cuDNN through cudnn-frontend 1.14.1, "
        "as TransformerEngine calls it; the same commit's sdpa_bf16 file times cuDNN through PyTorch, slower below "
        "8k), commit 0b1577c (2025-10-10, 'cudnn frontend v1.15 release notes'; the artifacts left in b372d39)",
        "one B200 ('NVIDIA B200' in the log), free clock, cuDNN 9.13.1, CUDA 13.0, NGC PyTorch 25.09; batch 1, 128 "
        "query heads and 8 key/value heads, head dim 128, causal, BF16; median of 10 iterations after 5 dry runs; "
        "FLOPs as FlashAttention counts them, over the query heads",
    ),
    "fa-pr2605": Source(
        "Dao-AILab/flash-attention pull request 2605 ('Bump nvidia-cutlass-dsl to >=4.5.2 and quack-kernels to "
        ">=0.5.0', J. Ma, 2026-05-30), its B200 forward table",
        "https://github.com/Dao-AILab/flash-attention/pull/2605",
        "the cuDNN column of the forward table whose MFU is over 2.25 PF (the benchmark's B200 peak), head dim 64, "
        "causal and not; the backward tables and the rest of head dim 128 were not read",
        "one B200, driver 580.159.03, CUDA 13.1, NGC PyTorch 26.02; clocks locked (the value was not read; the "
        "author's issue 2570 locks the same machine at 1755 MHz); benchmarks/benchmark_attn.py, 32k tokens a "
        "configuration, 32 heads, BF16, triton do_bench median of 100",
    ),
    "opencl-benchmark": Source(
        "M. Lehmann (ProjectPhysX), OpenCL-Benchmark README, its NVIDIA B200 example",
        "https://github.com/ProjectPhysX/OpenCL-Benchmark",
        "'Memory Bandwidth ( coalesced read ) 6668.71 GB/s' and '( coalesced write) 6502.72 GB/s', commit 4694a5b",
        "NVIDIA B200, driver 570.133.20, 148 SMs at 1965 MHz as OpenCL reports them; 4-byte coalesced accesses",
    ),
    "fluidx3d": Source(
        "M. Lehmann (ProjectPhysX), FluidX3D README, performance table",
        "https://github.com/ProjectPhysX/FluidX3D",
        "the 'B200 SXM6 180GB' row, FP32/FP32: 42152 MLUPs/s (81% of 8000 GB/s), at 153 bytes a lattice update "
        "(the README's count), commit 8986874",
        "a D3Q19 lattice-Boltzmann update, bound by memory alone: 19 values loaded and 19 stored a cell, a mixed "
        "load and store stream as an elementwise pass is; the same table gives the H200 73%, the H100 SXM 80% and "
        "the A100 SXM4 80GB 77%",
    ),
    "gpu-benches": Source(
        "D. Ernst, gpu-benches: gpu-stream",
        "https://github.com/te42kyfo/gpu-benches/tree/master/gpu-stream",
        "a100_80.txt and h200.txt (commit 1c36d509), the last row: block size 1024, 100% occupancy",
        "A100 80GB (the repository's plot script gives it 2,039 GB/s: the SXM card) and H200 (variant not "
        "stated); STREAM-like kernels init, read, scale, triad; CUDA version not stated",
    ),
    "flashmla": Source(
        "DeepSeek, FlashMLA README",
        "https://github.com/deepseek-ai/FlashMLA",
        "'The dense MLA decoding kernel achieves up to 3000 GB/s in memory-bound configuration ... on H800 SXM5 "
        "with CUDA 12.8'",
        "H800 SXM5 (an H100 die with cut NVLink; same 3.35 TB/s HBM3, per third-party pages, not a datasheet), "
        "a read-dominated decode kernel, CUDA 12.8",
    ),
    "xla-collectives": Source(
        "OpenXLA, GPU cost model's default collective performance table",
        "https://github.com/openxla/xla/blob/main/xla/service/gpu/model/default_collective_perf_table.txtpb",
        "key sm_90, all-reduce, all-gather, reduce-scatter, all-to-all (F32) in groups of 2, 4 and 8 of one "
        "8-GPU node; same mirror commit as xla-gemm",
        "H100 node (sm_90); collective_perf_table_gen.cc: network_throughput = the whole buffer (all-gather "
        "output, reduce-scatter input) / median runtime, which is nccl-tests' algbw; NCCL version not stated",
    ),
    "mamf-b200": Source(
        "S. Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table'",
        "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md",
        "the NVIDIA B200 SXM rows of the BF16 and FP8 (float8_e4m3fn) tables, commit 744d01e18b (2026-08-22): "
        "MAMF 1745.0, best shape 1792x16128x3072; FP8 3432.5, best shape 15360x4096x3072",
        "torch.mm, mean of 100 iterations after 50 warmup, best shape of a brute-force search; B200 SXM, torch "
        "2.7.1+cu128; 'Theory' columns 2250 (BF16) and 4500 (FP8), the dense peaks hardware.py reads",
    ),
    "mle-a100-allreduce": Source(
        "S. Bekman, Machine Learning Engineering, network chapter, 'Real network throughput'",
        "https://github.com/stas00/ml-engineering/blob/master/network/README.md",
        "nccl-tests all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50, busbw column (commit 744d01e18b)",
        "one 8x A100 node (NVLink 3); NCCL version not stated",
    ),
    "mle-h200-allreduce": Source(
        "S. Bekman, Machine Learning Engineering, network chapter: the 8x H200 all_reduce_bench.py sweep",
        "https://github.com/stas00/ml-engineering/blob/master/network/README.md",
        "busbw column, 32KiB-16GiB (commit 744d01e18b); setup in network/benchmarks/README.md",
        "one 8x H200 node, torch 2.9.1+cu130, CUDA 13.0, NCCL 2.27.7, 5 warmup and 20 trials a size; NCCL "
        "picks ring/LL up to 1MiB and NVLink SHARP (NVLS) from 2MiB, so large sizes pass the 450 GB/s wire",
    ),
    "mle-b200-allreduce": Source(
        "S. Bekman, Machine Learning Engineering, network chapter, 'Inter-node speed depends on intra-node speed'",
        "https://github.com/stas00/ml-engineering/blob/master/network/README.md",
        "the all_reduce busbw table's '1 node' column, 32KiB-16GiB (commit 744d01e18b)",
        "one 8x B200 node (AWS p6-b200.48xlarge, NVLink 5), all_reduce_bench.py, torch 2.9.1+cu130, CUDA 13.0, "
        "NCCL 2.27.7; the same chapter's SHARP sweep on that node type has NCCL pick NVLS at 8 GPUs (8GiB), so "
        "large sizes can pass what a ring reaches",
    ),
    "nccl-ndr": Source(
        "NVIDIA/nccl-tests issue 290, comment by NVIDIA's AddyLaddy (2025-03-03)",
        "https://github.com/NVIDIA/nccl-tests/issues/290",
        "'For NDR @ 400Gbps you should see 46-48GB/s per NIC' (two nodes, NCCL_ALGO=RING); the low end is used",
        "H100 nodes with ConnectX-7 NDR InfiniBand (the thread's system); large messages, size not given",
    ),
    "deepep": Source(
        "DeepSeek, DeepEP README (normal kernels, internode)",
        "https://github.com/deepseek-ai/DeepEP",
        "V1 README, commit 2be0d4f8 (2025-10-21): dispatch and combine 'bottleneck bandwidth' at EP 16, 32, 64",
        "H800, one ConnectX-7 400 Gb/s RDMA NIC a GPU ('~50 GB/s maximum'), 4096 tokens a batch, hidden 7168, "
        "FP8 dispatch and BF16 combine; NVLink-forwarded traffic counted, so figures can pass 50",
    ),
    "overlap-2507": Source(
        "'Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance "
        "and Power Implications' (arXiv 2507.03114v1), abstract",
        "https://arxiv.org/abs/2507.03114",
        "'an average computational slowdown of 18.9%, with a maximum of 40.0% slowdown' against compute alone",
        "4 A100s, H100s, MI250 and MI210 pooled, GPT and LLaMA models; no per-GPU breakdown was read",
    ),
    "flux-paper": Source(
        "L.-W. Chang et al. (ByteDance), FLUX: Fast Software-based Communication Overlap on GPUs Through Kernel "
        "Fusion (arXiv 2406.06858, version of 2024-10-25), sections 5.1 and 6",
        "https://arxiv.org/abs/2406.06858",
        "section 6: average overlap efficiency, Flux 40%, 63%, 72% and TransformerEngine -67%, -61%, 20% on A100 "
        "PCIe, A100 NVLink and H800 NVLink clusters; section 5.1's H800 ranges: Flux 37-93%, TransformerEngine "
        "-40% to 80%",
        "TP 8 in one node; GPT-3 175B's all-gather + GEMM (n 49152, k 12288) and GEMM + reduce-scatter (n 12288, k "
        "49152) at m 1024-8192 tokens, BF16; TransformerEngine 1.4.0 with userbuffers, the best of its "
        "configurations; overlap efficiency = 1 - (overlapped - the fastest GEMM alone) / (GEMM and collective "
        "one after the other - that GEMM): the share of the collective's time hidden, net of what overlapping "
        "costs the GEMM",
    ),
    "nccl-src": Source(
        "NVIDIA NCCL source, v2.30.7",
        "https://github.com/NVIDIA/nccl",
        "commit 5067397c: src/transport/nvls.cc NVLS_NCHANNELS_SM90 16; src/init.cc ring maxChannels = "
        "MAXCHANNELS / 2; src/include/device.h MAXCHANNELS 64; docs env.rst: NCCL_MAX_CTAS replaces "
        "NCCL_MAX_NCHANNELS (one CTA a channel)",
        "defaults of the library, not a measurement",
    ),
    "mle-sms": Source(
        "S. Bekman, Machine Learning Engineering, accelerator chapter",
        "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md",
        "'A100-80GB has ... 108 Streaming Multiprocessors', 'H100 has ... 132 Streaming Multiprocessors', note 16 "
        "'H200 is the same as H100 but has 141GiB' (commit 744d01e18b)",
        "specifications",
    ),
}

# An H200 is an H100 die with larger, faster memory and the same NVLink 4 node (mle-sms note 16; the MAMF table
# says of matmuls 'H200 is the same'): where no H200 measurement exists, the H100's stands in.
TWIN = {"h200": "h100", "h800": "h100"}
TWIN_WHY = "the same die: its SMs and clocks (an H200 has larger, faster memory; an H800 a narrower NVLink)"
# Hopper's FP8 tensor cores run at twice BF16's rate (the MAMF table's 'Theory' column: 1979 against 989), and so
# do Blackwell's (4500 against 2250: 'mamf-b200'); the A100 has none. NVLink SHARP's channel count (nccl-src) is
# NCCL's sm90 default: Hopper's alone here.
FP8_OVER_BF16 = 2
HOPPER = ("h100", "h200", "h800")
FP8_GPUS = HOPPER + ("b200",)


class NoMeasurement(UsageError):
    """A GPU type hardware.py knows with no published measurement of this kernel (nor a twin's): it is refused,
    never guessed, and a caller that can answer without the time (memory planning) says so and goes on."""


@dataclass(frozen=True)
class Lookup:
    """One answer: `value` (a share of a datasheet figure, or bytes/s), the `sources` read (SOURCES keys) and
    `notes`: every clamp, stand-in or assumption made on the way; empty when read straight off the data."""

    value: float
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _stand_in(gpu: str, have: set[str], what: str) -> tuple[str | None, list[str]]:
    """The GPU type whose measurement answers for `gpu`: its own, else its TWIN's (with a note), else None."""
    if gpu in have:
        return gpu, []
    twin = TWIN.get(gpu)
    if twin in have:
        return twin, [f"no {what} measured on {gpu}; the {twin}'s stands in ({TWIN_WHY})"]
    return None, []


def _measured_on(gpu: str, have: set[str], what: str) -> tuple[str, list[str]]:
    """_stand_in, refusing a GPU type with neither its own nor its twin's measurement."""
    on, notes = _stand_in(gpu, have, what)
    if on is None:
        raise NoMeasurement(
            f"no {what} measured on {gpu} yet, so parasim cannot time it there (measured on "
            f"{', '.join(sorted(have))}; another die's figures do not stand in)"
        )
    return on, notes


def _load(name: str) -> list[dict]:
    return read_json((DATA / name).read_bytes(), name, "a kernel-cost table")["tables"]


def _scaled(v: float, unit: str) -> int | float:
    """A figure in base units: TFLOP/s and GB/s as printed (three decimals at most) to exact integers."""
    scale = {"TFLOP/s": 10**9, "GB/s": 10**6}.get(unit)
    return round(v * 1000) * scale if scale else v


def _check_gpu(gpu: str) -> None:
    if gpu not in GPUS:
        raise UsageError(f"unknown GPU type {gpu!r}: kernel costs know {', '.join(GPUS)}")


def _whole(what: str, v: Any, least: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral) or v < least:
        raise UsageError(f"{what} must be a whole number of at least {least}, not {v!r}")
    return int(v)


def _edge(what: str, x: float, xs: list[float]) -> tuple[float, list[str]]:
    """x held inside [xs[0], xs[-1]], with a note when it was outside."""
    lo, hi = xs[0], xs[-1]
    if lo <= x <= hi:
        return x, []
    edge = lo if x < lo else hi
    far = " (more than 2x past it)" if x < lo / 2 or x > hi * 2 else ""
    side = "smallest" if x < lo else "largest"
    return edge, [f"{what} {x:g} is outside the measured {lo:g}-{hi:g}; read at the {side}, {edge:g}{far}"]


def _between(xs: list[float], x: float) -> tuple[int, int, float]:
    """The neighbours of x in sorted xs and x's place between them, linear in log2 (x inside the range): 0 at
    a measured point, so its own figure comes back exactly."""
    j = bisect_right(xs, x)
    if j == len(xs):
        return j - 1, j - 1, 0.0
    return j - 1, j, (log2(x) - log2(xs[j - 1])) / (log2(xs[j]) - log2(xs[j - 1]))


def _along(what: str, xs: list[float], ys: list[float], x: float) -> tuple[float, list[str]]:
    """ys at x, linear in log2(x) between measured points, held at the ends (with a note)."""
    x, notes = _edge(what, x, xs)
    i, j, t = _between(xs, x)
    return ys[i] + t * (ys[j] - ys[i]), notes


# -- matrix products ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmTable:
    """Measured products of one GPU type and dtype: a full grid over m, n, k; a square sweep (m = n = k); or one
    point. `points`: (m, n, k) -> FLOP/s."""

    gpu: str
    dtype: str
    kind: str
    source: str
    points: dict[tuple[int, int, int], int | float]
    # each dim's measured sizes, in order: what a lookup interpolates between (held-out ranges look up thousands)
    axes: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", tuple(tuple(sorted({p[a] for p in self.points})) for a in range(3)))


GEMM: tuple[GemmTable, ...] = tuple(
    GemmTable(
        t["gpu"], t["dtype"], t["kind"], t["source"], {(m, n, k): _scaled(v, t["unit"]) for m, n, k, v in t["points"]}
    )
    for t in _load("gemm.json")
)


def _peak(gpu: str, dtype: str) -> float:
    """The dense tensor-core peak of hardware.py for `dtype` (FP8: twice BF16, Hopper only)."""
    if dtype == "bf16":
        return GPUS[gpu].peak_flops.value
    if dtype == "fp8":
        if gpu not in FP8_GPUS:
            raise UsageError(f"{gpu} has no FP8 tensor cores; FP8 products run on {', '.join(FP8_GPUS)}")
        return FP8_OVER_BF16 * GPUS[gpu].peak_flops.value
    raise UsageError(f"unknown dtype {dtype!r} for a product: bf16 or fp8")


def _grid(t: GemmTable, shape: tuple[int, int, int]) -> tuple[float, list[str]]:
    """Multilinear in log2(m), log2(n), log2(k) over the grid's corners; each side held at the grid's edge."""
    spans, notes = [], []
    for name, xs, x in zip("mnk", t.axes, shape):
        x, more = _edge(name, x, xs)
        notes += more
        i, j, w = _between(xs, x)
        spans.append([(xs[i], 1.0 - w), (xs[j], w)])
    value = 0.0
    for corner in product(*spans):
        value += prod(w for _, w in corner) * t.points[tuple(x for x, _ in corner)]
    return value, notes


# the kinds of table, the most shape-aware first: a GPU type and dtype with several is read from the first
GEMM_KINDS = ("grid", "square", "point")


def _gemm_table(gpu: str, dtype: str, kinds: tuple[str, ...] = GEMM_KINDS) -> GemmTable | None:
    """The most shape-aware table of `gpu` and `dtype` among `kinds`; None where it has none."""
    have = [t for t in GEMM if t.gpu == gpu and t.dtype == dtype and t.kind in kinds]
    return min(have, key=lambda t: GEMM_KINDS.index(t.kind)) if have else None


def _profile_grid(gpu: str, dtype: str) -> GemmTable | None:
    """The grid a best-shape point is read through: the die's own grid of the point's dtype (the B200's), else
    its BF16 grid, on the GPU type itself or its twin (Hopper FP8 reads the H100's BF16 grid); None where the die
    has no grid."""
    for d in dict.fromkeys((dtype, "bf16")):
        on, _ = _stand_in(gpu, {t.gpu for t in GEMM if t.dtype == d and t.kind == "grid"}, "")
        if on is not None:
            return _gemm_table(on, d, ("grid",))
    return None


def _profiled(
    point: GemmTable, grid: GemmTable, shape: tuple[int, int, int], peak: float
) -> tuple[float, tuple[str, ...], list[str]]:
    """A product measured at one best shape (the MAMF table's brute-force best), read at `shape` through a grid
    of the same die: its share times the grid's figure at `shape` over the grid's at the measured shape, never
    above the measured best (no shape beat it in the search). At the measured shape it is the measurement."""
    ((best_shape, flops),) = point.points.items()
    best = flops / peak
    at, notes = _grid(grid, shape)
    there, _ = _grid(grid, best_shape)
    value = min(best, best * at / there)
    return (
        value,
        (point.source, grid.source) if value < best else (point.source,),
        notes
        + [
            f"{point.dtype} measured at one shape on {point.gpu} ({'x'.join(map(str, best_shape))}, its best: "
            f"{best:.3f}); at other shapes it falls off as the {grid.gpu} {grid.dtype.upper()} grid does from that "
            "shape, never above the best"
        ]
        if shape != best_shape
        else [],
    )


# The best BF16 product a brute-force search over shapes measured on a GPU type (FLOP/s, source): a table read off
# an older plot that passes it is held to it (NVIDIA's CUDA 11 blog gives the A100 290 TFLOP/s at 8192 cubed, above
# the 271.2 any shape reached with torch 2.6)
BF16_CEILING: dict[str, tuple[int, str]] = {"a100": (271_200_000_000_000, "mamf-bf16")}


def gemm_efficiency(gpu: str, m: int, n: int, k: int, dtype: str = "bf16") -> Lookup:
    """The share of hardware.py's dense peak (FP8: twice the BF16 peak) an (m x k) @ (k x n) product reaches.

    Sources (SOURCES): H100 BF16 from OpenXLA's measured matmul table ('xla-gemm', sm_90, m, n, k in
    256-4096, a full grid); A100 BF16 from NVIDIA's CUDA 11 blog, Figure 6 ('cuda11-blog', cuBLAS, square
    products 512-8192, read off the plot); FP8 on H100 and H200 from one best shape each in Bekman's MAMF table
    ('mamf'), falling off at other shapes as the H100 BF16 grid does (`_profiled`: OpenXLA's FP8 entries for
    sm_90 exceed the FP8 dense peak, up to 2.42 PFLOP/s against 1.98, so they are not used); B200 BF16 and FP8
    from one best shape each in the same table ('mamf-b200'), falling off at other shapes as OpenXLA's B200
    grid of the same dtype does ('xla-gemm-b200'; read straight, that grid would cap every product at its
    4096-cube edge, 63% of the BF16 peak, where the search found 78% at a larger shape). H200 BF16 reads the
    H100's table (the MAMF table: 'H200 is the same'). A non-square product on the A100 is read at the side of
    the cube of the same volume, an assumption the notes state, and held to the best BF16 product MAMF's search
    measured on the card ('mamf-bf16', BF16_CEILING)."""
    _check_gpu(gpu)
    m, n, k = (_whole(w, v) for w, v in (("m", m), ("n", n), ("k", k)))
    peak = _peak(gpu, dtype)
    on, notes = _measured_on(gpu, {t.gpu for t in GEMM if t.dtype == dtype}, f"{dtype} product")
    # a brute-force search's best shape, where one was measured, is the ceiling; a grid says how products fall off
    point, grid = _gemm_table(on, dtype, ("point",)), _profile_grid(on, dtype)
    if point is not None and grid is not None:
        value, sources, more = _profiled(point, grid, (m, n, k), peak)
        return Lookup(value, sources, tuple(notes + more))
    table = _gemm_table(on, dtype)
    if table.kind == "grid":
        flops, more = _grid(table, (m, n, k))
    elif table.kind == "square":
        side = m if m == n == k else (m * n * k) ** (1 / 3)
        if side != m:
            notes.append(
                f"the {table.gpu} data are square products only; {m}x{n}x{k} is read at the side of the "
                f"cube of the same volume, {side:.0f} (an assumption)"
            )
        sides = sorted(p[0] for p in table.points)
        flops, more = _along("side", sides, [table.points[(s, s, s)] for s in sides], side)
        ceiling = BF16_CEILING.get(table.gpu) if dtype == "bf16" else None
        if ceiling is not None and flops > ceiling[0]:
            more.append(
                f"{flops / 1e12:.1f} TFLOP/s read off {table.source} is above the best any shape reached "
                f"in a search on the card ({ceiling[0] / 1e12:.1f}, {ceiling[1]}): held to it"
            )
            return Lookup(ceiling[0] / peak, (table.source, ceiling[1]), tuple(notes + more))
    else:
        ((shape, flops),) = table.points.items()
        more = (
            []
            if shape == (m, n, k)
            else [
                f"one {dtype} product measured on {table.gpu} ({'x'.join(map(str, shape))}, its best shape); its "
                "figure is used for every shape"
            ]
        )
    return Lookup(flops / peak, (table.source,), tuple(notes + more))


# -- attention ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionTable:
    """One figure's bars: a kernel's TFLOP/s by sequence length for one GPU, pass, mask and head dim."""

    gpu: str
    kernel: str
    pass_: str
    causal: bool
    head_dim: int
    source: str
    seq: tuple[int, ...]
    flops: tuple[int, ...]  # FLOP/s, FLOPs counted as the papers count them


ATTENTION: tuple[AttentionTable, ...] = tuple(
    AttentionTable(
        t["gpu"],
        t["kernel"],
        t["pass"],
        t["causal"],
        t["head_dim"],
        t["source"],
        tuple(t["seq"]),
        tuple(_scaled(v, "TFLOP/s") for v in t["tflops"]),
    )
    for t in _load("attention.json")
)
# the kernels in the order a GPU type gets them unless one is named: cuDNN's fused attention where it was measured
# (B200: what TransformerEngine runs there), else the newest FlashAttention measured
KERNELS = ("cudnn", "fa3", "fa2", "fa1")
# the GPU types a kernel runs on where that is not every one: FlashAttention-3 is written for Hopper's tensor cores
# (its paper and README: H100/H800, 'Requirements: H100 / H800 GPU')
ATTENTION_RUNS_ON: dict[str, tuple[str, ...]] = {"fa3": HOPPER}
BOTH = "forward+backward"
PASSES = {False: "forward", True: "backward", None: BOTH}  # attention_efficiency's `backward` -> the pass
BACKWARD_FLOPS = 2.5  # the papers' count: the backward pass is 2.5x the forward's FLOPs (5 matmuls against 2)


def _attention_tables(gpu: str, kernel: str, pass_: str, causal: bool) -> list[AttentionTable]:
    return [t for t in ATTENTION if (t.gpu, t.kernel, t.pass_, t.causal) == (gpu, kernel, pass_, causal)]


def attention_efficiency(
    gpu: str, seq: int, head_dim: int, causal: bool, backward: bool | None, kernel: str | None = None
) -> Lookup:
    """The share of hardware.py's dense BF16 peak FlashAttention reaches, FLOPs counted as its papers count them
    (forward 4 s^2 d h, halved with the causal mask; backward 2.5x forward). `backward`: True for the backward
    pass, False for the forward, None for both together (as FlashAttention-2's Figures 4 and 7 time them).

    Sources (SOURCES): A100: FlashAttention-2's Figure 4 ('fa2-a100', forward + backward only; FlashAttention
    1 ('fa1') from the same figure's bars, the kernel of 2022-23's A100 runs); H100:
    FlashAttention-2's Figure 7 ('fa2-h100', forward + backward) and FlashAttention-3's Figures 5 and 6
    ('fa3-paper': FlashAttention-2 and -3 forward, head dims 64, 128, 256; backward without the causal mask,
    head dims 64 and 128). H200 reads the H100's figures. B200: cuDNN's fused attention ('cudnn'), forward and
    backward with the causal mask at head dim 128, sequences 512-128k ('cudnn-b200'), and forward at head dim 64
    with and without it ('fa-pr2605'). Sequences 512-16k elsewhere; where a pass, a head dim or the causal mask
    was not published, the nearest published figure is used and the notes say which."""
    _check_gpu(gpu)
    seq, head_dim = _whole("sequence length", seq), _whole("head dim", head_dim)
    on, notes = _measured_on(gpu, {t.gpu for t in ATTENTION}, "attention")
    have = [k for k in KERNELS if any(t.gpu == on and t.kernel == k for t in ATTENTION)]
    if kernel is not None and kernel not in KERNELS:
        raise UsageError(f"unknown attention kernel {kernel!r}: {', '.join(KERNELS)}")
    if kernel is not None and kernel not in have:
        # a kernel that cannot run on the GPU is refused; one that runs there unmeasured (cuDNN's fused attention on
        # an H100) is NoMeasurement: a published run naming it is listed as not timed, memory planning goes on
        stands = "" if on == gpu else f" (which stands in for {gpu})"
        runs_on = ATTENTION_RUNS_ON.get(kernel, tuple(GPUS))
        if gpu not in runs_on:
            raise UsageError(
                f"no {kernel!r} attention measured on {on}{stands}: {', '.join(have)} ({kernel} runs on "
                f"{', '.join(runs_on)} only)"
            )
        raise NoMeasurement(f"no {kernel!r} attention measured on {on}{stands}: {', '.join(have)}")
    kernel = kernel or have[0]
    if backward not in PASSES:
        raise UsageError(f"backward must be True, False or None (both passes), not {backward!r}")
    pass_ = PASSES[backward]
    tables = _attention_tables(on, kernel, pass_, causal)
    if not tables and pass_ == BOTH:
        # both passes' FLOPs (1 + 2.5 forwards) over both passes' times
        f, b = (attention_efficiency(gpu, seq, head_dim, causal, p, kernel) for p in (False, True))
        said = f"no forward + backward figure for {kernel} on {on}: its forward and backward combined by time"
        return Lookup(
            (1 + BACKWARD_FLOPS) / (1 / f.value + BACKWARD_FLOPS / b.value),
            tuple(sorted(set(f.sources + b.sources))),
            tuple(dict.fromkeys(f.notes + b.notes + (said,))),
        )
    if not tables and _attention_tables(on, kernel, BOTH, causal):
        tables = _attention_tables(on, kernel, BOTH, causal)
        notes.append(f"{kernel} on {on} is published for forward + backward together; that figure is used")
    if not tables and causal and _attention_tables(on, kernel, pass_, False):
        tables = _attention_tables(on, kernel, pass_, False)
        notes.append(
            f"{kernel} {pass_} on {on} is published without the causal mask only; that figure is used, "
            "which overstates short causal sequences"
        )
    elif not tables:
        tables = _attention_tables(on, kernel, pass_, True)
        notes.append(
            f"{kernel} {pass_} on {on} is published with the causal mask only; that figure is used, "
            "which understates short sequences without it"
        )
    dims = sorted(t.head_dim for t in tables)
    by_dim = {t.head_dim: t for t in tables}
    # only the head dims the answer is read between (each table may span its own sequences)
    d_at, dim_notes = _edge("head dim", head_dim, dims)
    i, j, _ = _between(dims, d_at)
    dims = sorted({dims[i], dims[j]})
    at_dim, seq_notes = [], []
    for d in dims:
        flops, more = _along("sequence length", list(by_dim[d].seq), list(by_dim[d].flops), seq)
        at_dim.append(flops)
        seq_notes += [n for n in more if n not in seq_notes]
    flops, _ = _along("head dim", dims, at_dim, head_dim)
    return Lookup(
        flops / GPUS[gpu].peak_flops.value,
        tuple(sorted({by_dim[d].source for d in dims})),
        tuple(notes + seq_notes + dim_notes),
    )


# -- memory-bound passes --------------------------------------------------------------------------------

# Measured HBM bandwidth, GB/s as printed: gpu -> kernel -> (GB/s, source). gpu-benches' kernels: init
# (A[i] = c: one store stream), read (sum += A[i]), scale (A[i] = B[i] * c: one load, one store, an elementwise
# pass), triad (A[i] = B[i] + c * C[i]); the H100's one figure is FlashMLA's read-dominated decode on an H800.
MEMORY: dict[str, dict[str, tuple[float, str]]] = {
    "a100": {
        "init": (1880, "gpu-benches"),
        "read": (1769, "gpu-benches"),
        "scale": (1732, "gpu-benches"),
        "triad": (1759, "gpu-benches"),
    },
    "h200": {
        "init": (3884, "gpu-benches"),
        "read": (2756, "gpu-benches"),
        "scale": (3165, "gpu-benches"),
        "triad": (3534, "gpu-benches"),
    },
    "h100": {"read": (3000, "flashmla")},
    # B200: OpenCL-Benchmark's coalesced read and write; FluidX3D's lattice update (as much read as written, as
    # `scale` is) at 42152 MLUPs/s x 153 B
    "b200": {
        "read": (6668.71, "opencl-benchmark"),
        "init": (6502.72, "opencl-benchmark"),
        "scale": (6449.256, "fluidx3d"),
    },
}
MEMORY_KERNELS = ("init", "read", "scale", "triad")


def memory_efficiency(gpu: str, kernel: str = "scale") -> Lookup:
    """The share of hardware.py's HBM bandwidth a streaming kernel reaches (default: `scale`, one load and one
    store stream, what an elementwise pass does).

    Sources (SOURCES): A100 80GB and H200 from gpu-benches' gpu-stream at full occupancy ('gpu-benches');
    H100 from FlashMLA's 'up to 3000 GB/s' on an H800 SXM5 ('flashmla'), a read-dominated kernel used for
    every kind of pass (the notes say so); B200 from OpenCL-Benchmark's coalesced read and write
    ('opencl-benchmark') and FluidX3D's lattice update for `scale` ('fluidx3d': as many bytes loaded as
    stored), `triad` read as `scale`."""
    _check_gpu(gpu)
    if kernel not in MEMORY_KERNELS:
        raise UsageError(f"unknown streaming kernel {kernel!r}: {', '.join(MEMORY_KERNELS)}")
    on, notes = _measured_on(gpu, set(MEMORY), "memory bandwidth")
    measured = MEMORY[on]
    if kernel not in measured and len(measured) == 1:
        ((kernel_read, (gbps, source)),) = measured.items()
        notes.append(
            f"only a {kernel_read}-dominated kernel was measured for {gpu} ('{source}': "
            f"{SOURCES[source].measured}); its figure stands in for {kernel}"
        )
    elif kernel not in measured:  # triad (two loads, one store) as the mixed stream measured
        gbps, source = measured["scale"]
        notes.append(f"no {kernel} measured for {gpu}; the scale figure (a load and a store stream) stands in")
    else:
        gbps, source = measured[kernel]
    return Lookup(_scaled(gbps, "GB/s") / GPUS[gpu].hbm.value, (source,), tuple(notes))


# -- collectives ----------------------------------------------------------------------------------------

INSIDE, ACROSS = "inside", "across"  # the links, as comm/hops.py names them


@dataclass(frozen=True)
class CollectiveTable:
    """One NVLink node's sweep: bus bandwidth (bytes/s) by buffer size for an op and a group size."""

    gpu: str
    op: str
    members: int
    source: str
    sizes: tuple[int, ...]
    busbw: tuple[float, ...]


def _busbw(t: dict) -> tuple[float, ...]:
    values = [_scaled(v, t["unit"]) for _, v in t["points"]]
    if t["metric"] == "busbw":
        return tuple(values)
    return tuple(v * bus_factor(t["op"], t["members"]) for v in values)


COLLECTIVES: tuple[CollectiveTable, ...] = tuple(
    CollectiveTable(t["gpu"], t["op"], t["members"], t["source"], tuple(s for s, _ in t["points"]), _busbw(t))
    for t in _load("collectives.json")
)


@dataclass(frozen=True)
class Plateau:
    """A large-message bandwidth across nodes, per GPU, with the line rate of the NIC it was measured on."""

    bytes_per_s: int
    line_rate: int
    source: str


# Across nodes: no size-resolved sweep on these GPU types was found, only large-message figures.
# ("all_reduce", None): ring busbw per NIC; ("all_to_all", EP size): the lower of DeepEP's dispatch and combine.
ACROSS_PLATEAUS: dict[tuple[str, int | None], Plateau] = {
    ("all_reduce", None): Plateau(46 * 10**9, 50 * 10**9, "nccl-ndr"),
    ("all_to_all", 16): Plateau(43 * 10**9, 50 * 10**9, "deepep"),
    ("all_to_all", 32): Plateau(57 * 10**9, 50 * 10**9, "deepep"),
    ("all_to_all", 64): Plateau(50 * 10**9, 50 * 10**9, "deepep"),
}


def _across(gpu: str, op: str, members: int, network: float | None = None) -> Lookup:
    notes = [
        "no size-resolved sweep across nodes was found; the large-message figure is used at every size, "
        "which overstates small messages"
    ]
    if op == "all_to_all":
        sizes = sorted(e for o, e in ACROSS_PLATEAUS if o == op)
        at = min(sizes, key=lambda e: (abs(log2(e) - log2(members)), e))
        if at != members:
            notes.append(f"no all-to-all of {members} measured across nodes; the nearest, {at}, is read")
        plateau = ACROSS_PLATEAUS[(op, at)]
        notes.append(f"DeepEP's EP-{at} figure (H800, ConnectX-7 400 Gb/s), the lower of dispatch and combine")
    else:
        plateau = ACROSS_PLATEAUS[("all_reduce", None)]
        if op != "all_reduce":
            notes.append(f"the ring all-reduce figure is used for {op} (nccl-tests' busbw compares across ops)")
    sheet = GPUS[gpu].network.value
    rate = sheet if network is None else network
    if rate != plateau.line_rate:
        whose = f"{gpu}'s" if rate == sheet else "the cluster's"
        notes.append(
            f"measured on a {plateau.line_rate / 1e9:g} GB/s NIC; its share of the line is applied to "
            f"{whose} {rate / 1e9:g} GB/s"
        )
    return Lookup(plateau.bytes_per_s * (rate / plateau.line_rate), (plateau.source,), tuple(notes))


def collective_bandwidth(
    gpu: str, op: str, nbytes: int, where: str, members: int = 8, network: float | None = None
) -> Lookup:
    """The bus bandwidth (bytes/s, nccl-tests' busbw) a collective of `nbytes` (the whole buffer) reaches among
    `members` GPUs: the time is nbytes x bus_factor(op, members) / value (comm/ops.bus_factor: nccl-tests').

    Sources (SOURCES): inside an H100 node OpenXLA's measured collective table ('xla-collectives': all four ops,
    groups of 2, 4, 8, 1 KiB-2 GiB); inside an A100 node nccl-tests' all-reduce in ml-engineering
    ('mle-a100-allreduce'); inside an H200 node ml-engineering's all-reduce sweep ('mle-h200-allreduce', with
    NVLink SHARP); inside a B200 node its all-reduce sweep on AWS p6-b200 ('mle-b200-allreduce'). An H200's
    other ops read the H100's tables (same NVLink 4 node); an op without its own sweep reads the GPU's
    all-reduce (A100, B200). Across nodes: NVIDIA's 46-48 GB/s per NDR NIC ('nccl-ndr') and DeepEP's
    all-to-all ('deepep'), large messages only, each as its share of the NIC's line rate applied to `network`
    (bytes/s a GPU, one direction; the GPU sheet's without it: a cluster with other NICs gives its own)."""
    _check_gpu(gpu)
    if OPS.get(op) is None or OPS[op].bus_factor is None:
        raise UsageError(f"no bandwidth for {op!r}: {', '.join(o for o, e in OPS.items() if e.bus_factor)}")
    if where not in (INSIDE, ACROSS):
        raise UsageError(f"where must be {INSIDE!r} or {ACROSS!r}, not {where!r}")
    nbytes, members = _whole("bytes", nbytes), _whole("members", members, 2)
    if where == ACROSS:
        return _across(gpu, op, members, network)
    on, notes = _stand_in(gpu, {t.gpu for t in COLLECTIVES if t.op == op}, op)
    if on is None:
        on, notes = _measured_on(gpu, {t.gpu for t in COLLECTIVES if t.op == "all_reduce"}, "all_reduce")
        notes.append(f"no {op} measured on {gpu}; its all-reduce busbw is used (nccl-tests' busbw compares across ops)")
        op = "all_reduce"
    tables = [t for t in COLLECTIVES if t.gpu == on and t.op == op]
    have = sorted(t.members for t in tables)
    if members not in have:
        near = min(have, key=lambda e: (abs(log2(e) - log2(members)), e))
        notes.append(f"no group of {members} measured; the group of {near} is read")
        members = near
    t = next(t for t in tables if t.members == members)
    value, more = _along("bytes", list(t.sizes), list(t.busbw), nbytes)
    # a message takes no longer than a larger one (it could be padded to it): the time read is never above the
    # least time measured at any size at or above it, which smooths a sweep's noisy small points (OpenXLA's
    # 1 KiB ones took longer than its 2 KiB ones). Below the smallest size measured that least time is what the
    # message takes, latency: the busbw held there would have 8 bytes cross in nanoseconds
    if nbytes <= t.sizes[-1]:
        least = min(s / b for s, b in zip(t.sizes, t.busbw) if s >= nbytes)
        if nbytes < t.sizes[0] or nbytes / least > value * (1 + 1e-9):  # (a point's own time: not raised)
            value = nbytes / least
            more.append("the least time measured at this size or above (a message takes no longer than a larger one)")
    if on != gpu and GPUS[on].nvlink.value != GPUS[gpu].nvlink.value:  # the same die on a narrower NVLink (H800)
        ratio = GPUS[gpu].nvlink.value / GPUS[on].nvlink.value
        value *= ratio
        more.append(f"{on}'s bus bandwidth scaled by {gpu}'s NVLink over {on}'s ({ratio:.2f}: the datasheets')")
    return Lookup(value, (t.source,), tuple(notes + more))


# -- overlap --------------------------------------------------------------------------------------------

# How much slower compute runs beside communication, as a share of its time alone ('overlap-2507': pooled over
# A100, H100, MI250, MI210).
OVERLAP: dict[str, tuple[float, str]] = {"mean": (0.189, "overlap-2507"), "max": (0.400, "overlap-2507")}
# NCCL's CTAs (one a channel) by algorithm, and the SMs they share: ring is an upper bound (the topology search
# picks up to 32 channels); NVLink SHARP's 16 is the sm90 default and needs Hopper.
NCCL_CTAS: dict[str, tuple[int, str]] = {"ring": (32, "nccl-src"), "nvls": (16, "nccl-src")}
SMS: dict[str, tuple[int, str]] = {
    "a100": (108, "mle-sms"),
    "h100": (132, "mle-sms"),
    "h200": (132, "mle-sms"),
    "h800": (132, "mle-sms"),
}


def overlap_slowdown(gpu: str, statistic: str = "mean") -> Lookup:
    """The share by which compute slows when communication runs beside it (its time alone x (1 + value)).

    Source (SOURCES): 'overlap-2507', the mean (18.9%) and maximum (40.0%) over A100, H100, MI250 and MI210
    pooled; the same figure for every GPU type, and the notes say so."""
    _check_gpu(gpu)
    if statistic not in OVERLAP:
        raise UsageError(f"unknown statistic {statistic!r}: {', '.join(OVERLAP)}")
    value, source = OVERLAP[statistic]
    notes = ["pooled over A100, H100, MI250 and MI210; no per-GPU figure was found"]
    if gpu not in ("a100", "h100"):
        notes.append(f"{gpu} was not among the GPUs measured")
    return Lookup(value, (source,), tuple(notes))


# TP's collectives overlapped with the products that need them, by implementation: the share of the collective's
# time hidden, net of what the overlap costs the products ('flux-paper', section 6's averages over its
# operation-level shapes). Negative: slower than not overlapping at all, as measured.
TP_OVERLAP: dict[str, dict[str, tuple[float, str]]] = {
    "te-userbuffers": {"h800": (0.20, "flux-paper"), "a100": (-0.61, "flux-paper")},
    "flux": {"h800": (0.72, "flux-paper"), "a100": (0.63, "flux-paper")},
}
TP_OVERLAP_ON = {"h100": "h800", "h200": "h800"}  # Hopper reads the H800's (the same die)


def tp_overlap_efficiency(gpu: str, kernel: str = "te-userbuffers") -> Lookup:
    """The share of TP's collective time hidden behind the products it feeds, net of what overlapping costs
    them: 'te-userbuffers' (TransformerEngine's userbuffers: Megatron-LM's --tp-comm-overlap, NeMo's
    ub_tp_comm_overlap) or 'flux' (ByteDance's fused kernels).

    Source (SOURCES): 'flux-paper', the averages of its operation-level evaluation at TP 8 (A100 NVLink and H800
    NVLink); an H100 or H200 reads the H800's (same die, NVLink 2.25x wider, so a shorter collective beside the
    same product: not measured). Why this figure: it is the only one printed for TransformerEngine's userbuffers on
    a Hopper GPU; a later TransformerEngine's ring-exchange all-gather was derived at 60-87% hidden from one very
    large product (NVIDIA/Fuser PR 5259: throughputs, not the product's time alone), which is not a measurement of
    the share and is not used. torch's async TP has none at training shapes, and TransformerEngine's stands in.
    The clock applies the share to TP's time up to the products' length (the part that can run beside them); a
    negative share, as measured on an A100, adds that much."""
    _check_gpu(gpu)
    table = TP_OVERLAP.get(kernel)
    if table is None:
        raise UsageError(f"unknown TP overlap kernel {kernel!r}: {', '.join(TP_OVERLAP)}")
    on, notes = gpu, []
    if gpu not in table and TP_OVERLAP_ON.get(gpu) in table:
        on = TP_OVERLAP_ON[gpu]
        notes.append(f"no TP overlap measured on {gpu}; the {on}'s stands in (the same die, a narrower NVLink)")
    if on not in table:
        raise NoMeasurement(
            f"no TP overlap ({kernel}) measured on {gpu} yet, so parasim cannot time it there "
            f"(measured on {', '.join(sorted(table))})"
        )
    value, source = table[on]
    notes.append("an average over TP 8 products at 1,024-8,192 tokens (GPT-3 175B's shapes), not per shape")
    if kernel == "te-userbuffers":
        notes.append(
            "TransformerEngine 1.4.0 (early 2024), the best of its configurations; later versions' "
            "ring-exchange all-gather is not in this figure"
        )
    if value < 0:
        notes.append("negative: the overlapped pair ran slower than the product and the collective one after the other")
    return Lookup(value, (source,), tuple(notes))


def nccl_sm_share(gpu: str, algorithm: str = "nvls") -> Lookup:
    """The share of a GPU's SMs NCCL's kernel holds: its CTAs (one a channel) over the SM count, an upper bound
    on the compute it takes if each CTA holds an SM.

    Sources (SOURCES): NCCL 2.30.7's defaults ('nccl-src': 16 NVLS channels on sm90, at most 32 ring channels)
    and the SM counts in ml-engineering ('mle-sms')."""
    _check_gpu(gpu)
    if algorithm not in NCCL_CTAS:
        raise UsageError(f"unknown NCCL algorithm {algorithm!r}: {', '.join(NCCL_CTAS)}")
    on, notes = _measured_on(gpu, set(SMS), "SM count")
    if algorithm == "nvls" and gpu not in HOPPER:
        raise UsageError(f"NVLink SHARP (nvls) needs Hopper's NVSwitch; {gpu} runs ring")
    ctas, source = NCCL_CTAS[algorithm]
    sms, sm_source = SMS[on]
    if algorithm == "ring":
        notes.append("at most: NCCL's topology search picks up to 32 ring channels")
    return Lookup(ctas / sms, (source, sm_source), tuple(notes))


# -- what `parasim hardware` shows of these tables ----------------------------------------------------

# (label, lookup) of a few points every GPU type is shown at: the tables' shape, not every point
SAMPLES: tuple[tuple[str, Any], ...] = (
    ("product 4096^3 (share of peak)", lambda g: gemm_efficiency(g, 4096, 4096, 4096)),
    ("product 1024^3 (share of peak)", lambda g: gemm_efficiency(g, 1024, 1024, 1024)),
    ("attention forward, 4k causal, d 128", lambda g: attention_efficiency(g, 4096, 128, True, False)),
    ("attention backward, 4k causal, d 128", lambda g: attention_efficiency(g, 4096, 128, True, True)),
    ("elementwise pass (share of HBM)", lambda g: memory_efficiency(g)),
    ("all-reduce inside a node, 1 GiB (busbw GB/s)", lambda g: collective_bandwidth(g, "all_reduce", 2**30, INSIDE)),
    ("all-reduce across nodes (busbw GB/s)", lambda g: collective_bandwidth(g, "all_reduce", 2**30, ACROSS)),
    ("TP overlap, share of the collective hidden", lambda g: tp_overlap_efficiency(g)),
)


# What the clock reads of each GPU type, one lookup a kind: a type lacking one has no step time that runs it
NEEDED: tuple[tuple[str, Any], ...] = (
    ("BF16 product", lambda g: gemm_efficiency(g, 4096, 4096, 4096)),
    ("attention", lambda g: attention_efficiency(g, 4096, 128, True, None)),
    ("memory bandwidth", lambda g: memory_efficiency(g)),
    ("collective inside a node", lambda g: collective_bandwidth(g, "all_reduce", 2**30, INSIDE)),
    ("TP overlap", lambda g: tp_overlap_efficiency(g)),  # read only when TP's overlap is switched on
)


def lacking(gpu: str) -> list[str]:
    """The kinds of kernel the clock reads that have no measurement on `gpu` (nor a twin's): NEEDED's names."""
    missing = []
    for what, lookup in NEEDED:
        try:
            lookup(gpu)
        except NoMeasurement:
            missing.append(what)
    return missing


def summary() -> dict[str, Any]:
    """The tables at SAMPLES' points for every GPU type, with the sources each read and its notes; the kinds of
    kernel each type has no measurement of ("lacking": NEEDED's names); and every source: what `parasim hardware`
    prints and `--json` gives."""
    gpus = {}
    for gpu in GPUS:
        rows = {}
        for label, lookup in SAMPLES:
            try:
                got = lookup(gpu)
            except UsageError as exc:  # a GPU type without the measurement: said, not guessed
                rows[label] = {"value": None, "sources": [], "notes": [str(exc)]}
                continue
            rows[label] = {"value": got.value, "sources": list(got.sources), "notes": list(got.notes)}
        gpus[gpu] = rows
    return {
        "samples": gpus,
        "lacking": {gpu: lacking(gpu) for gpu in GPUS},
        "sources": {
            k: {"document": v.document, "address": v.address, "where": v.where, "measured": v.measured}
            for k, v in SOURCES.items()
        },
    }


def hardware_table() -> dict[str, Any]:
    """What `parasim hardware` shows: the datasheet table (hardware.table) and the kernel measurements' summary."""
    return {**datasheet_table(), "kernels": summary()}
