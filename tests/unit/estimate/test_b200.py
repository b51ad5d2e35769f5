"""The B200 preset (`--gpu b200`, `--gpu-model b200`): its datasheet figures, typed here from the sources' own
text (never computed by the code under test), the kernel tables that were published for it, and what parasim
does where none was (TP's overlap): memory planning answers, timing says in one line why it cannot (exit 2
for a command that exists to time; `memory` and `fit` print the memory and one line in place of the step)."""
import json
from math import log2

import pytest
from conftest import cli

from parasim.estimate import kernels as K
from parasim.errors import UsageError
from parasim.estimate.hardware import GPUS, SOURCES


def _strict(text: str) -> dict:
    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_the_figures_as_the_sources_print_them():
    """DGX B200 User Guide: '8 x NVIDIA B200 GPUs that provide 1,440 GB total GPU memory'; '2 x 5th generation
    NVLink switches that provide 14.4 TB/s aggregate bandwidth' (both directions, 8 GPUs); '8 x NVIDIA ConnectX-7
    Single Port Cards ... Up to 400Gbps'. ml-engineering's spec tables, NVIDIA B200 SXM: bf16 2250 (w/o
    sparsity), memory 180 GB, 8.00 TBps. NVIDIA's HGX B200 (8 GPUs): FP16/BF16 36 PFLOPS with sparsity."""
    b = GPUS["b200"]
    assert b.name == "B200" and b.gpus_per_node == 8
    assert b.memory.value == 180e9 and 1440e9 / 8 == 180e9
    assert b.peak_flops.value == 2250e12 and 36e15 / 8 / 2 == 2250e12  # the HGX figure, sparse, halved
    assert b.hbm.value == 8.00e12
    assert b.nvlink.value == 900e9 and 14.4e12 / 8 / 2 == 900e9
    assert b.network.value == 400e9 / 8
    assert b.usable.value == 153e9 and b.usable.source == "parasim"  # 85% of the card, as for every preset
    assert {k: f.source for k, f in b.figures().items()} == {
        "memory": "dgx-b200", "usable": "parasim", "peak_flops": "b200", "hbm": "b200", "nvlink": "dgx-b200",
        "network": "dgx-b200"}
    assert SOURCES["dgx-b200"][1] == "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html"
    assert "1,440 GB total GPU memory" in SOURCES["dgx-b200"][2] and "14.4 TB/s" in SOURCES["dgx-b200"][2]
    assert SOURCES["b200"][1] == "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md"
    assert "bf16 2250" in SOURCES["b200"][2] and "8.00 TBps" in SOURCES["b200"][2]
    assert "could not be read" in SOURCES["b200"][0]  # NVIDIA's own datasheet PDF: said, as the H800's is


def test_no_other_die_stands_in_for_the_b200():
    """Every kernel the clock reads was measured on a B200 but TP's overlap: that one is refused, never read off a
    Hopper's figure."""
    assert "b200" not in K.TWIN and "b200" not in K.TWIN.values()
    assert K.lacking("b200") == ["TP overlap"]
    for call in (lambda: K.tp_overlap_efficiency("b200"), lambda: K.nccl_sm_share("b200", "ring")):
        with pytest.raises(K.NoMeasurement, match="measured on b200") as info:
            call()
        assert "\n" not in str(info.value)


