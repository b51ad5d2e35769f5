"""Kernel costs as data (issue 50): every table names a source with an address, each lookup names its sources in
its docstring, a lookup at a measured point returns the source's own figure over hardware.py's datasheet figure
(the expected values below are copied from the sources, not from the module: docs/notes/kernel-costs.md quotes
each), interpolation between neighbours is monotone and in log space, shares lie in (0, 1], and anything
outside the data is clamped and says so."""
from dataclasses import replace
from math import log2

import pytest

from parasim.comm import hops, interface
from parasim.errors import UsageError
from parasim.estimate import kernels as K
from parasim.estimate.hardware import GPUS, Figure

# what each lookup may read, by SOURCES key: each must be named in its docstring
READS = {
    K.gemm_efficiency: {"xla-gemm", "cuda11-blog", "mamf", "mamf-b200", "mamf-bf16", "xla-gemm-b200"},
    K.attention_efficiency: {"fa2-a100", "fa2-h100", "fa3-paper", "cudnn-b200", "fa-pr2605"},
    K.memory_efficiency: {"gpu-benches", "flashmla", "opencl-benchmark", "fluidx3d"},
    K.collective_bandwidth: {"xla-collectives", "mle-a100-allreduce", "mle-h200-allreduce", "mle-b200-allreduce",
                             "nccl-ndr", "deepep"},
    K.overlap_slowdown: {"overlap-2507"},
    K.nccl_sm_share: {"nccl-src", "mle-sms"},
    K.tp_overlap_efficiency: {"flux-paper"},
}


def _sources_of_tables() -> dict:
    """Each lookup -> the sources its tables name."""
    return {
        K.gemm_efficiency: {t.source for t in K.GEMM} | {s for _, s in K.BF16_CEILING.values()},
        K.attention_efficiency: {t.source for t in K.ATTENTION},
        K.memory_efficiency: {s for kinds in K.MEMORY.values() for _, s in kinds.values()},
        K.collective_bandwidth: {t.source for t in K.COLLECTIVES} | {p.source for p in K.ACROSS_PLATEAUS.values()},
        K.overlap_slowdown: {s for _, s in K.OVERLAP.values()},
        K.nccl_sm_share: {s for _, s in K.NCCL_CTAS.values()} | {s for _, s in K.SMS.values()},
        K.tp_overlap_efficiency: {s for on in K.TP_OVERLAP.values() for _, s in on.values()},
    }


def test_every_table_names_a_source_with_an_address_and_every_source_is_read():
    tables = _sources_of_tables()
    for fn, used in tables.items():
        assert used == READS[fn], fn.__name__
        for key in used:
            s = K.SOURCES[key]
            assert s.address.startswith("https://") and s.document and s.where and s.measured, key
    assert set().union(*tables.values()) == set(K.SOURCES)


def test_each_lookup_names_its_sources_in_its_docstring():
    for fn, keys in READS.items():
        for key in keys:
            assert f"'{key}'" in fn.__doc__, (fn.__name__, key)


def _exact(lookup: K.Lookup, value: float, source: str) -> None:
    assert lookup.value == value and lookup.sources == (source,) and lookup.notes == ()


def test_products_at_measured_shapes_are_the_sources_figures_over_the_dense_peak():
    """OpenXLA sm_90 b=1 'bf16xbf16->bf16' FLOP/s; NVIDIA's A100 figure (TFLOP/s read off the plot); MAMF FP8
    best shapes (TFLOP/s) over twice the BF16 peak."""
    _exact(K.gemm_efficiency("h100", 4096, 4096, 4096), 780193877565849 / 989e12, "xla-gemm")
    _exact(K.gemm_efficiency("h100", 256, 256, 256), 6721641025641 / 989e12, "xla-gemm")
    _exact(K.gemm_efficiency("h100", 1024, 2048, 256), 144320137634408 / 989e12, "xla-gemm")
    _exact(K.gemm_efficiency("h100", 4096, 2048, 2048), 727467360433604 / 989e12, "xla-gemm")
    _exact(K.gemm_efficiency("a100", 4096, 4096, 4096), 261e12 / 312e12, "cuda11-blog")
    # the blog's 290 at 8192 cubed (and 277, 281 at 6144, 7168) pass MAMF's best A100 BF16 product, 271.2
    for side in (6144, 7168, 8192):
        held = K.gemm_efficiency("a100", side, side, side)
        assert held.value == 271.2e12 / 312e12 and held.sources == ("cuda11-blog", "mamf-bf16")
        assert "held to it" in held.notes[-1]
    _exact(K.gemm_efficiency("a100", 5120, 5120, 5120), 263e12 / 312e12, "cuda11-blog")
    _exact(K.gemm_efficiency("a100", 512, 512, 512), 29e12 / 312e12, "cuda11-blog")
    _exact(K.gemm_efficiency("h100", 1024, 9216, 14336, "fp8"), 1402.6e12 / (2 * 989e12), "mamf")
    _exact(K.gemm_efficiency("h200", 1280, 4096, 12032, "fp8"), 1453.4e12 / (2 * 989e12), "mamf")
    h200 = K.gemm_efficiency("h200", 4096, 4096, 4096)
    assert h200.value == 780193877565849 / 989e12 and "h100" in h200.notes[0]


