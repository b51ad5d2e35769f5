"""One way to write a number, for every renderer (the walk-through, tables, the app, compare): integers and
integer-valued floats with thousands separators and no '.0', other floats to a few significant digits, and
bytes with their unit. Lists and dicts are each renderer's own layout; the numbers inside them come from here."""

from __future__ import annotations

from typing import Any

BIG = 1e15  # from here on a float is written in exponent form, even when it holds an integer


def scalar(v: Any, digits: int = 6, grouped: bool = True) -> str:
    """A number as every renderer writes it: 1,234; 2 (for 2.0); 0.333333 (`digits` significant digits);
    anything else as str(). `grouped=False` leaves out the thousands separators, for numbers inside a list
    written with commas ([1111, 2222], not [1,111, 2,222]) and for a tensor's values."""
    sep = "," if grouped else ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:{sep}}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < BIG:
            return f"{int(v):{sep}}"
        return f"{v:{sep}.{digits}g}"
    return str(v)


def nbytes(n: int) -> str:
    """A byte count with its unit: 5,600 B."""
    return f"{scalar(n)} B"


def nbytes_short(n: int) -> str:
    """A byte count short enough for a column: exact below a million (999,999 B), else to three significant
    figures in decimal units, as the post writes them (94.4 MB, 1.21 GB); --json keeps every byte."""
    if abs(n) < 1_000_000:
        return nbytes(n)
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    raise AssertionError("unreachable: a million bytes or more is at least 1 MB")


def alike_chunks(ts: list, shown: int, sep: str = ", ") -> str | None:
    """Arrays alike but for their rows (an all-to-all's chunks, one a rank) as every renderer writes them: their
    count and each one's rows in order, 4 x float64[1/2/1/0, 10], up to `shown` of them; past that, the range
    of their rows, 64 x bfloat16[421..568, 7172]. None where they are not such chunks (one array, or arrays of
    other dtypes or widths). `sep` joins the dims (the app writes float64[4,8], the walk-through [4, 8])."""
    if len(ts) < 2 or not ts[0].shape or len({(t.dtype, tuple(t.shape[1:])) for t in ts}) != 1:
        return None
    first = [t.shape[0] for t in ts]
    lo, hi = min(first), max(first)
    rows = "/".join(map(str, first)) if len(ts) <= shown else (str(lo) if lo == hi else f"{lo}..{hi}")
    return f"{len(ts)} x {ts[0].dtype}[{sep.join([rows, *map(str, ts[0].shape[1:])])}]"
