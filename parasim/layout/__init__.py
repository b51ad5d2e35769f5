"""Layouts and models: the mesh axes, one entry each (axes.py), the mesh of GPUs split into TP, CP, DP, PP and
EP groups (mesh.py), the model's shapes (model.py), how its layers sit on pipeline stages (stages.py), and the one registry of named presets
(presets.py). The engine, the estimator, the CLI and the lessons all take these same objects."""

from .axes import AXES, SIZED, Axis
from .mesh import COORD_GROUP, COORDS, GROUP_NAMES, GROUP_KINDS, ORDERS, Layout, check_heads
from .model import SPREAD, LayoutError, ModelSpec, Stages
from .presets import PRESETS, Preset, layout_names, model_names, model_preset, preset
from .stages import check_stages, stage_counts, stage_layers, stage_span

__all__ = [
    "Layout",
    "LayoutError",
    "ModelSpec",
    "PRESETS",
    "Preset",
    "preset",
    "model_preset",
    "layout_names",
    "model_names",
    "check_heads",
    "Stages",
    "SPREAD",
    "check_stages",
    "stage_counts",
    "stage_layers",
    "stage_span",
    "AXES",
    "Axis",
    "SIZED",
    "ORDERS",
    "GROUP_KINDS",
    "GROUP_NAMES",
    "COORDS",
    "COORD_GROUP",
]