def test_an_fp8_product_away_from_its_one_measured_shape_falls_off_as_the_bf16_grid_does():
    """MAMF's H100 FP8 best (1402.6 TFLOP/s at 1024x9216x14336, over 2 x 989) scaled by OpenXLA's BF16 sm_90 grid:
    1024^3 (252764082862523 FLOP/s) over the best shape as the grid reads it, clamped to 1024x4096x4096
    (751920044817927); a large product is held at the best, which no shape beat in MAMF's search."""
    best = 1402.6e12 / (2 * 989e12)
    small = K.gemm_efficiency("h100", 1024, 1024, 1024, "fp8")
    assert small.value == pytest.approx(best * 252764082862523 / 751920044817927, rel=1e-12)
    assert small.sources == ("mamf", "xla-gemm") and "falls off" in small.notes[-1]
    assert K.gemm_efficiency("h100", 4096, 4096, 4096, "fp8").value == pytest.approx(best, rel=1e-12)


def test_products_between_grid_points_are_linear_in_log2_of_each_side():
    """m = 1448 sits at log2(1448) - 10 of the way from 1024 to 2048 (n = 4096, k = 4096 on the grid)."""
    at_1024, at_2048 = 751920044817927, 752315168330705  # (1024 and 2048, 4096, 4096) in the source
    t = log2(1448) - 10
    got = K.gemm_efficiency("h100", 1448, 4096, 4096)
    assert got.value == pytest.approx((at_1024 + t * (at_2048 - at_1024)) / 989e12, rel=1e-12)
    assert got.notes == ()
    # the A100's square sweep: 2896 between 2048 (198) and 3072 (237)
    t = (log2(2896) - 11) / (log2(3072) - 11)
    assert K.gemm_efficiency("a100", 2896, 2896, 2896).value == pytest.approx((198 + t * (237 - 198)) / 312, rel=1e-12)


def test_attention_at_measured_lengths_is_the_figures_bar_over_the_dense_peak():
    """FlashAttention-3 Figures 5 and 6 (H100), FlashAttention-2 Figures 4 (A100) and 7 (H100), TFLOP/s."""
    _exact(K.attention_efficiency("h100", 16384, 128, False, False), 648e12 / 989e12, "fa3-paper")
    _exact(K.attention_efficiency("h100", 512, 64, True, False), 197e12 / 989e12, "fa3-paper")
    _exact(K.attention_efficiency("h100", 512, 64, False, True), 272e12 / 989e12, "fa3-paper")
    _exact(K.attention_efficiency("h100", 8192, 128, False, True), 559e12 / 989e12, "fa3-paper")
    _exact(K.attention_efficiency("h100", 4096, 256, True, False, "fa2"), 293e12 / 989e12, "fa3-paper")
    _exact(K.attention_efficiency("h100", 16384, 128, False, None, "fa2"), 338e12 / 989e12, "fa2-h100")
    _exact(K.attention_efficiency("a100", 16384, 128, True, None), 189e12 / 312e12, "fa2-a100")
    _exact(K.attention_efficiency("a100", 1024, 64, False, None), 153e12 / 312e12, "fa2-a100")


