"""V-shaped schedules: p ranks, 2p stages; rank r holds stage r on the way down and stage 2p-1-r on the way
back up, so the last rank turns each micro-batch around locally and rank 0 holds both ends.

Both follow the order torch.distributed.pipelining runs (ScheduleZBVZeroBubble, ScheduleDualPipeV);
DualPipeV's overlapped forward-and-backward pairs are written as the forward followed by the backward.
"""

from __future__ import annotations

from ..errors import UsageError
from .action import Action, Schedule


class _Ops:
    """One rank's action list, counting micro-batches per (stage, kind)."""

    def __init__(self, pp: int, r: int) -> None:
        self.down, self.up = r, 2 * pp - 1 - r
        self.acts: list[Action] = []
        self.count: dict[tuple[int, str], int] = {}
        self.weights: list[tuple[int, int]] = []  # deferred weight passes, oldest first

    def add(self, stage: int, kind: str) -> None:
        key = (stage, "I" if kind == "B" else kind)  # a full backward counts as the input pass
        mb = self.count.get(key, 0)
        self.count[key] = mb + 1
        if kind == "I":  # weight passes are only ever deferred ones, so they need no count of their own
            self.weights.append((stage, mb))
        self.put(kind, mb, stage)

    def put(self, kind: str, mb: int, stage: int) -> None:
        """Append one action; its chunk follows from the stage (0 on the way down, 1 on the way up)."""
        self.acts.append(Action(kind, mb, stage, 0 if stage == self.down else 1))

    def weight(self) -> None:
        if self.weights:
            stage, mb = self.weights.pop(0)
            self.put("W", mb, stage)


def zbv(pp: int, m: int) -> Schedule:
    """ZB-V (Qi et al. 2024, section 6): zero bubble at 1F1B's memory when F, I and W cost the same.

    Rank r: 2(p-r)-1 forwards down; r pairs (forward up, forward down); p-r triples on the up chunk (F, I,
    W); then the steady state (F down if any left, I+W down, F+I+W up); then the input backwards of the
    cool-down, and the weight passes last. Planned with at least 2p-1 micro-batches, the extra ones dropped."""
    out = []
    n = max(2 * pp - 1, m)
    for r in range(pp):
        o = _Ops(pp, r)
        f0 = f1 = 0
        for _ in range(2 * (pp - r) - 1):
            o.put("F", f0, o.down)
            f0 += 1
        for _ in range(r):
            o.put("F", f1, o.up)
            o.put("F", f0, o.down)
            f0, f1 = f0 + 1, f1 + 1
        b0 = b1 = 0
        for _ in range(pp - r):
            o.put("F", f1, o.up)
            o.put("I", b1, o.up)
            o.put("W", b1, o.up)
            f1, b1 = f1 + 1, b1 + 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                o.put("F", f0, o.down)
                f0 += 1
            o.put("I", b0, o.down)
            o.put("W", b0, o.down)
            o.put("F", f1, o.up)
            o.put("I", b1, o.up)
            o.put("W", b1, o.up)
            b0, b1, f1 = b0 + 1, b1 + 1, f1 + 1
        w0, w1 = b0, b1
        for _ in range(r):
            o.put("I", b0, o.down)
            o.put("I", b1, o.up)
            b0, b1 = b0 + 1, b1 + 1
        for _ in range(pp - r):
            o.put("I", b0, o.down)
            o.put("W", w0, o.down)
            b0, w0 = b0 + 1, w0 + 1
        for k in range(w1, b1):
            o.put("W", k, o.up)
        for k in range(w0, b0):
            o.put("W", k, o.down)
        out.append([a for a in o.acts if a.mb < m])
    return out


def dualpipev(pp: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek-V3's DualPipe cut in half), needs m >= 2p. Rank r, in eight steps:
    1. 2(p-r-1) forwards down;  2. r+1 pairs of forwards (down, up);  3. p-r-1 times: input backward up,
    a deferred weight pass, forward up;  4. the main phase, m-2p+r+1 times: forward down + full backward
    up, forward up + full backward down (each pair overlapped: one's communication hides behind the other's
    compute);  5. p-r-1 times: full backward up, then forward up + backward down;  6. r+1 pairs of
    backwards (up, down), switching to input-only halfway;  7. p-r-1 times: a weight pass, a backward down;
    8. the deferred weight passes."""
    if m < 2 * pp:
        raise UsageError(
            f"dualpipev needs at least as many micro-batches as stages: m >= 2 * pp = {2 * pp}, got m = {m}"
        )
    out = []
    for r in range(pp):
        o = _Ops(pp, r)
        down, up = o.down, o.up
        for _ in range(2 * (pp - r - 1)):
            o.add(down, "F")
        for _ in range(r + 1):
            o.add(down, "F")
            o.add(up, "F")
        for _ in range(pp - r - 1):
            o.add(up, "I")
            o.weight()
            o.add(up, "F")
        for _ in range(m - 2 * pp + r + 1):
            o.add(down, "F")
            o.add(up, "B")
            o.add(up, "F")
            o.add(down, "B")
        for _ in range(pp - r - 1):
            o.add(up, "B")
            o.add(up, "F")
            o.add(down, "B")
        split = False  # the second half of these backwards leaves the weight pass for later
        for i in range(r + 1):
            split = split or (i == (r + 1) // 2 and r % 2 == 1)
            o.add(up, "I" if split else "B")
            split = split or (i == (r + 1) // 2 and r % 2 == 0)
            o.add(down, "I" if split else "B")
        for _ in range(pp - r - 1):  # split is on by now: it turns on at the latest when i = r
            o.weight()
            o.add(down, "I")
        while o.weights:
            o.weight()
        out.append(o.acts)
    return out
