"""How errors name ranks and calls: lists of ranks, lines grouped by text, mismatched calls."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import CollectiveMismatch


def rank_list(ranks: Sequence[int]) -> str:
    """Ranks in brackets, runs of three or more consecutive ones as a range: [0-2, 5, 7, 9-1023]."""
    parts, i, n = [], 0, len(ranks)
    while i < n:
        j = i
        while j + 1 < n and ranks[j + 1] == ranks[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ranks[i]}-{ranks[j]}")
        else:
            parts.extend(str(r) for r in ranks[i : j + 1])
        i = j + 1
    return "[" + ", ".join(parts) + "]"


def ranks_text(ranks: Sequence[int]) -> str:
    """A list of ranks as errors write it: in full up to 16, as ranges beyond (an error about 2,048 ranks
    stays a line, not 10 KB)."""
    return str(list(ranks)) if len(ranks) <= 16 else rank_list(ranks)


def by_text(texts: dict[int, str], indent: str = "  ") -> list[str]:
    """One line per distinct text, naming the ranks that share it (in order of their first rank):
    a fault among thousands of ranks reads as a few lines."""
    shared: dict[str, list[int]] = {}
    for r in sorted(texts):
        shared.setdefault(texts[r], []).append(r)
    return [
        f"{indent}rank {rs[0]}: {t}" if len(rs) == 1 else f"{indent}ranks {rank_list(rs)[1:-1]}: {t}"
        for t, rs in shared.items()
    ]


def mismatch_error(call: int, group: Any, calls: dict[int, str | None]) -> CollectiveMismatch:
    """The error for members of `group` whose call #`call` on it differ. calls: rank -> 'desc at site'."""
    lines = by_text({r: calls.get(r) or "not arrived yet" for r in group.ranks})
    arrived = [r for r in group.ranks if calls.get(r)]
    return CollectiveMismatch(
        f"collective call #{call} on group {group} does not match across ranks:\n" + "\n".join(lines),
        [str(calls[r]) for r in arrived],
        arrived,
    )  # each arrived: its text is there


def p2p_mismatch_error(src: int, send_call: str, dst: int, recv_call: str) -> CollectiveMismatch:
    return CollectiveMismatch(
        f"point-to-point transfer does not match:\n  rank {src}: {send_call}\n  rank {dst}: {recv_call}",
        [send_call, recv_call],
        [src, dst],
    )