def test_b200_attention_is_cudnns_as_nvidia_and_the_flashattention_pr_print_it():
    """NVIDIA cudnn-frontend @0b1577c, sdpa_fp8_benchmark_results_NVIDIA_B200.csv, bf16 rows (batch 1, 128 q heads,
    head dim 128, causal): '1,4096,4096,128,8,128,True,bf16,0.482,1.650,1141.140,832.907' and
    '1,512,...,bf16,0.035,0.107,244.143,200.594'; flash-attention PR 2605's B200 forward table, cuDNN column,
    hdim 64: causal True at 8192 '1.31/838/37.2%', causal False at 1024 '0.33/846/37.6%'."""
    peak = 2250e12
    for backward, want in ((False, 1141.14e12), (True, 832.907e12)):
        got = K.attention_efficiency("b200", 4096, 128, True, backward)
        assert (got.value, got.sources, got.notes) == (want / peak, ("cudnn-b200",), ())
    assert K.attention_efficiency("b200", 512, 128, True, True).value == 200.594e12 / peak
    assert K.attention_efficiency("b200", 8192, 64, True, False).value == 838e12 / peak
    assert K.attention_efficiency("b200", 1024, 64, False, False).value == 846e12 / peak
    assert 838 / 2250 == pytest.approx(0.372, abs=5e-4)  # the PR's own MFU column, so its peak is 2.25 PF
    # head dim 64's backward was not read: head dim 128's, and the note says so
    d64 = K.attention_efficiency("b200", 4096, 64, True, True)
    assert d64.value == 832.907e12 / peak and "head dim 64 is outside the measured 128-128" in d64.notes[0]
    # no backward without the causal mask: the causal figure, said
    bare = K.attention_efficiency("b200", 4096, 128, False, True)
    assert bare.value == 832.907e12 / peak and "with the causal mask only" in bare.notes[0]
    # cuDNN is the kernel a B200 gets; the FlashAttention kernels were not measured there
    with pytest.raises(UsageError, match="no 'fa3' attention measured on b200"):
        K.attention_efficiency("b200", 4096, 128, True, False, "fa3")


def test_b200_memory_passes_are_the_measured_streams_over_the_datasheet():
    """OpenCL-Benchmark's B200: 'coalesced read 6668.71 GB/s', 'coalesced write 6502.72 GB/s'; FluidX3D's
    'B200 SXM6 180GB ... 42152 (81%)' MLUPs/s at 153 bytes a cell (its README's count)."""
    assert K.memory_efficiency("b200", "read").value == 6668.71e9 / 8e12
    assert K.memory_efficiency("b200", "init").value == 6502.72e9 / 8e12
    scale = K.memory_efficiency("b200")
    assert scale.sources == ("fluidx3d",) and scale.value == pytest.approx(42152e6 * 153 / 8e12, rel=1e-9)
    assert round(42152e6 * 153 / 8e12, 2) == 0.81  # FluidX3D's own roofline share
    triad = K.memory_efficiency("b200", "triad")
    assert triad.value == scale.value and "scale figure" in triad.notes[0]


def test_the_published_b200_measurements():
    """ml-engineering's MAMF table, NVIDIA B200 SXM: BF16 1745.0 TFLOPS at 1792x16128x3072, FP8 3432.5 at
    15360x4096x3072 (theory 2250 and 4500); its network chapter's 8x B200 all_reduce busbw, '1 node':
    723.34GBps at 1GiB, 1.20GBps at 32KiB, 845.67GBps at 16GiB."""
    bf16 = K.gemm_efficiency("b200", 1792, 16128, 3072)
    assert (bf16.value, bf16.sources, bf16.notes) == (1745e12 / 2250e12, ("mamf-b200",), ())
    other = K.gemm_efficiency("b200", 4096, 4096, 4096)  # above the best shape in the grid: held to the best
    assert other.value == 1745e12 / 2250e12 and "never above the best" in other.notes[-1]
    fp8 = K.gemm_efficiency("b200", 15360, 4096, 3072, "fp8")
    assert (fp8.value, fp8.sources) == (3432.5e12 / 4500e12, ("mamf-b200",))
    for nbytes, busbw in ((2**30, 723.34e9), (16 * 2**30, 845.67e9)):
        got = K.collective_bandwidth("b200", "all_reduce", nbytes, "inside")
        assert (got.value, got.sources, got.notes) == (busbw, ("mle-b200-allreduce",), ())
    # 32 KiB at 1.20 GB/s took longer than 128 KiB at 4.86 GB/s (the sweep's least time): read at that time,
    # 4.86 GB/s x 32/128 (a message takes no longer than a larger one)
    small = K.collective_bandwidth("b200", "all_reduce", 32 * 2**10, "inside")
    assert small.value == pytest.approx(4.86e9 / 4, rel=1e-12) and "least time measured" in small.notes[0]
    gather = K.collective_bandwidth("b200", "all_gather", 2**30, "inside")
    assert gather.value == 723.34e9 and "all-reduce busbw is used" in gather.notes[0]


