"""The hardware constants every time and memory figure of parasim reads, in one table with their sources
(`parasim hardware` prints it). Each entry is a vendor's published figure, written here as the source
prints it and converted once; nothing is fitted to a measured run. One figure is parasim's own assumption,
not a spec, and says so: the bytes left for training on a card (`usable`).

Units: bytes, bytes per second, FLOP per second. NVLink and the network are per GPU and per direction
(the datasheets give NVLink as the sum of both directions: 900 GB/s is 450 GB/s each way)."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9

# Where each figure comes from: key -> (document, address, what it prints).
SOURCES: dict[str, tuple[str, str, str]] = {
    "a100": (
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)",
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        "BF16 Tensor Core 312 TFLOPS (624 with sparsity); 80GB HBM2e; 2,039 GB/s; NVLink 600 GB/s",
    ),
    "h100": (
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)",
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense); 80GB; 3.35 TB/s; NVLink 900 GB/s",
    ),
    "h200": (
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)",
        "https://resources.nvidia.com/en-us-data-center-overview-mc/en-us-data-center-overview/hpc-datasheet-sc23-h200",
        "BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense); 141GB HBM3e; 4.8 TB/s; NVLink 900 GB/s",
    ),
    "h800": (
        "Philisun, 'NVIDIA H800 vs H100: A Technical Deep Dive into Politically-Defined AI Chips' (a vendor's "
        "article: NVIDIA's own H800 datasheet could not be read for this table)",
        "https://www.philisun.com/technical-analysis/nvidia-h800-vs-h100-a-technical-deep-dive-into-politically-"
        "defined-ai-chips",
        "the same silicon die as the H100, the same CUDA and Tensor Core arrays; 80GB (SXM), memory bandwidth "
        "(e.g., 3.35 TB/s) largely consistent; NVLink 400 GB/s total aggregate bidirectional",
    ),
    "deepep": (
        "DeepSeek, DeepEP README: the H800 nodes DeepSeek-V3 trained on",
        "https://github.com/deepseek-ai/DeepEP",
        "H800 (~160 GB/s NVLink maximum bandwidth), with each connected to a CX7 InfiniBand 400 Gb/s RDMA "
        "network card (~50 GB/s maximum bandwidth)",
    ),
    "dgx-a100": (
        "NVIDIA DGX A100 datasheet: networking",
        "https://images.nvidia.com/aem-dam/Solutions/Data-Center/nvidia-dgx-a100-datasheet.pdf",
        "8x single-port Mellanox ConnectX-6 VPI 200Gb/s HDR InfiniBand (compute), for 8 GPUs",
    ),
    "dgx-h100": (
        "NVIDIA DGX H100 / H200 datasheet: networking",
        "https://resources.nvidia.com/en-us-dgx-systems/ai-enterprise-dgx",
        "4x OSFP ports serving 8x single-port NVIDIA ConnectX-7 VPI, 400Gb/s InfiniBand/Ethernet (compute), for 8 GPUs",
    ),
    "nccl": (
        "NCCL's tuning model, src/graph/tuning.cc (v2.18-2.21): baseLat and hwLat, ring algorithm, Simple protocol",
        "https://github.com/NVIDIA/nccl/blob/master/src/graph/tuning.cc",
        "baseLat Ring Simple 8.4 us; hwLat Ring Simple: NVLink 3.4 us, network 14.0 us",
    ),
    "dgx-b200": (
        "NVIDIA DGX B200 User Guide, 'Introduction to NVIDIA DGX B200 Systems': hardware overview "
        "(the 8-GPU system's figures; the B200 chip is sold as 192 GB, the DGX/HGX B200 system gives each "
        "GPU 180 GB)",
        "https://docs.nvidia.com/dgx/dgxb200-user-guide/introduction-to-dgxb200.html",
        "GPU: 8 x NVIDIA B200 GPUs that provide 1,440 GB total GPU memory; NVSwitch: 2 x 5th generation "
        "NVLink switches that provide 14.4 TB/s aggregate bandwidth; 4 x OSFP ports for 8 x NVIDIA "
        "ConnectX-7 Single Port Cards, InfiniBand (default): Up to 400Gbps",
    ),
    "b200": (
        "S. Bekman, Machine Learning Engineering, accelerator chapter: the 'TFLOPS comparison table' (w/o "
        "sparsity) and the memory table, NVIDIA B200 SXM rows, commit 744d01e18b (2026-08-22); their note 20 "
        "cites NVIDIA's DGX B200 datasheet (https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet), "
        "which could not be read for this table. NVIDIA's HGX page, as FiberMall's article reproduces it, gives "
        "the HGX B200 (8 GPUs) FP16/BF16 Tensor Core 36 PFLOPS with sparsity: the same 2,250 dense per GPU",
        "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md",
        "NVIDIA B200 SXM: bf16 2250 (TFLOPS, w/o sparsity), fp8 4500; memory 180 GB HBM3e, peak bandwidth 8.00 TBps",
    ),
    "parasim": (
        "an assumption, not a spec: the post's usable 120 GB of an H200's 141, the same share (85%) of an "
        "80 GB card and of a B200's 180 GB",
        "docs/estimator.md (hidden assumptions)",
        "the card less the CUDA context, NCCL buffers and fragmentation",
    ),
}


@dataclass(frozen=True)
class Figure:
    """One constant: its value in base units, how the source writes it, and the source's key."""

    value: float
    printed: str
    source: str


