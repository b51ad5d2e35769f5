"""What a trace's marks say, read once for the app: each phase's notes, the pipeline slot tables, the
compute events. A real-size symbolic run has hundreds of thousands of marks and events; the app asks at
every step, so a step reads these instead of the whole trace. Notes and slot labels are shown as read here:
through `printable`, once."""

from __future__ import annotations

from functools import cached_property

from ..render.text import printable
from ..comm.trace import Event, Trace


class MarkIndex:
    def __init__(self, trace: Trace):
        self.trace = trace

    @cached_property
    def notes_by_phase(self) -> dict[str, list[tuple[int, str]]]:
        """phase -> (rank, note) in the order the notes were left, each under the phase its rank was in."""
        out: dict[str, list[tuple[int, str]]] = {}
        current: dict[int, str] = {}
        if not self.trace.noted():
            return out  # no rank that ran left one, so no copy of one either (a folded trace's marks stay folded)
        for mk in self.trace.marks:
            if mk.kind == "phase":
                current[mk.rank] = mk.text
            elif mk.kind == "note" and mk.rank in current:
                out.setdefault(current[mk.rank], []).append((mk.rank, printable(mk.text)))
        return out

    @cached_property
    def phase_order(self) -> list[str]:
        # the ranks that ran entered every phase first (a folded trace's other marks are copies of theirs)
        return list(dict.fromkeys(mk.text for mk in self.trace.ran_marks if mk.kind == "phase"))

    @cached_property
    def tables(self) -> dict[str, dict[int, list[str]]]:
        """phase -> the slot table its ranks noted (row number -> cells)."""
        out: dict[str, dict[int, list[str]]] = {}
        if not self.trace.noted("table_row"):
            return out
        for phase, _, _, data in self.trace.notes("table_row"):
            if phase:
                out.setdefault(phase, {})[data["table_row"]] = [printable(cell) for cell in data["cells"]]
        return out

    @cached_property
    def computes(self) -> list[tuple[Event, tuple[int, ...]]]:
        """Each compute event with the ranks that did its work (a folded trace's stays folded)."""
        return self.trace.compute_events()