@pytest.mark.parametrize("gpu, kernel, backward, causal, head_dim, row", [
    ("h100", "fa3", False, False, 128, [467, 565, 625, 638, 646, 648]),  # FA3 Figure 5c
    ("h100", "fa3", False, True, 256, [286, 427, 537, 612, 628, 642]),  # FA3 Figure 5f
    ("h100", "fa2", True, False, 64, [198, 238, 264, 279, 287, 291]),  # FA3 Figure 6a, FA2's bars
    ("h100", "fa2", None, True, 128, [163, 221, 265, 294, 308, 328]),  # FA2 Figure 7d
    ("a100", "fa2", None, True, 64, [88, 119, 140, 156, 165, 171]),  # FA2 Figure 4c
    ("a100", "fa2", None, False, 128, [151, 173, 187, 196, 201, 203]),  # FA2 Figure 4b (512 from the bar)
    ("a100", "fa1", None, False, 64, [91, 92, 104, 108, 110, 110]),  # FA2 Figure 4a, FlashAttention 1's bars
    ("a100", "fa1", None, True, 128, [55, 62, 69, 76, 80, 83]),  # FA2 Figure 4d, FlashAttention 1's bars
])
def test_whole_rows_of_the_attention_figures(gpu, kernel, backward, causal, head_dim, row):
    peak = {"h100": 989e12, "a100": 312e12}[gpu]
    got = [K.attention_efficiency(gpu, 512 * 2**i, head_dim, causal, backward, kernel).value for i in range(6)]
    assert got == [v * 1e12 / peak for v in row]


def test_attention_says_which_figure_stands_in():
    a100 = K.attention_efficiency("a100", 2048, 64, False, True)
    assert a100.value == 162e12 / 312e12 and "forward + backward" in a100.notes[0]
    fa2 = K.attention_efficiency("h100", 8192, 128, True, True, "fa2")  # FA2 causal backward: Figure 7's f + b
    assert fa2.value == 308e12 / 989e12 and fa2.sources == ("fa2-h100",)
    fa3 = K.attention_efficiency("h100", 8192, 128, True, True)  # FA3 causal backward: only non-causal published
    assert fa3.value == 559e12 / 989e12 and "without the causal mask" in fa3.notes[0]
    h200 = K.attention_efficiency("h200", 16384, 128, False, False)
    assert h200.value == 648e12 / 989e12 and "h100" in h200.notes[0]
    # FA3 both passes: 3.5 forwards of FLOPs over the two passes' times (forward 646, backward 559 at 8k, d128)
    both = K.attention_efficiency("h100", 8192, 128, False, None)
    assert both.value == pytest.approx(3.5 / (1 / 646 + 2.5 / 559) / 989, rel=1e-12)
    assert "combined by time" in both.notes[-1]
    # head dim 96 sits log2(96) - 6 of the way from 64 to 128: FA3 forward, 16k, no mask: 497 and 648
    t = log2(96) - 6
    assert K.attention_efficiency("h100", 16384, 96, False, False).value == pytest.approx(
        (497 + t * (648 - 497)) / 989, rel=1e-12)


def test_memory_passes_are_the_measured_bandwidth_over_the_datasheet():
    """gpu-benches gpu-stream, block size 1024 (A100 80GB: init 1880, scale 1732; H200: triad 3534 GB/s);
    FlashMLA's 3000 GB/s on an H800 SXM5."""
    _exact(K.memory_efficiency("a100"), 1732e9 / 2.039e12, "gpu-benches")
    _exact(K.memory_efficiency("a100", "init"), 1880e9 / 2.039e12, "gpu-benches")
    _exact(K.memory_efficiency("h200", "triad"), 3534e9 / 4.8e12, "gpu-benches")
    _exact(K.memory_efficiency("h100", "read"), 3000e9 / 3.35e12, "flashmla")
    stand_in = K.memory_efficiency("h100", "scale")
    assert stand_in.value == 3000e9 / 3.35e12 and "H800" in stand_in.notes[0]
    assert "read-dominated kernel" in stand_in.notes[0] and "stands in for scale" in stand_in.notes[0]


