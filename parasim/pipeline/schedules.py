"""Pipeline schedules as data: for each stage rank, the ordered list of actions it runs.

Actions use torch.distributed.pipelining's letters: F (forward), B (full backward), I (backward for the
input only), W (backward for the weights, deferred). Micro-batches are 0-based inside; tables print them
1-based, as the post does. Each generator is a few lines of the rule it implements.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

SCHEDULES = ("gpipe", "1f1b", "zb-h1")


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "I" or "W"
    mb: int  # micro-batch, 0-based
    stage: int  # pipeline stage (model chunk); equals the rank with one chunk per rank

    def __str__(self) -> str:
        return f"{self.kind}{self.mb + 1}"

    def torch_name(self) -> str:
        """torch.distributed.pipelining's string form: <stage><kind><micro-batch>, 0-based."""
        return f"{self.stage}{self.kind}{self.mb}"


def gpipe(pp: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards in reverse micro-batch order (the post's table)."""
    return [[Action("F", k, r) for k in range(m)] + [Action("B", k, r) for k in reversed(range(m))]
            for r in range(pp)]


def one_f_one_b(pp: int, m: int) -> list[list[Action]]:
    """Rank r: p-r-1 warm-up forwards, then one forward and one backward at a time, then the remaining
    backwards. At most p-r micro-batches' activations are held at once."""
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, m)
        acts = [Action("F", k, r) for k in range(warm)]
        f, b = warm, 0
        while f < m:
            acts += [Action("F", f, r), Action("B", b, r)]
            f, b = f + 1, b + 1
        acts += [Action("B", k, r) for k in range(b, m)]
        out.append(acts)
    return out


def zb_h1(pp: int, m: int) -> list[list[Action]]:
    """Zero bubble, same memory as 1F1B (Qi et al. 2024): rank r does p-r warm-up forwards (at most m), then
    for each micro-batch k its input-gradient backward I_k, the weight pass W_(k-r) lagging r micro-batches,
    and the next forward; the remaining weight passes fill the cool-down."""
    out = []
    for r in range(pp):
        warm = min(pp - r, m)
        acts = [Action("F", k, r) for k in range(warm)]
        f, w = warm, 0
        for k in range(m):
            acts.append(Action("I", k, r))
            if k >= r:
                acts.append(Action("W", w, r))
                w += 1
            if f < m:
                acts.append(Action("F", f, r))
                f += 1
        acts += [Action("W", j, r) for j in range(w, m)]
        out.append(acts)
    return out


GENERATORS = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1}


def generate(name: str, pp: int, m: int) -> list[list[Action]]:
    """The schedule `name` for pp stages and m micro-batches; UsageError names a broken rule."""
    if name not in GENERATORS:
        raise UsageError(f"unknown schedule {name!r}; schedules: {', '.join(GENERATORS)}")
    for what, v in (("pp", pp), ("microbatches", m)):
        if not isinstance(v, int) or v < 1:
            raise UsageError(f"{what} must be a positive integer, got {v!r}")
    return GENERATORS[name](pp, m)
