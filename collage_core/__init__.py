"""Collage: measure every backend on every piece of a model, place each piece where it runs fastest."""

from collage_core.errors import CollageError
from collage_core.hookspecs import hookimpl
from collage_core.optimizer import OptimizedModel, optimize
from collage_core.placement_file import Placement, load_placement
from collage_core.records import Availability, Backend, Candidate, Cost, Partition, Pattern, PatternMatch
from collage_core.timing import MeasureSettings

__all__ = [
    "Availability",
    "Backend",
    "Candidate",
    "CollageError",
    "Cost",
    "MeasureSettings",
    "OptimizedModel",
    "Partition",
    "Pattern",
    "PatternMatch",
    "Placement",
    "hookimpl",
    "load_placement",
    "optimize",
]