def test_collectives_at_measured_sizes_are_the_sources_bus_bandwidth():
    """OpenXLA's sm_90 throughput is nccl-tests' algbw: busbw = x 2(n-1)/n for an all-reduce (1.75 at 8),
    x (n-1)/n otherwise (0.875 at 8, 0.75 at 4, 0.5 at 2); ml-engineering prints busbw (GB/s)."""
    def busbw(gpu, op, nbytes, members=8):
        got = K.collective_bandwidth(gpu, op, nbytes, "inside", members)
        assert got.notes == (), got.notes
        return got.value
    assert busbw("h100", "all_reduce", 2147483648) == 229968237690 * 1.75
    assert busbw("h100", "all_reduce", 1048576) == 20189772027 * 1.75
    assert busbw("h100", "all_gather", 2147483648) == 401897616481 * 0.875
    assert busbw("h100", "reduce_scatter", 1048576) == 51280125195 * 0.875
    # OpenXLA's 1 KiB all-to-all among 8 took longer (110.7 us at 10,571,522 B/s) than its 64 KiB one (23.7 us
    # at 2,763,832,658 B/s), the least of its sweep: a message takes no longer than a larger one, so 1 KiB is
    # read at that least time
    slow = K.collective_bandwidth("h100", "all_to_all", 1024, "inside", 8)
    assert slow.value == pytest.approx(1024 / (65536 / (2763832658 * 0.875)), rel=1e-12)
    assert slow.notes == ("the least time measured at this size or above (a message takes no longer than a larger "
                          "one)",)
    assert busbw("h100", "all_reduce", 2147483648, 2) == 250289469463 * 1.0
    assert busbw("h100", "all_reduce", 4194304, 4) == 70888047593 * 1.5
    assert busbw("h100", "reduce_scatter", 2147483648, 4) == 383183624061 * 0.75
    assert busbw("h100", "all_to_all", 2147483648, 2) == 642663627744 * 0.5
    assert busbw("a100", "all_reduce", 17179869184) == 234.89e9
    assert busbw("a100", "all_reduce", 32768) == 1.31e9
    assert busbw("h200", "all_reduce", 17179869184) == 482.26e9
    assert busbw("h200", "all_reduce", 1048576) == 39.93e9
    across = K.collective_bandwidth("h100", "all_reduce", 2**30, "across")
    assert across.value == 46e9 and across.sources == ("nccl-ndr",) and "every size" in across.notes[0]
    assert K.collective_bandwidth("a100", "all_reduce", 2**30, "across").value == 23e9  # 46/50 of 25 GB/s
    assert K.collective_bandwidth("h200", "all_to_all", 2**30, "across", 32).value == 57e9
    assert K.collective_bandwidth("h100", "all_to_all", 2**30, "across", 16).value == 43e9


def test_collectives_read_a_stand_in_and_say_so():
    h200 = K.collective_bandwidth("h200", "all_gather", 2147483648, "inside")
    assert h200.value == 401897616481 * 0.875 and "h100" in h200.notes[0]
    a100 = K.collective_bandwidth("a100", "reduce_scatter", 17179869184, "inside")
    assert a100.value == 234.89e9 and "all-reduce" in a100.notes[0]
    group = K.collective_bandwidth("a100", "all_reduce", 17179869184, "inside", 4)
    assert group.value == 234.89e9 and "group of 8" in group.notes[0]
    three = K.collective_bandwidth("h100", "all_reduce", 1048576, "inside", 3)  # log2 3 is nearer 2 than 1
    assert three.value == K.collective_bandwidth("h100", "all_reduce", 1048576, "inside", 4).value
    assert "group of 4" in three.notes[0]
    gather = K.collective_bandwidth("h100", "all_gather", 2**30, "across")
    assert gather.value == 46e9 and "ring all-reduce figure is used for all_gather" in gather.notes[-1]
    hdr = K.collective_bandwidth("a100", "all_reduce", 2**30, "across")
    assert "applied to a100's 25 GB/s" in hdr.notes[-1]
    far = K.collective_bandwidth("h100", "all_to_all", 2**30, "across", 20)
    assert far.value == 43e9 and any("nearest, 16" in n for n in far.notes)
    assert K.collective_bandwidth("h100", "all_to_all", 2**30, "across", 24).value == 57e9  # log2 24 nearer 32


def test_overlap_and_nccl_sms():
    """arXiv 2507.03114: mean 18.9%, max 40.0% slowdown; NCCL: 16 NVLS CTAs on sm90, at most 32 ring; SMs
    108 (A100), 132 (H100, H200)."""
    assert K.overlap_slowdown("h100").value == 0.189 and K.overlap_slowdown("a100", "max").value == 0.400
    assert "h200 was not among" in K.overlap_slowdown("h200").notes[-1]
    assert K.nccl_sm_share("h100").value == 16 / 132 and K.nccl_sm_share("h200", "nvls").value == 16 / 132
    ring = K.nccl_sm_share("a100", "ring")
    assert ring.value == 32 / 108 and "at most" in ring.notes[0]
    with pytest.raises(UsageError, match="nvls"):
        K.nccl_sm_share("a100", "nvls")


