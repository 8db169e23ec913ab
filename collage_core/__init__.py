"""Collage: measure every backend on every piece of a model, place each piece where it runs fastest.

The public names are loaded on first use, so ``import collage_core.measure.cost_db`` (or a measurement
worker) does not pay for TVM before it needs it.
"""

import importlib

from collage_core.model import torch_deferral

torch_deferral.install()

_PUBLIC = {
    "Availability": "collage_core.records",
    "Backend": "collage_core.records",
    "Candidate": "collage_core.records",
    "CollageError": "collage_core.errors",
    "Cost": "collage_core.records",
    "MeasureSettings": "collage_core.measure.timing",
    "OptimizeOptions": "collage_core.options",
    "OptimizedModel": "collage_core.outputs.result",
    "ProfiledModel": "collage_core.outputs.profiled_result",
    "ShapeNotServed": "collage_core.outputs.dispatch",
    "Partition": "collage_core.records",
    "Pattern": "collage_core.records",
    "PatternMatch": "collage_core.records",
    "PatternRefused": "collage_core.records",
    "inspect_model": "collage_core.inspection",
    "Placement": "collage_core.outputs.placement_file",
    "hookimpl": "collage_core.hookspecs",
    "load_placement": "collage_core.outputs.placement_file",
    "optimize": "collage_core.optimizer",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'collage_core' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__():
    return __all__