# OpenXLA's B200 matmul table (openxla/xla 336bb15, key sm_100_B200, b: 1), copied off the file by hand: FLOP/s
XLA_B200 = {"bf16": {(1024, 4096, 2048): 981258235320996, (2048, 4096, 2048): 1172847432004369,
                     (1024, 4096, 4096): 1213953447145279, (2048, 4096, 4096): 1342544381979447,
                     (1024, 1024, 1024): 288020875536480},
            "fp8": {(4096, 4096, 2048): 2484974207564909, (4096, 4096, 4096): 2764981863158106,
                    (4096, 1024, 4096): 1951814267666439}}


def test_b200_products_fall_off_from_the_searched_best_as_openxlas_b200_grid_does():
    """A hand reading: MAMF's best times the grid's figure at the shape over the grid's at the best shape, the
    grid read linear in log2 of each side and held at its 4096 edge (16128 -> 4096, 15360 -> 4096)."""
    g = XLA_B200["bf16"]
    wm, wk = log2(1792 / 1024), log2(3072 / 2048)  # the BF16 best, 1792x16128x3072, between the grid's corners
    low_k = (1 - wm) * g[(1024, 4096, 2048)] + wm * g[(2048, 4096, 2048)]
    high_k = (1 - wm) * g[(1024, 4096, 4096)] + wm * g[(2048, 4096, 4096)]
    at_best = (1 - wk) * low_k + wk * high_k
    small = K.gemm_efficiency("b200", 1024, 1024, 1024)
    # rel 1e-9: the same sums in another order (float64 keeps 15-16 digits), nothing looser
    assert small.value == pytest.approx(1745e12 / 2250e12 * g[(1024, 1024, 1024)] / at_best, rel=1e-9)
    assert small.sources == ("mamf-b200", "xla-gemm-b200") and "b200 BF16 grid" in small.notes[-1]
    assert round(small.value, 2) == 0.18  # against 0.776 at the best: a product the B200's 148 SMs barely fill
    f = XLA_B200["fp8"]  # the FP8 best, 15360x4096x3072, is read at m 4096 (the edge), k between 2048 and 4096
    fp8_best = (1 - wk) * f[(4096, 4096, 2048)] + wk * f[(4096, 4096, 4096)]
    narrow = K.gemm_efficiency("b200", 4096, 1024, 4096, "fp8")  # the FP8 grid, not the BF16 one
    assert narrow.value == pytest.approx(3432.5e12 / 4500e12 * f[(4096, 1024, 4096)] / fp8_best, rel=1e-9)
    assert "b200 FP8 grid" in narrow.notes[-1]
    # a large product is never put above what the search found at its best shape
    assert K.gemm_efficiency("b200", 8192, 8192, 8192, "fp8").value == 3432.5e12 / 4500e12


def test_memory_times_a_b200_step_and_says_why_not_with_tp_overlap():
    out = cli("memory", "--model", "27b", "--tp", "4", "--gpu", "b200")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "of the 153.0 GB a B200 leaves for training (180 GB on the card)" in text
    assert "s on B200 (the clock:" in text
    data = _strict(cli("memory", "--model", "27b", "--tp", "4", "--gpu", "B200", "--json").stdout)
    assert data["usable"] == 153.0 and data["fits"] is True and data["time"]["step_s"] > 0
    out = cli("memory", "--model", "27b", "--tp", "4", "--gpu", "b200", "--overlap", "tp")
    assert out.returncode == 0, out.stderr
    assert "step: not timed on B200: no TP overlap (te-userbuffers) measured on b200 yet" in " ".join(out.stdout.split())
    data = _strict(cli("memory", "--model", "27b", "--tp", "4", "--gpu", "b200", "--overlap", "tp", "--json").stdout)
    assert data["time"]["step_s"] is None and "no TP overlap" in data["time"]["why"]
    fit = cli("fit", "--model", "27b", "--tp", "4", "--gpu", "b200", "--overlap", "tp")
    assert fit.returncode == 0, fit.stderr
    assert "longest sequence" in fit.stdout and "not timed on B200" in fit.stdout