def test_tp_overlap_is_the_flux_papers_average_efficiency():
    """arXiv 2406.06858 section 6: average overlap efficiency, Flux 63% (A100 NVLink) and 72% (H800 NVLink),
    TransformerEngine -61% and 20%; Hopper reads the H800's; a GPU type without a measurement is refused."""
    assert K.tp_overlap_efficiency("h800").value == 0.20 and K.tp_overlap_efficiency("h800", "flux").value == 0.72
    a100 = K.tp_overlap_efficiency("a100")
    assert a100.value == -0.61 and "negative" in a100.notes[-1]
    assert K.tp_overlap_efficiency("a100", "flux").value == 0.63
    for gpu in ("h100", "h200"):
        got = K.tp_overlap_efficiency(gpu)
        assert got.value == 0.20 and got.sources == ("flux-paper",) and "h800's stands in" in got.notes[0]
    with pytest.raises(K.NoMeasurement, match="measured on b200"):
        K.tp_overlap_efficiency("b200")


def test_across_nodes_the_share_of_the_line_is_applied_to_the_clusters_own_network():
    """A cluster whose NICs differ from the sheet's (InternLM's 4 x 100 Gb RoCE a node: 6.25 GB/s a GPU): the
    ring all-reduce's measured 46 of 50 GB/s applied to that rate."""
    got = K.collective_bandwidth("a100", "all_reduce", 2**30, "across", 8, network=6.25e9)
    assert got.value == pytest.approx(46 / 50 * 6.25e9, rel=1e-12) and "cluster's 6.25 GB/s" in got.notes[-1]
    assert K.collective_bandwidth("a100", "all_reduce", 2**30, "across").value == pytest.approx(46 / 50 * 25e9)


def _monotone_between(values: list[float], left: float, right: float) -> None:
    lo, hi = min(left, right), max(left, right)
    assert all(lo - 1e-12 <= v <= hi + 1e-12 for v in values)
    steps = [b - a for a, b in zip(values, values[1:])]
    assert all(s >= -1e-12 for s in steps) or all(s <= 1e-12 for s in steps)


def _inside(a: int, b: int) -> list[int]:
    return [round(a * (b / a) ** (i / 8)) for i in range(9)]


def test_interpolation_is_monotone_between_neighbours():
    grid = next(t for t in K.GEMM if t.kind == "grid")
    sides = sorted({m for m, _, _ in grid.points})
    for axis in range(3):
        for fixed in ((256, 4096), (1024, 2048), (4096, 512)):
            for a, b in zip(sides, sides[1:]):
                shapes = [list(fixed[:axis]) + [x] + list(fixed[axis:]) for x in _inside(a, b)]
                vals = [K.gemm_efficiency("h100", *s).value for s in shapes]
                _monotone_between(vals, vals[0], vals[-1])
    square = next(t for t in K.GEMM if t.kind == "square")
    sides = sorted(m for m, _, _ in square.points)
    for a, b in zip(sides, sides[1:]):
        vals = [K.gemm_efficiency("a100", x, x, x).value for x in _inside(a, b)]
        _monotone_between(vals, vals[0], vals[-1])
    for t in K.ATTENTION:
        for a, b in zip(t.seq, t.seq[1:]):
            back = {"forward": False, "backward": True, K.BOTH: None}[t.pass_]
            vals = [K.attention_efficiency(t.gpu, s, t.head_dim, t.causal, back, t.kernel).value for s in _inside(a, b)]
            assert vals[0] == t.flops[t.seq.index(a)] / GPUS[t.gpu].peak_flops.value
            _monotone_between(vals, vals[0], vals[-1])
    for t in K.COLLECTIVES:
        # a message takes no longer than a larger one: at the measured sizes a collective's time never falls as
        # the message grows (each point its source's figure, or the least time measured above it where that is
        # less), and between two it never takes longer than the least time measured at or above it; between
        # them busbw is read linearly in log2(size) as before
        at = [s / K.collective_bandwidth(t.gpu, t.op, s, "inside", t.members).value for s in t.sizes]
        assert all(y >= x * (1 - 1e-9) for x, y in zip(at, at[1:])), (t.gpu, t.op, t.members)
        for a, b in zip(t.sizes, t.sizes[1:]):
            least = min(x / y for x, y in zip(t.sizes, t.busbw) if x >= b)
            for s in _inside(a, b):
                got = K.collective_bandwidth(t.gpu, t.op, s, "inside", t.members).value
                assert s / got <= least * (1 + 1e-9)
            assert at[t.sizes.index(a)] == pytest.approx(min(a / t.busbw[t.sizes.index(a)], at[t.sizes.index(b)]),
                                                         rel=1e-9)


