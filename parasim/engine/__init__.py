"""Running an SPMD program: the rank context, virtual ranks, real ranks (launch, merge, compare)."""

from .runner import BACKENDS, run
from .virtual import RunResult

__all__ = ["run", "RunResult", "BACKENDS"]
