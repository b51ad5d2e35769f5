"""parasim: LLM training parallelism (DP/ZeRO, TP, SP, CP, PP, EP), taught by running it.

The names below are imported on first use (PEP 562), not when the package is: the `parasim` command's
first act is to take over Ctrl-C, and numpy, imported eagerly here, would have been half-way through its
own import by then (an interrupt there surfaces as numpy's ImportError, not as an interrupt)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "Group": "comm.interface",
    "Recv": "comm.interface",
    "Send": "comm.interface",
    "RunResult": "engine.runner",
    "run": "engine.runner",
    "PRESETS": "layout",
    "Layout": "layout",
    "LayoutError": "layout",
    "ModelSpec": "layout",
    "preset": "layout",
    "memory": "api",
    "fit": "api",
    "read_job": "api",
    **{
        name: "errors"
        for name in (
            "CollectiveError",
            "CollectiveMismatch",
            "Deadlock",
            "ParasimError",
            "RankFailed",
            "RealRunFailed",
            "TimedOut",
            "UsageError",
        )
    },
}
__all__ = [
    "run",
    "lesson",
    "memory",
    "fit",
    "read_job",
    "RunResult",
    "Layout",
    "LayoutError",
    "ModelSpec",
    "PRESETS",
    "preset",
    "Group",
    "Send",
    "Recv",
    "ParasimError",
    "UsageError",
    "CollectiveError",
    "CollectiveMismatch",
    "Deadlock",
    "RankFailed",
    "RealRunFailed",
    "TimedOut",
]


# `parasim.lesson("tp-mlp", tp=4)` runs a lesson: `lesson` is the module parasim/lesson.py (the import system
# binds a submodule to its package's attribute), which is made callable there (api.lesson).


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    try:  # `import parasim; parasim.layout.mesh`: a subpackage, as an eager import would have bound it
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