@dataclass(frozen=True)
class GpuSheet:
    """One GPU type as its datasheets give it, and the node it is sold in."""

    name: str
    memory: Figure  # bytes on the card
    usable: Figure  # bytes left for training (parasim's assumption)
    peak_flops: Figure  # dense BF16 tensor-core FLOP/s
    hbm: Figure  # memory bandwidth, bytes/s
    nvlink: Figure  # bytes/s per direction per GPU inside a node
    network: Figure  # bytes/s per direction per GPU across nodes (one NIC per GPU)
    gpus_per_node: int = 8

    def figures(self) -> dict[str, Figure]:
        return {
            "memory": self.memory,
            "usable": self.usable,
            "peak_flops": self.peak_flops,
            "hbm": self.hbm,
            "nvlink": self.nvlink,
            "network": self.network,
        }


# The GPU types parasim knows, by the name `--gpu-model` takes. Dense BF16 is half the datasheets' "with
# sparsity" figure (2:4 sparsity doubles the rate; training runs dense); a network port of 400 Gb/s is 50 GB/s.
GPUS: dict[str, GpuSheet] = {
    "h200": GpuSheet(
        "H200",
        Figure(141 * GB, "141GB HBM3e", "h200"),
        Figure(120 * GB, "120 GB", "parasim"),
        Figure(989e12, "1,979 TFLOPS with sparsity, half dense: 989", "h200"),
        Figure(4.8e12, "4.8 TB/s", "h200"),
        Figure(450 * GB, "900 GB/s, both directions", "h200"),
        Figure(50 * GB, "400 Gb/s a GPU", "dgx-h100"),
    ),
    "h100": GpuSheet(
        "H100",
        Figure(80 * GB, "80GB HBM3", "h100"),
        Figure(68 * GB, "68 GB", "parasim"),
        Figure(989e12, "1,979 TFLOPS with sparsity, half dense: 989", "h100"),
        Figure(3.35e12, "3.35 TB/s", "h100"),
        Figure(450 * GB, "900 GB/s, both directions", "h100"),
        Figure(50 * GB, "400 Gb/s a GPU", "dgx-h100"),
    ),
    # the H100's silicon with NVLink cut to 400 GB/s both ways (export rules): the H100's compute and memory
    "h800": GpuSheet(
        "H800",
        Figure(80 * GB, "80GB", "h800"),
        Figure(68 * GB, "68 GB", "parasim"),
        Figure(989e12, "the H100's Tensor Cores: 989 dense", "h800"),
        Figure(3.35e12, "3.35 TB/s", "h800"),
        Figure(200 * GB, "400 GB/s, both directions", "h800"),
        Figure(50 * GB, "400 Gb/s a GPU", "deepep"),
    ),
    "a100": GpuSheet(
        "A100 80GB",
        Figure(80 * GB, "80GB HBM2e", "a100"),
        Figure(68 * GB, "68 GB", "parasim"),
        Figure(312e12, "312 TFLOPS", "a100"),
        Figure(2.039e12, "2,039 GB/s", "a100"),
        Figure(300 * GB, "600 GB/s, both directions", "a100"),
        Figure(25 * GB, "200 Gb/s a GPU", "dgx-a100"),
    ),
    # Blackwell: a new die (two dies in one package), so no Hopper measurement stands in for its kernels
    "b200": GpuSheet(
        "B200",
        Figure(180 * GB, "1,440 GB for 8 GPUs: 180 GB each", "dgx-b200"),
        Figure(153 * GB, "153 GB", "parasim"),
        Figure(2250e12, "bf16 2250 TFLOPS w/o sparsity", "b200"),
        Figure(8e12, "8.00 TBps", "b200"),
        Figure(900 * GB, "14.4 TB/s for 8 GPUs: 1.8 TB/s each, both directions", "dgx-b200"),
        Figure(50 * GB, "400 Gb/s a GPU", "dgx-b200"),
    ),
}


# How long a collective waits besides its bytes (the clock's alpha): NCCL's own model of its ring, a fixed
# cost per call and one per step of the ring, by the link the step crosses. Per GPU type alike.
LATENCY: dict[str, Figure] = {
    "call": Figure(8.4e-6, "baseLat, Ring/Simple: 8.4 us", "nccl"),
    "inside": Figure(3.4e-6, "hwLat NVLink, Ring/Simple: 3.4 us", "nccl"),
    "across": Figure(14.0e-6, "hwLat network, Ring/Simple: 14.0 us", "nccl"),
}

LATENCY_WHAT = {
    "call": "each collective",
    "inside": "each ring step inside a node",
    "across": "each ring step across nodes",
}

# What share of these figures a kernel reaches is measured, by GPU type and shape: estimate/kernels.py.

# what each figure is, for the printed table
WHAT: dict[str, str] = {
    "memory": "memory on the card",
    "usable": "usable for training",
    "peak_flops": "dense BF16 peak",
    "hbm": "memory bandwidth",
    "nvlink": "NVLink, one direction",
    "network": "network, one direction",
}
UNITS: dict[str, tuple[float, str]] = {
    "memory": (GB, "GB"),
    "usable": (GB, "GB"),
    "peak_flops": (1e12, "TFLOP/s"),
    "hbm": (1e12, "TB/s"),
    "nvlink": (GB, "GB/s"),
    "network": (GB, "GB/s"),
}


def table() -> dict:
    """Every GPU's figures with their sources, as `parasim hardware --json` prints them."""
    return {
        "gpus": {
            key: {
                "name": g.name,
                "gpus_per_node": g.gpus_per_node,
                **{k: {"value": f.value, "printed": f.printed, "source": f.source} for k, f in g.figures().items()},
            }
            for key, g in GPUS.items()
        },
        "latency": {k: {"value": f.value, "printed": f.printed, "source": f.source} for k, f in LATENCY.items()},
        "sources": {k: {"document": d, "address": a, "prints": p} for k, (d, a, p) in SOURCES.items()},
    }
