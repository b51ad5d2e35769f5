"""JSON as parasim writes it: strict (RFC 8259: no NaN, no Infinity), every value converted once here; and a
result as a notebook shows it (HTML tables, a pandas DataFrame, a PNG), which lessons and reports share as they
share their JSON.

What a run returns comes from a user's program and can be anything. Numbers, strings, lists, dicts,
numpy arrays and scalars (bfloat16 included), fractions and tensors have an obvious JSON form; a value
without one (a function, a lock, a set, a generator, an object or complex array) is refused in one line
that names where it sits (`values[1]['key']`, "rank 1's value at ['key']"), never a TypeError traceback.
Floats that JSON cannot carry (nan, inf, -inf) are written as the strings "nan", "inf", "-inf".
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from html import escape
from typing import Any, Sequence

from .errors import UsageError


class Unencodable(UsageError):
    """A value with no JSON form; `where` says where it sits (a path such as values[1]['key'])."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


def _float(v: float) -> Any:
    return v if math.isfinite(v) else str(v)  # 'nan', 'inf', '-inf'


def _refuse(v: Any, where: str) -> Unencodable:
    kind = type(v).__name__
    if hasattr(v, "dtype") and hasattr(v, "shape"):
        kind = f"{'numpy array' if kind == 'ndarray' else kind} of dtype {v.dtype}"
    return Unencodable(
        f"{_named(where)} is {_a(kind)}, which has no JSON form; use numbers, strings, arrays, lists or dicts", where
    )


def _named(where: str) -> str:
    """'rank 1's value[2]['k']' -> "rank 1's value, at [2]['k']" (the path apart, so it reads)."""
    head, bracket, rest = where.partition("[")
    return f"{head}, at {bracket}{rest}" if bracket else where


def jsonable(v: Any, where: str = "the value") -> Any:
    """`v` as plain JSON values: arrays as nested lists, numpy scalars as numbers, tuples as lists, fractions
    as "p/q" (or an integer), non-finite floats as strings. Integer-valued floats stay floats. Raises
    Unencodable naming `where` and the path inside it for a value with no JSON form."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, Fraction):  # exact ratios (bubbles, traffic) read best as "p/q"
        return str(v) if v.denominator != 1 else int(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise Unencodable(
                    f"{_named(where)} has a key of type {type(k).__name__} ({k!r:.40}), which JSON cannot "
                    "name; use strings or numbers as keys",
                    where,
                )
            out[str(k)] = jsonable(x, f"{where}[{k!r}]")
        return out
    import numpy as np

    if isinstance(v, np.generic):
        return _scalar(v, where)
    if isinstance(v, np.ndarray):
        return _array(v, where)
    if type(v).__module__.startswith("torch") and hasattr(v, "detach"):  # a tensor, without importing torch
        return _array(v.detach().cpu().float().numpy() if _low_float(v) else v.detach().cpu().numpy(), where)
    raise _refuse(v, where)


def _low_float(t: Any) -> bool:
    return str(t.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2")


def _scalar(v: Any, where: str) -> Any:
    import numpy as np

    kind = v.dtype.kind
    if kind == "b":
        return bool(v)
    if kind in "iu":
        return int(v)
    if kind == "f" or _extension_float(v.dtype):
        return _float(float(v))
    if kind in "US":
        return str(v)
    raise _refuse(np.asarray(v), where)


def _array(a: Any, where: str) -> Any:
    import numpy as np

    kind = a.dtype.kind
    if kind in "biu":
        return a.tolist()
    if kind == "f" or _extension_float(a.dtype):
        f = a.astype(np.float64)
        if np.isfinite(f).all():
            return f.tolist()
        return _nested(f.tolist())
    if kind in "US":
        return a.tolist()
    raise _refuse(a, where)


def _extension_float(dtype: Any) -> bool:
    """bfloat16 and the float8 types of ml_dtypes: numpy gives them kind 'V'."""
    return dtype.kind == "V" and dtype.names is None and any(s in dtype.name for s in ("bfloat", "float8", "float4"))


def _nested(x: Any) -> Any:
    if isinstance(x, list):
        return [_nested(y) for y in x]
    return _float(x)


def dumps(obj: Any, indent: int | None = 1, where: str = "the output") -> str:
    """Strict JSON text of `obj` (converted by `jsonable`); json.loads with parse_constant raising reads it."""
    return json.dumps(jsonable(obj, where), indent=indent, allow_nan=False)


def _a(kind: str) -> str:
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


# -- in a notebook (Jupyter calls _repr_html_ and _repr_png_) ------------------------------------------------


def table_html(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> str:
    """A titled table, a header row and a row per entry; notes under it."""
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows)
    under = "".join(f"<p><small>{escape(n)}</small></p>" for n in notes)
    caption = f"<b>{escape(title)}</b>" if title else ""
    return f"{caption}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{under}"


def lines_html(lines: Sequence[str]) -> str:
    """Lines of text as a paragraph each."""
    return "".join(f"<p>{escape(line)}</p>" for line in lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def data_frame(rows: Sequence[dict[str, Any]], index: str | None = None) -> Any:
    """Rows as a pandas DataFrame (pandas is not one of parasim's dependencies: said in one line if absent)."""
    try:
        import pandas
    except ImportError:
        from .errors import UsageError

        raise UsageError("to_pandas needs pandas: pip install pandas") from None
    frame = pandas.DataFrame(list(rows))
    return frame.set_index(index) if index is not None and index in frame else frame


class Png:
    """A picture a notebook shows (IPython displays `_repr_png_`, whatever matplotlib's back end) or saves."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def of(cls, figure: Any) -> "Png":
        import io

        buf = io.BytesIO()
        figure.savefig(buf, format="png", dpi=120, bbox_inches="tight")  # render/plot_base.DPI
        return cls(buf.getvalue())

    def _repr_png_(self) -> bytes:
        return self.data

    def save(self, path: str) -> None:
        """The picture in `path`, whole or not at all (written beside it, then renamed over it)."""
        import os

        temp = f"{path}.part"
        with open(temp, "wb") as f:
            f.write(self.data)
        os.replace(temp, path)