def test_every_share_lies_in_zero_to_one():
    for t in K.GEMM:
        for m, n, k in t.points:
            for gpu in (t.gpu, K.TWIN.get(t.gpu)):
                if gpu:
                    assert 0 < K.gemm_efficiency(gpu, m, n, k, t.dtype).value <= 1
    for t in K.ATTENTION:
        assert all(0 < f / GPUS[t.gpu].peak_flops.value <= 1 for f in t.flops)
    for gpu in GPUS:
        # the one table some GPU type lacks (the B200's TP overlap) is bounded in its own test
        assert K.lacking(gpu) == (["TP overlap"] if gpu == "b200" else []), (gpu, K.lacking(gpu))
        for kind in K.MEMORY_KERNELS:
            assert 0 < K.memory_efficiency(gpu, kind).value <= 1
        for side in (1, 100, 1000, 3000, 20000, 10**6):
            assert 0 < K.gemm_efficiency(gpu, side, 2 * side, side).value <= 1
            for causal in (False, True):
                for back in (False, True, None):
                    assert 0 < K.attention_efficiency(gpu, side, 128, causal, back).value <= 1
        for stat in K.OVERLAP:
            assert 0 < K.overlap_slowdown(gpu, stat).value <= 1


def test_the_denominators_are_hardware_pys(monkeypatch):
    """Double a GPU's datasheet peak, HBM and network in hardware.py: every share halves, the across-node
    bandwidth doubles (a share of the line), inside-node bandwidth (measured bytes/s) stays."""
    before = (K.gemm_efficiency("h100", 1024, 1024, 1024).value, K.gemm_efficiency("h100", 1024, 9216, 14336, "fp8")
              .value, K.attention_efficiency("h100", 4096, 64, False, False).value, K.memory_efficiency("h100").value,
              K.collective_bandwidth("h100", "all_reduce", 2**30, "across").value)
    inside = K.collective_bandwidth("h100", "all_reduce", 2**30, "inside").value
    g = GPUS["h100"]
    monkeypatch.setitem(GPUS, "h100", replace(g, peak_flops=Figure(2 * 989e12, "x", "h100"),
                                              hbm=Figure(2 * 3.35e12, "x", "h100"),
                                              network=Figure(2 * 50e9, "x", "dgx-h100")))
    after = (K.gemm_efficiency("h100", 1024, 1024, 1024).value, K.gemm_efficiency("h100", 1024, 9216, 14336, "fp8")
             .value, K.attention_efficiency("h100", 4096, 64, False, False).value, K.memory_efficiency("h100").value,
             K.collective_bandwidth("h100", "all_reduce", 2**30, "across").value)
    assert [a / b for a, b in zip(after, before)] == pytest.approx([0.5, 0.5, 0.5, 0.5, 2.0])
    assert K.collective_bandwidth("h100", "all_reduce", 2**30, "inside").value == inside


def test_outside_the_data_is_clamped_and_says_so():
    edge = K.gemm_efficiency("h100", 4096, 4096, 4096).value
    near = K.gemm_efficiency("h100", 8192, 4096, 4096)
    assert near.value == edge and near.notes == ("m 8192 is outside the measured 256-4096; read at the largest, 4096",)
    far = K.gemm_efficiency("h100", 4096, 16384, 4096)
    assert far.value == edge and "more than 2x past it" in far.notes[0] and far.notes[0].startswith("n 16384")
    small = K.gemm_efficiency("h100", 256, 256, 100)
    assert small.value == K.gemm_efficiency("h100", 256, 256, 256).value and "smallest" in small.notes[0]
    assert "m 128 is outside" in K.gemm_efficiency("b200", 128, 4096, 4096, "fp8").notes[0]
    odd = K.gemm_efficiency("a100", 8192, 4096, 1024)
    assert "square products only" in odd.notes[0]
    long = K.attention_efficiency("h100", 65536, 128, False, False)
    assert long.value == 648e12 / 989e12 and "more than 2x" in long.notes[0]
    assert "head dim 32" in K.attention_efficiency("h100", 4096, 32, False, False).notes[0]
    big = K.collective_bandwidth("h100", "all_reduce", 2**40, "inside")
    assert big.value == 229968237690 * 1.75 and "bytes" in big.notes[0]


