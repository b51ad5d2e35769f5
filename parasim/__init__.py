"""parasim: LLM training parallelism (DP/ZeRO, TP, SP, CP, PP, EP), taught by running it."""
from .comm.interface import Group, Recv, Send
from .engine.runner import RunResult, run
from .layout import PRESETS, Layout, LayoutError, ModelSpec, preset
from .errors import (CollectiveError, CollectiveMismatch, Deadlock, ParasimError, RankFailed, RealRunFailed,
                     TimedOut, UsageError)

__version__ = "0.1.0"
__all__ = ["run", "RunResult", "Layout", "LayoutError", "ModelSpec", "PRESETS", "preset", "Group", "Send", "Recv", "ParasimError", "UsageError", "CollectiveError",
           "CollectiveMismatch", "Deadlock", "RankFailed", "RealRunFailed", "TimedOut"]
