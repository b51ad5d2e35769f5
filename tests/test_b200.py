"""The B200 preset (`--gpu b200`, `--gpu-model b200`): its datasheet figures, typed here from the sources' own
text (never computed by the code under test), the kernel tables that were published for it, and what parasim
does where none was: memory planning answers, timing says in one line why it cannot (exit 2 for a command
that exists to time; `memory` and `fit` print the memory and one line in place of the step)."""
import json

import pytest
from conftest import cli

from parasim.estimate import kernels as K
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
    assert "b200" not in K.TWIN and "b200" not in K.TWIN.values()
    assert K.lacking("b200") == ["attention", "memory bandwidth"]
    for call in (lambda: K.attention_efficiency("b200", 4096, 128, True, None),
                 lambda: K.memory_efficiency("b200"), lambda: K.nccl_sm_share("b200", "ring")):
        with pytest.raises(K.NoMeasurement, match="measured on b200") as info:
            call()
        assert "\n" not in str(info.value)


def test_the_published_b200_measurements():
    """ml-engineering's MAMF table, NVIDIA B200 SXM: BF16 1745.0 TFLOPS at 1792x16128x3072, FP8 3432.5 at
    15360x4096x3072 (theory 2250 and 4500); its network chapter's 8x B200 all_reduce busbw, '1 node':
    723.34GBps at 1GiB, 1.20GBps at 32KiB, 845.67GBps at 16GiB."""
    bf16 = K.gemm_efficiency("b200", 1792, 16128, 3072)
    assert (bf16.value, bf16.sources, bf16.notes) == (1745e12 / 2250e12, ("mamf-b200",), ())
    other = K.gemm_efficiency("b200", 4096, 4096, 4096)
    assert other.value == 1745e12 / 2250e12 and "its figure is used for every shape" in other.notes[0]
    fp8 = K.gemm_efficiency("b200", 15360, 4096, 3072, "fp8")
    assert (fp8.value, fp8.sources) == (3432.5e12 / 4500e12, ("mamf-b200",))
    for nbytes, busbw in ((2**30, 723.34e9), (32 * 2**10, 1.20e9), (16 * 2**30, 845.67e9)):
        got = K.collective_bandwidth("b200", "all_reduce", nbytes, "inside")
        assert (got.value, got.sources, got.notes) == (busbw, ("mle-b200-allreduce",), ())
    gather = K.collective_bandwidth("b200", "all_gather", 2**30, "inside")
    assert gather.value == 723.34e9 and "all-reduce busbw is used" in gather.notes[0]


def test_memory_plans_on_a_b200_and_says_why_there_is_no_step_time():
    out = cli("memory", "--model", "27b", "--tp", "4", "--gpu", "b200")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "of the 153.0 GB a B200 leaves for training (180 GB on the card)" in text
    assert "step: not timed on B200: no attention measured on b200 yet" in text
    data = _strict(cli("memory", "--model", "27b", "--tp", "4", "--gpu", "B200", "--json").stdout)
    assert data["usable"] == 153.0 and data["fits"] is True and data["stages"]["slowest"] is None
    assert data["time"]["step_s"] is None and "no attention measured on b200" in data["time"]["why"]
    fit = cli("fit", "--model", "27b", "--tp", "4", "--gpu", "b200")
    assert fit.returncode == 0, fit.stderr
    assert "longest sequence" in fit.stdout and "not timed on B200" in fit.stdout
    assert _strict(cli("fit", "--model", "27b", "--tp", "4", "--gpu", "b200", "--json").stdout)["time"]["step_s"] is None


@pytest.mark.parametrize("args", [
    ("fit", "--model", "27b", "--search", "--by", "time", "--gpu", "b200", "--nodes", "1-2"),
    ("lesson", "tp-attention", "--gpu-model", "b200", "--plain"),
])
def test_commands_that_exist_to_time_refuse_the_b200_in_one_line(args):
    out = cli(*args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no attention measured on b200 yet" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_parasim_hardware_lists_the_b200_with_its_sources_and_what_it_lacks():
    data = _strict(cli("hardware", "--json").stdout)
    b = data["gpus"]["b200"]
    assert b["name"] == "B200" and b["memory"]["source"] == "dgx-b200" and b["peak_flops"]["value"] == 2250e12
    assert {"dgx-b200", "b200"} <= set(data["sources"])
    assert data["sources"]["dgx-b200"]["address"].startswith("https://docs.nvidia.com/dgx/dgxb200-user-guide/")
    assert data["kernels"]["lacking"]["b200"] == ["attention", "memory bandwidth"]
    assert all(not v for k, v in data["kernels"]["lacking"].items() if k != "b200")
    samples = data["kernels"]["samples"]["b200"]
    assert samples["attention forward, 4k causal, d 128"]["value"] is None
    assert samples["product 4096^3 (share of peak)"]["sources"] == ["mamf-b200"]
    assert {"mamf-b200", "mle-b200-allreduce"} <= set(data["kernels"]["sources"])
    text = " ".join(cli("hardware").stdout.split())
    assert "B200: no measured attention, memory bandwidth table yet" in text


def test_a_symbolic_step_on_a_b200_keeps_its_peak_and_says_why_it_has_no_time():
    out = cli("trace", "--symbolic", "--layout", "megatron-8.3b", "--gpu", "3", "--gpu-model", "b200", "--json")
    assert out.returncode == 0, out.stderr
    data = _strict(out.stdout)
    assert data["peak"]["gpu_model"] == "B200" and data["peak"]["usable"] == 153e9
    assert data["time"]["step_s"] is None and "no attention measured on b200" in data["time"]["why"]