@pytest.mark.parametrize("call, words", [
    (lambda: K.gemm_efficiency("x900", 1, 1, 1), "unknown GPU type 'x900'"),
    (lambda: K.gemm_efficiency("h100", 0, 1, 1), "m must be"),
    (lambda: K.gemm_efficiency("h100", 1.5, 1, 1), "m must be"),
    (lambda: K.gemm_efficiency("h100", 1, True, 1), "n must be"),
    (lambda: K.gemm_efficiency("a100", 1, 1, 1, "fp8"), "no FP8"),
    (lambda: K.gemm_efficiency("h100", 1, 1, 1, "fp16"), "unknown dtype"),
    (lambda: K.attention_efficiency("a100", 512, 64, False, False, "fa3"), "'fa3'"),
    (lambda: K.attention_efficiency("h100", 512, 64, False, "yes"), "backward must be"),
    (lambda: K.attention_efficiency("h100", 0, 64, False, False), "sequence length must be"),
    (lambda: K.attention_efficiency("h100", 512, 64.0, False, False), "head dim must be"),
    (lambda: K.memory_efficiency("h100", "copy"), "unknown streaming kernel"),
    (lambda: K.collective_bandwidth("h100", "barrier", 8, "inside"), "no bandwidth for 'barrier'"),  # moves nothing
    (lambda: K.collective_bandwidth("h100", "gather", 8, "inside"), "no bandwidth for 'gather'"),  # no such op
    (lambda: K.collective_bandwidth("h100", "all_reduce", 8, "rack"), "where must be"),
    (lambda: K.collective_bandwidth("h100", "all_reduce", 8, "inside", 1), "members must be"),
    (lambda: K.overlap_slowdown("h100", "median"), "unknown statistic"),
    (lambda: K.nccl_sm_share("h100", "tree"), "unknown NCCL algorithm"),
    (lambda: K.tp_overlap_efficiency("h100", "nccl"), "unknown TP overlap kernel"),
    (lambda: K.attention_efficiency("h100", 512, 64, False, None, "fa1"), "'fa1'"),
])
def test_bad_questions_are_one_line_usage_errors(call, words):
    with pytest.raises(UsageError, match=words) as info:
        call()
    assert "\n" not in str(info.value)


def test_a_gpu_type_without_measurements_is_refused(monkeypatch):
    """A GPU type hardware.py gains before any kernel was measured on it: every lookup says so in one line (a
    NoMeasurement, which callers that can answer without a time catch)."""
    monkeypatch.setitem(GPUS, "x900", GPUS["h100"])
    for call in (lambda: K.gemm_efficiency("x900", 1024, 1024, 1024), lambda: K.attention_efficiency(
            "x900", 1024, 128, False, False), lambda: K.memory_efficiency("x900"),
            lambda: K.collective_bandwidth("x900", "all_gather", 1024, "inside"), lambda: K.nccl_sm_share("x900"),
            lambda: K.tp_overlap_efficiency("x900")):
        with pytest.raises(K.NoMeasurement, match="measured on x900") as info:
            call()
        assert "\n" not in str(info.value)


def test_the_names_are_the_traces():
    assert {t.op for t in K.COLLECTIVES} == {interface.ALL_REDUCE, interface.REDUCE_SCATTER, interface.ALL_GATHER,
                                             interface.ALL_TO_ALL}
    assert (K.INSIDE, K.ACROSS) == (hops.INSIDE, hops.ACROSS)


