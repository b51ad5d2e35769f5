"""How far apart two computations of the same float arithmetic may be: the standard bound of the rounding
error of a sum, from the dtype and the number of additions. `parasim run` (compare.py) and `parasim check`
(divergence.py) both allow this much and no more, and say how close each verdict came.

A sum of n terms added one by one in a precision whose unit roundoff is u (half the gap between 1 and the
next number: 2^-8 for bf16's 8 significant bits, 2^-11 for float16, 2^-24 for float32, 2^-53 for float64)
is off from the exact sum by at most gamma(n - 1) * sum |x_i|, gamma(k) = k u / (1 - k u), whatever the
order of the additions (N. J. Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., SIAM 2002,
section 4.2, eq. 4.4; Lemma 3.1 for gamma). A dot product of n terms (a matrix product's entry) is within
gamma(n) * sum |x_i y_i| (eq. 3.4). Two computations of one sum in two orders (real ranks and virtual ranks,
a split run and its reference) are each that close to the exact sum, so within the two bounds added up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ..comm.ops import OPS


@dataclass(frozen=True)
class Roundoff:
    """How finely a dtype rounds: its unit roundoff (layout/precision.py's Precision is a training recipe's dtypes)."""

    name: str  # numpy's name of the dtype
    short: str  # as a verdict writes it
    u: float  # unit roundoff: 2^-p for p significant bits (the leading one counted)


ROUNDOFFS = {
    p.name: p
    for p in (
        Roundoff("bfloat16", "bf16", 2.0**-8),
        Roundoff("float16", "fp16", 2.0**-11),
        Roundoff("float32", "fp32", 2.0**-24),
        Roundoff("float64", "fp64", 2.0**-53),
    )
}
COMPLEX = {"complex64": "float32", "complex128": "float64"}  # each part rounds as its float does


def roundoff(dtype: str | None) -> Roundoff:
    """The unit roundoff of `dtype`; a float the table does not name (FP8, float128) by its own epsilon."""
    name = COMPLEX.get(dtype or "float64", dtype or "float64")
    if name in ROUNDOFFS:
        return ROUNDOFFS[name]
    return Roundoff(name, name, float(ml_dtypes.finfo(np.dtype(name)).eps) / 2)


def rounds(dtype: str) -> bool:
    """Whether a dtype's arithmetic rounds: floats (ml_dtypes' bfloat16 and FP8 included) and complex."""
    if dtype in ROUNDOFFS or dtype in COMPLEX:
        return True
    try:
        ml_dtypes.finfo(np.dtype(dtype))
    except (TypeError, ValueError):
        return False
    return True


def gamma(k: int, u: float) -> float:
    """k u / (1 - k u): how far k roundings may take a result, relatively; infinite once k u reaches 1 (the
    bound then says nothing)."""
    return k * u / (1 - k * u) if k * u < 1 else math.inf


@dataclass(frozen=True)
class Closeness:
    """One comparison that needed an allowance: the gap where it came closest to (or went past) what was
    allowed there, and what was allowed."""

    dtype: str
    roundings: int  # roundings each side may have made (additions of a sum, terms of a product)
    of: str  # what the allowance is relative to: "each sum", "their array's largest value", ...
    gap: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.gap <= self.bound

    @property
    def share(self) -> float:
        """The gap as a share of its allowance (above 1: past it)."""
        if self.gap == 0:
            return 0.0
        return self.gap / self.bound if self.bound > 0 else math.inf

    def words(self) -> str:
        """'within 3 bf16 roundings of each sum: largest gap 0.0012 <= 0.0039' (or '> ...' past it)."""
        p = roundoff(self.dtype)
        k = f"{self.roundings:,} {p.short} rounding{'s' if self.roundings != 1 else ''}"
        if math.isinf(self.bound):  # k u >= 1: the bound allows any gap, and says so
            return f"within {k} of {self.of}: largest gap {self.gap:.3g}, and {k} bound nothing ({p.u:.3g} each)"
        return (
            f"{'within' if self.ok else 'past'} {k} of {self.of}: largest gap {self.gap:.3g} "
            f"{'<=' if self.ok else '>'} {self.bound:.3g}"
        )

    def to_dict(self) -> dict:
        return {
            "dtype": self.dtype,
            "roundings": self.roundings,
            "of": self.of,
            "gap": self.gap,
            "bound": self.bound,
            "ok": self.ok,
            "words": self.words(),
        }


def allowed(dtype: str | None, roundings: int, magnitude: Any) -> Any:
    """What two computations of the same sums may differ by: each within gamma(roundings) * magnitude of the
    exact result (magnitude: sum |x_i| of the terms, per element or as one number)."""
    return 2 * gamma(roundings, roundoff(dtype).u) * magnitude


def measure(
    got: np.ndarray, want: np.ndarray, dtype: str | None, roundings: int, magnitude: Any, of: str, slack: Any = 0.0
) -> Closeness:
    """How close `got` came to `want` (float64 arrays of one shape, their NaNs and infinities equal where they
    stand) against `allowed(dtype, roundings, magnitude)` plus `slack` (an allowance carried in, such as the
    gaps of a sum's own inputs): the element that used most of its allowance. A NaN or an infinity on one side
    only is an infinite gap."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        gap = np.where(same, 0.0, np.abs(got - want))
        gap = np.where(np.isnan(gap), np.inf, gap)
        bound = np.broadcast_to(np.asarray(allowed(dtype, roundings, magnitude) + slack, dtype=np.float64), gap.shape)
        share = np.where(gap == 0, 0.0, gap / np.where(bound > 0, bound, 0.0))
    if not gap.size:
        return Closeness(dtype or "float64", roundings, of, 0.0, 0.0)
    i = int(np.argmax(np.where(np.isnan(share), np.inf, share)))
    return Closeness(dtype or "float64", roundings, of, float(gap.flat[i]), float(bound.flat[i]))


SUMMING = ("sum", "avg")  # the ops of theirs that round (max and min pick a value: exact)


def reduced(terms: int, results: int, divides: bool = False) -> int:
    """The roundings each result of a reduction of `terms` values into `results` makes: an addition per term
    it gathers but one, and one more when it divides (a mean)."""
    return max(0, terms // max(1, results) - 1) + divides


def additions(op: str, params: dict, members: int) -> int:
    """The roundings one call's sum puts in each of its results: one per member but one, and the average's
    division; 0 for a call that adds nothing up."""
    if op not in OPS or not OPS[op].reduces or params.get("op") not in SUMMING:
        return 0
    return members - 1 + (params["op"] == "avg")


def counted(result: Any, seen: list[int] | None = None) -> list[int]:
    """Per rank of a run (a RunResult), the roundings it was seen to make: its ctx.xp products and sums
    (engine/work.py), or, where more, `seen` (what a real run of the same program counted of its torch
    arithmetic: engine/torch_xp.py), and its calls' sums. numpy arithmetic outside ctx.xp is not seen."""
    out = list(getattr(result, "roundings", None) or [0] * result.trace.world)
    if seen is not None:
        out = [max(a, b) for a, b in zip(out, seen)]
    for e in result.trace.events:
        if e.kind == "collective":
            k = additions(e.op, e.params, e.group.size)
            for m in e.members:
                out[m.rank] += k
    return out


def worst(items: list[Closeness | None]) -> Closeness | None:
    """The comparison that came closest to its allowance (or went furthest past it)."""
    known = [c for c in items if c is not None]
    return max(known, key=lambda c: c.share, default=None)
