"""What ``optimize`` returns: the placement, a runnable build, and the measurements behind them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.deploy import copy_library
from collage_core.measure import MeasurementReport
from collage_core.model_import import ImportedModel
from collage_core.placement_file import Placement
from collage_core.records import Cost
from collage_core.two_level import TwoLevelResult
from collage_core.verify import Verification

PLACEMENT = "placement"
# The returned placement built to launch kernel by kernel, on a CUDA target whose builds replay CUDA graphs.
WITHOUT_CUDA_GRAPHS = "placement without CUDA graphs"

SEARCH_PICTURE = "two-level-search.svg"  # the two-level search, generation by generation


@attrs.frozen
class EndToEnd:
    """The measured latency of one whole build: the chosen placement or a single-backend baseline."""

    name: str
    cost: Cost
    operators_by_backend: dict = attrs.field(eq=False)


@attrs.define
class OptimizedModel:
    """What ``optimize`` returns: the placement, a runnable build, and the measurements behind them."""

    model: ImportedModel
    placement: Placement
    library_path: Path
    target: Any = attrs.field(repr=False)
    end_to_end: list[EndToEnd]
    verification: Optional[Verification]
    measurement: Optional[MeasurementReport]
    candidates: int
    search_s: float
    partitioned_mod: Any = attrs.field(repr=False)
    two_level: Optional[TwoLevelResult] = attrs.field(default=None, repr=False)
    # Seconds the run spent in each phase (importing, measuring, searching, building, baselines, contest), in order.
    phases_s: dict = attrs.field(factory=dict, repr=False)
    # With an accuracy budget: the units kept in float32 and the probes that chose them (collage_core.accuracy_budget).
    accuracy: Any = attrs.field(default=None, repr=False)
    _vm: Any = attrs.field(default=None, repr=False)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the built placement in this process, each backend's runtime prepared first (a partition's
        kernels may have been built and loaded only in the worker processes that measured them)."""
        from tvm import relax

        from collage_core.deploy import load_library

        if self._vm is None:
            device = tvm_compat.device_for(self.target)
            self._vm = (relax.VirtualMachine(load_library(self.library_path, device=device), device), device)
        vm, device = self._vm
        result = vm["main"](*[tvm_compat.to_tensor(np.asarray(a), device) for a in inputs])
        return [tvm_compat.to_numpy(o) for o in (result if not hasattr(result, "numpy") else [result])]

    def latency(self, name: str = PLACEMENT) -> Cost:
        return next(e.cost for e in self.end_to_end if e.name == name)

    def save(self, directory: os.PathLike) -> Path:
        """Write ``placement.json``, the compiled library, the report table, ``results.json`` and, after
        a two-level search, its picture (``two-level-search.svg``) into ``directory``."""
        from collage_core.report import render_report

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.placement.save(directory / "placement.json")
        library = directory / f"{self.model.name}.so"
        if self.library_path.resolve() != library.resolve():
            copy_library(self.library_path, library)
        (directory / "report.txt").write_text(render_report(self) + "\n")
        (directory / "results.json").write_text(json.dumps(self.results_json(), indent=1, sort_keys=True) + "\n")
        if self.two_level is not None and self.two_level.history:
            from collage_core.picture import backend_colours
            from collage_core.search_picture import history_svg

            (directory / SEARCH_PICTURE).write_text(history_svg(self.two_level.history, backend_colours(self.placement)))
        return directory

    def results_json(self) -> dict:
        """The report's numbers for scripts: end-to-end latencies, measurement counts, search time, numerics."""
        measurement = self.measurement
        return {
            "model": self.model.name,
            "precision": self.model.precision,
            "accuracy_budget": None if self.accuracy is None else self.accuracy.to_json(),
            "search": self.placement.search,
            "end_to_end": [
                {"name": row.name, "cost": row.cost.to_json(), "operators_by_backend": row.operators_by_backend}
                for row in self.end_to_end
            ],
            "candidates": self.candidates,
            "measurement": None if measurement is None else {
                "distinct": measurement.distinct, "measured": measurement.measured, "from_database": measurement.from_database,
                "invalid": measurement.invalid, "seconds": measurement.seconds, "noisy": list(measurement.noisy),
            },
            "two_level": None if self.two_level is None else {
                "generations": self.two_level.generations, "measured": self.two_level.measured,
                "from_database": self.two_level.from_database, "evaluated": self.two_level.evaluated,
                "predicted": self.two_level.predicted, "seconds": self.two_level.seconds,
                "history": [attrs.asdict(record) for record in self.two_level.history],
            },
            "search_s": self.search_s,
            "phases_s": self.phases_s,
            "numerics": None if self.verification is None else attrs.asdict(self.verification),
        }
