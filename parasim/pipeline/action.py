"""One step of a pipeline schedule, named as torch.distributed.pipelining names it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "I" or "W"
    mb: int  # micro-batch, 0-based
    stage: int  # global pipeline stage (model chunk)
    chunk: int = 0  # which of its rank's chunks: 0 first, 1 second, ...

    def __str__(self) -> str:
        if self.chunk == 0:
            return f"{self.kind}{self.mb + 1}"
        if self.chunk == 1:
            return f"{self.kind.lower()}{self.mb + 1}"
        return f"{self.kind}{self.mb + 1}:{self.chunk + 1}"

    def torch_name(self) -> str:
        """torch.distributed.pipelining's string form: <stage><kind><micro-batch>, 0-based."""
        return f"{self.stage}{self.kind}{self.mb}"


Schedule = list[list[Action]]
