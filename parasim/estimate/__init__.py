"""The estimator: memory, traffic, time and the longest sequence, from formulas alone.

It imports no backend (no torch, no virtual or real ranks; of parasim.comm only its tables: the op table and
the hop patterns): it is what the engine's measurements are checked against. models (presets, flags, Hugging Face config.json), memory (itemised bytes per GPU), traffic
(bytes per collective, FLOPs), fit (longest sequence, layout search). Time is the clock's
(parasim/clock/plan.py), on the same plans.
"""

from .fit import Fit, fit, search
from .memory import Breakdown, Plan, breakdown
from ..layout import ModelSpec
from .models import from_hf_config, get_model
from .traffic import GpuSpec, gpu_presets, gpu_spec, step_flops, step_traffic

__all__ = [
    "ModelSpec",
    "get_model",
    "from_hf_config",
    "Plan",
    "Breakdown",
    "breakdown",
    "Fit",
    "fit",
    "search",
    "GpuSpec",
    "gpu_presets",
    "gpu_spec",
    "step_traffic",
    "step_flops",
]
