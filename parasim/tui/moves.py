"""What moves at one event, in plain Python (no Textual): who sends how many bytes to whom, as the app's
"what moves" panel shows it step by step. The transfers are the ones the byte counts of the run follow
(comm/hops.py: a ring's member sends to the next, an all-to-all's to every other, a point-to-point to its
one peer); an all-to-all of a few ranks is drawn as a matrix, sender by receiver, as the dispatch of an MoE
layer is pictured."""

from __future__ import annotations

from ..comm.hops import PATTERNS, event_transfers, pattern_of
from ..render.tables import cell
from ..render.text import printable
from ..comm.trace import Event

MATRIX_MAX = 8  # an all-to-all over at most this many ranks is a matrix; a bigger one, a list
LIST_MAX = 12  # transfers listed one a line; the rest summed in one line


def moves(e: Event) -> list[str] | None:
    """The lines of the 'what moves' panel for event `e` (None for compute: nothing moves)."""
    if e.kind == "compute":
        return None
    pattern = pattern_of(e)  # how its bytes go, in the sentence comm/hops.py gives each pattern
    transfers = event_transfers(e)
    lines = [PATTERNS[pattern].how]
    if not transfers:
        return lines + ["nothing moves between ranks"]
    total = sum(n for _, _, n in transfers)
    ranks = list(e.group.ranks) if e.kind != "p2p" else e.ranks
    if pattern == "pairs" and len(ranks) <= MATRIX_MAX:
        lines += _matrix(ranks, transfers)
    else:
        for src, dst, n in transfers[:LIST_MAX]:
            lines.append(f"rank {src} → rank {dst}   {cell(n)} B")
        if len(transfers) > LIST_MAX:
            rest = transfers[LIST_MAX:]
            lines.append(f"... {len(rest)} more transfers, {cell(sum(n for _, _, n in rest))} B")
    lines.append(f"in all: {cell(total)} B in {len(transfers)} transfer{'s' * (len(transfers) != 1)}")
    if e.hops:
        lines.append("t shows each step of the ring: who sends which chunk")
    return [printable(line) for line in lines]


def _matrix(ranks: list[int], transfers: list[tuple[int, int, int]]) -> list[str]:
    """Bytes sent, a row per sender and a column per receiver ('·' on the diagonal: a chunk to itself)."""
    sent = {(s, d): n for s, d, n in transfers}
    heads = [f"to {r}" for r in ranks]
    cells = [["·" if s == d else cell(sent.get((s, d), 0)) for d in ranks] for s in ranks]
    width = max(len(x) for x in heads + [c for row in cells for c in row])
    out = ["bytes sent (rows: from rank; columns: to rank)", " " * 9 + " ".join(h.rjust(width) for h in heads)]
    out += [f"from {s:<4}" + " ".join(c.rjust(width) for c in row) for s, row in zip(ranks, cells)]
    return out