def test_a_table_of_algorithm_bandwidth_is_read_as_bus_bandwidth():
    """A sweep printed as algbw becomes busbw by nccl-tests' factor (all-reduce over 8: 2 x 7/8; all-gather over
    4: 3/4); one printed as busbw is kept; GB/s are bytes/s x 10^9. Worked by hand (the tables are read at import,
    so the reader is called here on rows written out)."""
    algbw = {"unit": "GB/s", "metric": "algbw", "op": "all_reduce", "members": 8, "points": [[1024, 10.0], [2048, 20.5]]}
    assert K._busbw(algbw) == (17.5e9, 35.875e9)
    assert K._busbw({**algbw, "op": "all_gather", "members": 4}) == (7.5e9, 15.375e9)
    assert K._busbw({**algbw, "metric": "busbw", "points": [[1, 12.345]]}) == (12_345_000_000,)


def test_a_collectives_size_and_members_are_whole_numbers_named_in_the_error():
    with pytest.raises(UsageError, match=r"^bytes must be a whole number of at least 1, not 0$"):
        K.collective_bandwidth("h100", "all_reduce", 0, "inside")
    with pytest.raises(UsageError, match=r"^members must be a whole number of at least 2, not 1$"):
        K.collective_bandwidth("h100", "all_reduce", 1024, "inside", 1)


def test_an_h800_reads_the_h100s_tables_scaled_by_its_narrower_nvlink():
    """The H800 has no measurement of its own: the H100's (the same die) stands in, scaled by NVLink 200 over
    450 GB/s (hardware.py's datasheet figures); a broadcast, measured on no Hopper, reads the all-reduce first."""
    h100 = K.collective_bandwidth("h100", "all_reduce", 2**20, "inside", 8)
    twin = ("the same die: its SMs and clocks (an H200 has larger, faster memory; an H800 a narrower NVLink)")
    scaled = "h100's bus bandwidth scaled by h800's NVLink over h100's (0.44: the datasheets')"
    got = K.collective_bandwidth("h800", "all_reduce", 2**20, "inside", 8)
    assert got.value == pytest.approx(h100.value * 200 / 450, rel=1e-12) and got.sources == ("xla-collectives",)
    assert got.notes == (f"no all_reduce measured on h800; the h100's stands in ({twin})", scaled)
    got = K.collective_bandwidth("h800", "broadcast", 2**20, "inside", 8)
    assert got.value == pytest.approx(h100.value * 200 / 450, rel=1e-12)
    assert got.notes == (f"no all_reduce measured on h800; the h100's stands in ({twin})",
                         "no broadcast measured on h800; its all-reduce busbw is used (nccl-tests' busbw compares "
                         "across ops)", scaled)
    assert K.collective_bandwidth("h100", "all_reduce", 2**20, "inside", 8).notes == ()  # its own: no note
    # the H200 stands in with the H100's all-gather over the same NVLink (450 GB/s): read as it is, not scaled
    h200 = K.collective_bandwidth("h200", "all_gather", 2**20, "inside", 8)
    assert h200.value == K.collective_bandwidth("h100", "all_gather", 2**20, "inside", 8).value
    assert h200.notes == (f"no all_gather measured on h200; the h100's stands in ({twin})",)
    past = K.collective_bandwidth("h100", "all_reduce", 2**40, "inside", 8).notes
    assert len(past) == 1 and past[0].startswith("bytes 1.09951e+12 is outside the measured 1024-2.14748e+09")


def test_a_product_table_keeps_each_dim_s_measured_sizes_in_order():
    """What a lookup interpolates between: each of m, n, k's sizes once, smallest first."""
    from parasim.estimate.kernels import GemmTable

    t = GemmTable("h100", "bf16", "grid", "test", {(512, 8, 64): 1.0, (256, 8, 128): 2.0, (512, 16, 64): 3.0})
    assert t.axes == ((256, 512), (8, 16), (64, 128))
    assert t == GemmTable("h100", "bf16", "grid", "test", dict(t.points))  # the sizes are not part of equality


def test_a_message_below_the_smallest_measured_takes_the_sweeps_least_time():
    """ml-engineering's H200 all-reduce sweep starts at 32 KiB (1.44 GB/s busbw); its least time is at 512 KiB,
    23.94 GB/s. Eight bytes take that time, never less: 8 / (524288 / 23.94e9) bytes a second of busbw."""
    tiny = K.collective_bandwidth("h200", "all_reduce", 8, "inside")
    assert tiny.value == pytest.approx(8 / (524288 / 23.94e9), rel=1e-12)
    assert 8 / tiny.value == pytest.approx(524288 / 23.94e9, rel=1e-12)  # 21.9 us, as at 512 KiB
    assert "least time measured" in tiny.notes[-1]
