"""What every picture shares: matplotlib on the Agg back end, and writing the file whole or not at all."""

from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError

DPI = 120  # pixels per inch of every picture written; text is measured at it too (its width is not linear in it)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg back end (files only, no display). MPLBACKEND is set aside while
    matplotlib is imported: it reads the variable then and refuses a name it does not know with a
    ValueError, though a picture written to a file never uses the back end the variable names."""
    named = os.environ.pop("MPLBACKEND", None)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    finally:
        if named is not None:
            os.environ["MPLBACKEND"] = named
    return plt


def save(fig: Any, path: str, bbox_inches: str | None = "tight") -> None:
    """The figure in `path` (its format from the name's suffix), whole or not at all (render/output)."""
    from .output import write_whole

    try:
        write_whole(path, lambda temp: fig.savefig(temp, dpi=DPI, bbox_inches=bbox_inches))
    except ValueError as exc:  # matplotlib: a format it cannot write
        raise UsageError(f"cannot write {path}: {exc}") from None


def tokens_text(n: float) -> str:
    """A token count as a learner reads it on an axis: 40K, 1.2M (K = 1,000 tokens)."""
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.3g}{suffix}"
    return f"{n:.0f}"
