"""The hardware table (issue 34, build item 1: "the constants live in one table with their sources"): every
figure has a source that exists and prints it, the presets the estimator and the clock read are the table's,
and `parasim hardware` shows them (--json strict)."""
import json

from conftest import cli

from parasim.estimate.hardware import GPUS, LATENCY, SOURCES
from parasim.estimate.traffic import gpu_presets


def test_every_figure_names_a_source_that_exists():
    for key, gpu in GPUS.items():
        for name, fig in gpu.figures().items():
            assert fig.source in SOURCES, (key, name)
            assert fig.printed, (key, name)
    clock = list(LATENCY.values())
    assert all(f.source in SOURCES and f.printed for f in clock)
    assert {f.source for g in GPUS.values() for f in g.figures().values()} | {f.source for f in clock} == set(SOURCES)


def test_the_clock_constants_as_their_sources_print_them():
    """NCCL's tuning.cc: baseLat Ring/Simple 8.4 us, hwLat Ring/Simple NVLink 3.4 us, network 14.0 us. The
    shares of peak kernels reach are measurements by shape now (estimate/kernels.py, tests/unit/estimate/test_kernels_data.py),
    not one figure in this table."""
    assert [LATENCY[k].value for k in ("call", "inside", "across")] == [8.4e-6, 3.4e-6, 14.0e-6]
    assert not {"matmul", "attention", "efficiency"} & set(SOURCES)


def test_the_datasheets_numbers_as_they_print_them():
    """Read from the datasheets by hand: dense BF16 is half the 'with sparsity' rate; NVLink's both-ways figure
    halves into one direction; a 400 Gb/s port carries 50 GB/s."""
    assert GPUS["h200"].peak_flops.value == 989e12 == GPUS["h100"].peak_flops.value  # 1,979 / 2, to 3 digits
    assert abs(989e12 - 1979e12 / 2) < 1e12
    assert GPUS["a100"].peak_flops.value == 312e12
    assert [GPUS[k].hbm.value for k in ("h200", "h100", "a100")] == [4.8e12, 3.35e12, 2.039e12]
    assert [GPUS[k].nvlink.value for k in ("h200", "h100", "a100")] == [900e9 / 2, 900e9 / 2, 600e9 / 2]
    assert [GPUS[k].network.value for k in ("h200", "h100", "a100")] == [400e9 / 8, 400e9 / 8, 200e9 / 8]
    assert GPUS["h200"].usable.source == "parasim"  # an assumption, and said to be one
    assert gpu_presets()["h200"].hbm == 4.8e12 and gpu_presets()["a100"].peak_flops == 312e12


def test_the_h800_is_an_h100_with_slower_nvlink():
    """The H800's article: the H100's silicon, 80GB, 3.35 TB/s, NVLink 400 GB/s both ways; DeepEP: one
    400 Gb/s CX7 a GPU. Its usable share is parasim's assumption, as for every 80 GB card."""
    h800, h100 = GPUS["h800"], GPUS["h100"]
    assert h800.peak_flops.value == h100.peak_flops.value == 989e12
    assert (h800.memory.value, h800.hbm.value) == (80e9, 3.35e12) == (h100.memory.value, h100.hbm.value)
    assert h800.nvlink.value == 400e9 / 2 and h800.network.value == 400e9 / 8
    assert h800.usable.value == h100.usable.value and h800.usable.source == "parasim"
    sources = {name: f.source for name, f in h800.figures().items()}
    assert sources == {"memory": "h800", "usable": "parasim", "peak_flops": "h800", "hbm": "h800", "nvlink": "h800",
                       "network": "deepep"}


def test_parasim_hardware_prints_the_table_and_its_sources():
    out = cli("hardware")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    # four GPU columns wrap a cell's printed figure apart from its source key at 80 columns
    assert "4.8 TB/s" in text and "[h200]" in text and "[dgx-h100]" in text
    assert "nvidia-tensor-core-gpu-datasheet" in text and "[h800]" in text and "[deepep]" in text
    data = json.loads(cli("hardware", "--json").stdout)
    assert set(data["gpus"]) == {"h200", "h100", "h800", "a100", "b200"}
    assert data["gpus"]["a100"]["nvlink"] == {"value": 300e9, "printed": "600 GB/s, both directions",
                                              "source": "a100"}


def test_parasim_hardware_shows_the_measured_kernel_costs_beside_the_datasheets():
    """The kernel measurements the clock times by are in the table too, each point with the sources it read:
    a 4096-cube BF16 product on an H100 reads the H100's own GEMM table, never an efficiency typed here."""
    data = json.loads(cli("hardware", "--json").stdout)
    samples = data["kernels"]["samples"]
    assert set(samples) == set(data["gpus"])
    row = samples["h100"]["product 4096^3 (share of peak)"]
    assert 0.5 < row["value"] < 1.0 and row["sources"] and set(row["sources"]) <= set(data["kernels"]["sources"])
    assert "Measured kernel costs" in cli("hardware").stdout
