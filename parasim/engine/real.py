"""A real run, checked against the virtual run of the same program.

Every real rank hands back its own record of each call (comm/torchdist.py). Those records are compared,
rank by rank and call by call, with what the same rank did on virtual ranks (compare.py), and merged into
one trace with the same logical clock as the virtual engine, plus the measured time of every call (merge.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .launch import RankJob, RealOptions, Target, join_torchrun, launch_many
from ..comm.trace import Trace
from .tolerance import Closeness
from .compare import compare
from .merge import merge
from .virtual import run_virtual


@dataclass
class RealReport:
    backend: str
    world: int
    values: list[Any]  # each rank's return value (numpy)
    trace: Trace  # the real run, merged, with measured times in `times`
    times: dict[tuple[int, int], tuple[float, float]]  # (seq, rank) -> (start_us, dur_us)
    differences: list[str] = field(default_factory=list)
    startup_s: float = 0.0
    # the comparison that came closest to what rounding allows it (None: every value bit for bit)
    closest: Closeness | None = None
    device: str = "cpu"  # where the program's tensors were (rank 0's)
    wire: str = "cpu"  # where the backend's calls ran on them: "cpu" with device "cuda" is a copy to the host and back

    @property
    def tolerance_used(self) -> bool:
        return self.closest is not None

    @property
    def match(self) -> bool:
        return not self.differences

    def timings(self) -> dict[str, dict[str, float]]:
        """Measured time per kind of call, over every rank."""
        out: dict[str, list[float]] = {}
        for e in self.trace.events:
            for m in e.members:
                out.setdefault(e.op, []).append(self.times[(e.seq, m.rank)][1])
        return {
            op: {"calls": len(v), "total_ms": round(sum(v) / 1e3, 3), "mean_us": round(sum(v) / len(v), 1)}
            for op, v in sorted(out.items())
        }

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "world": self.world,
            "match": self.match,
            "differences": self.differences,
            "timings": self.timings(),
            "startup_s": round(self.startup_s, 3),
            "events": len(self.trace.events),
            "device": self.device,
            "wire": self.wire,
            "tolerance": "exact" if self.closest is None else self.closest.to_dict(),
        }


def run_real(target: Target, world: int, opts: RealOptions, virtual_program: Any = None) -> RealReport | None:
    """Run on real ranks (launching them, or joining torchrun) and compare with a virtual run.

    Returns None on the ranks of a torchrun job other than rank 0."""
    t = time.perf_counter()
    if _torchrun():
        results = join_torchrun(target, opts)
        if results is None:
            return None
    else:
        (results,) = launch_many([(target, opts)], world)
    startup = time.perf_counter() - t - _in_calls(results)
    return _compared(target, opts, results, startup, virtual_program)


def run_real_many(jobs: list[RankJob], world: int) -> list[RealReport]:
    """Several programs on one launch of `world` local ranks (one start-up for all), each compared with
    its own virtual run. The start-up is shared: every report carries the whole of it."""
    t = time.perf_counter()
    runs = launch_many(jobs, world)
    startup = time.perf_counter() - t - sum(_in_calls(results) for results in runs)
    return [_compared(target, opts, results, startup) for (target, opts), results in zip(jobs, runs)]


def _compared(
    target: Target, opts: RealOptions, results: list[dict], startup: float, virtual_program: Any = None
) -> RealReport:
    """The report of one real run: its merged trace, and its differences from the virtual run."""
    world = len(results)
    program = virtual_program if virtual_program is not None else target
    if not callable(program):
        from .launch import _load

        program = _load(program)
    virtual = run_virtual(
        program, world, seed=opts.seed, keep_values=opts.keep_values, algo=opts.algo, timeout=opts.timeout
    )
    trace, times = merge(results, opts.backend)
    report = RealReport(
        opts.backend,
        world,
        [r["value"] for r in results],
        trace,
        times,
        startup_s=max(0.0, startup),
        device=results[0].get("device", "cpu"),
        wire=results[0].get("wire", "cpu"),
    )
    report.differences, report.closest = compare(virtual, results)
    return report


def _torchrun() -> bool:
    from ..comm.torchrun import under_torchrun

    return under_torchrun()


def _ends(result: dict) -> list[float]:
    return [rec["t1"] for rec in result["records"] if "t1" in rec]


def _in_calls(results: list[dict]) -> float:
    """Seconds from a program's start to its last call's end (on the slowest rank): the part of a launch's
    wall time that is not start-up."""
    return max((t1 for r in results for t1 in _ends(r)), default=0.0)
