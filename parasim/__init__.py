"""parasim: LLM training parallelism (DP/ZeRO, TP, SP, CP, PP, EP), taught by running it."""
from .comm.interface import Group, Recv, Send
from .engine.runner import RunResult, run
from .layout import Layout, LayoutError, Model
from .errors import (CollectiveError, CollectiveMismatch, Deadlock, ParasimError, RankFailed, RealRunFailed,
                     UsageError)

__version__ = "0.1.0"
__all__ = ["run", "RunResult", "Layout", "LayoutError", "Model", "Group", "Send", "Recv", "ParasimError", "UsageError", "CollectiveError",
           "CollectiveMismatch", "Deadlock", "RankFailed", "RealRunFailed"]