def test_cudnns_attention_on_a_hopper_is_not_measured_so_the_step_is_not_timed():
    """cuDNN's fused attention was measured on a B200 only: asked for on an H100 (or an H200, which reads the
    H100's tables) it is NoMeasurement, so `memory` plans the memory and says why the step is not timed (a run
    that names it in a validation set is listed, not timed) in place of stopping."""
    for gpu in ("h100", "h200"):
        with pytest.raises(K.NoMeasurement, match="no 'cudnn' attention measured on h100"):
            K.attention_efficiency(gpu, 4096, 128, True, None, "cudnn")
    # a kernel that is not one is refused as such, not taken for one never measured
    with pytest.raises(UsageError, match="unknown attention kernel 'bogus'") as bad:
        K.attention_efficiency("h100", 4096, 128, True, None, "bogus")
    assert not isinstance(bad.value, K.NoMeasurement)
    out = cli("memory", "--model", "27b", "--tp", "4", "--gpu", "h100", "--attention-kernel", "cudnn")
    assert out.returncode == 0, out.stderr
    assert "step: not timed on H100: no 'cudnn' attention measured on h100" in " ".join(out.stdout.split())


def test_a_time_search_with_tp_overlap_refuses_the_b200_in_one_line():
    out = cli("fit", "--model", "27b", "--search", "--by", "time", "--gpu", "b200", "--nodes", "1-2", "--overlap", "tp")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no TP overlap (te-userbuffers) measured on b200 yet" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_parasim_hardware_lists_the_b200_with_its_sources_and_what_it_lacks():
    data = _strict(cli("hardware", "--json").stdout)
    b = data["gpus"]["b200"]
    assert b["name"] == "B200" and b["memory"]["source"] == "dgx-b200" and b["peak_flops"]["value"] == 2250e12
    assert {"dgx-b200", "b200"} <= set(data["sources"])
    assert data["sources"]["dgx-b200"]["address"].startswith("https://docs.nvidia.com/dgx/dgxb200-user-guide/")
    assert data["kernels"]["lacking"]["b200"] == ["TP overlap"]
    assert data["kernels"]["lacking"]["a100"] == data["kernels"]["lacking"]["h100"] == []
    samples = data["kernels"]["samples"]["b200"]
    assert samples["attention forward, 4k causal, d 128"]["value"] == 1141.14e12 / 2250e12
    assert samples["attention forward, 4k causal, d 128"]["sources"] == ["cudnn-b200"]
    assert samples["product 4096^3 (share of peak)"]["sources"] == ["mamf-b200"]
    assert {"mamf-b200", "mle-b200-allreduce", "cudnn-b200", "fa-pr2605", "fluidx3d",
            "opencl-benchmark"} <= set(data["kernels"]["sources"])
    assert "0b1577c" in data["kernels"]["sources"]["cudnn-b200"]["address"]
    text = " ".join(cli("hardware").stdout.split())
    assert "B200: no measured TP overlap table yet" in text


def test_a_symbolic_step_on_a_b200_keeps_its_peak_and_is_timed():
    out = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3", "--gpu-model", "b200", "--json")
    assert out.returncode == 0, out.stderr
    data = _strict(out.stdout)
    assert data["peak"]["gpu_model"] == "B200" and data["peak"]["usable"] == 153e9
    assert data["time"]["step_s"] > 0
