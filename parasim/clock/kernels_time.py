"""How long one GPU's kernels take, from measured kernel costs (estimate/kernels.py), never from a training run.

A layer's work is its products, each timed at the share of the GPU's peak a product of its very shape
reaches (`gemm_seconds`: an (m x k) @ (k x n) GEMM at gemm_efficiency(m, n, k)); a linear layer's backward is
its two products (the input's gradient, m x n @ n x k, and the weight's, k x m @ m x n), each at its own
shape. Attention runs at FlashAttention's measured share for its sequence and head size, forward and backward
apart (`attention_seconds`); elementwise passes at the HBM bandwidth a streaming kernel measures
(`hbm_rate`). What each figure rests on, and what it borrows where a GPU has no measurement of its own, is in
the lookups' sources and notes (`parasim hardware`, docs/notes/kernel-costs.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..estimate.kernels import attention_efficiency, gemm_efficiency, memory_efficiency


@dataclass(frozen=True)
class Linear:
    """One linear layer's product on one GPU for one micro-batch: `rows` tokens through a (k_in x n_out) weight,
    `count` alike (the experts of a GPU)."""

    rows: float  # an average (the tokens an expert works on), so not always whole; as are a TP share's widths
    k_in: float
    n_out: float
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.k_in * self.n_out * self.count


def _kept(memo: dict, key: tuple, compute: Callable[[], float]) -> float:
    """`compute()`, kept in the caller's `memo` (one per Machine: a fit search asks the same shapes thousands of
    times, and no table lookup is kept between runs in the module itself)."""
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def gemm_share(memo: dict, gpu: str, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """The measured share of peak an (m x k) @ (k x n) product reaches on GPU type `gpu`."""
    return _kept(memo, ("gemm", gpu, m, n, k, dtype), lambda: gemm_efficiency(gpu, m, n, k, dtype).value)


def gemm_seconds(memo: dict, gpu: str, peak: float, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """Seconds of one (m x k) @ (k x n) product on GPU type `gpu` (dense BF16 peak `peak`; FP8 twice it)."""
    if min(m, n, k) < 1:
        return 0.0
    eff = gemm_share(memo, gpu, m, n, k, dtype)
    return 2.0 * m * n * k / (peak * (2 if dtype == "fp8" else 1) * eff)


def _whole(x: float) -> int:
    return max(1, int(round(x)))


def linear_seconds(memo: dict, gpu: str, peak: float, lin: Linear, dtype: str = "bf16") -> tuple[float, float]:
    """(forward, backward) seconds of a linear layer: its product, then the input's and the weight's gradients."""
    m, k, n = _whole(lin.rows), _whole(lin.k_in), _whole(lin.n_out)
    fwd = gemm_seconds(memo, gpu, peak, m, n, k, dtype)
    bwd = gemm_seconds(memo, gpu, peak, m, k, n, dtype) + gemm_seconds(memo, gpu, peak, k, n, m, dtype)
    return fwd * lin.count, bwd * lin.count


def attention_share(
    memo: dict, gpu: str, seq: int, head_dim: int, causal: bool, backward: bool | None, kernel: str | None = None
) -> float:
    """FlashAttention's measured share of the BF16 peak for this sequence and head size: the forward pass
    (backward False), the backward (True), or both together (None); `kernel` ("fa2", "fa3") as the framework
    runs it, None for the newest measured on the GPU type."""
    s, d = max(1, int(seq)), max(1, int(head_dim))
    return _kept(
        memo,
        ("attention", gpu, s, d, causal, backward, kernel),
        lambda: attention_efficiency(gpu, s, d, causal, backward, kernel).value,
    )


def attention_seconds(
    memo: dict,
    gpu: str,
    peak: float,
    fwd_flops: float,
    seq: int,
    head_dim: int,
    causal: bool,
    backward_factor: float,
    kernel: str | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of attention doing `fwd_flops` forward and `backward_factor` times that backward
    (FlashAttention's count: 2.5), each at its measured share for `kernel`."""
    fwd = fwd_flops / (peak * attention_share(memo, gpu, seq, head_dim, causal, False, kernel))
    bwd = backward_factor * fwd_flops / (peak * attention_share(memo, gpu, seq, head_dim, causal, True, kernel))
    return fwd, bwd


def hbm_rate(memo: dict, gpu: str, hbm: float) -> float:
    """Bytes per second an elementwise pass streams (one load and one store stream: the `scale` kernel)."""
    return hbm * _kept(memo, ("hbm", gpu), lambda: memory_efficiency(gpu, "scale").value)
