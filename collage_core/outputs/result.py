"""What ``optimize`` returns: the placement, a runnable build, and the measurements behind them."""

from __future__ import annotations

import json
import os
import shutil
import weakref
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np
from tvm import relax

from collage_core import tvm_compat
from collage_core.build.deploy import copy_library, load_library, replacing_outputs
from collage_core.errors import CollageError
from collage_core.measure.measurement import MeasurementReport
from collage_core.measure.threads import ThreadSettings
from collage_core.model.model_import import ImportedModel
from collage_core.model.verify import Verification
from collage_core.outputs import output_folder
from collage_core.outputs.end_to_end import PLACEMENT, EndToEnd
from collage_core.outputs.index_ranges import IndexRange, check_index_ranges, index_ranges
from collage_core.outputs.output_folder import RunFolder
from collage_core.outputs.picture import backend_colours
from collage_core.outputs.placement_file import SEARCH_BEST_FILE, Placement
from collage_core.outputs.report import is_noisy, placement_throughput, render_report
from collage_core.outputs.reuse import FinishedBuild, FinishKey, save_finished
from collage_core.outputs.run_inputs import Expected, checked_inputs
from collage_core.outputs.search_history import history_svg
from collage_core.records import Cost
from collage_core.search.two_level import TwoLevelResult

SEARCH_PICTURE = "two-level-search.svg"  # the two-level search, generation by generation
# Beside placement.json when a baseline won the contest: what the search found, to replay or export.
SEARCHED_PLACEMENT_FILE = "searched-placement.json"


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
    # With an accuracy budget: the units kept in float32 and the probes that chose them (collage_core.model.accuracy_budget).
    accuracy: Any = attrs.field(default=None, repr=False)
    # The search's own placement when a baseline won the contest in turns and is ``placement`` instead.
    searched_placement: Optional[Placement] = attrs.field(default=None, repr=False)
    # The placement file a replay rebuilt (None: this run searched).
    replayed_from: Optional[str] = None
    # The latency a contest in turns chose by (collage_core.measure.in_turns.LATENCIES; None: none decided).
    chosen_by: Optional[str] = None
    # The thread settings its partitions ran and were measured with (this process's: the workers inherit them).
    threads: ThreadSettings = attrs.field(factory=ThreadSettings.from_environment, repr=False)
    _vm: Any = attrs.field(default=None, repr=False)
    _index_ranges: Any = attrs.field(default=None, repr=False)

    @property
    def index_ranges(self) -> tuple[IndexRange, ...]:
        """The range of each integer input that indexes a table (token ids), which :meth:`run` checks."""
        if self._index_ranges is None:
            self._index_ranges = index_ranges(self.model.mod)
        return self._index_ranges

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the built placement in this process, each backend's runtime prepared first (a partition's
        kernels may have been built and loaded only in the worker processes that measured them). An integer
        input outside the table it indexes (a token id past the vocabulary) is refused before anything runs
        (:class:`~collage_core.outputs.index_ranges.IndexOutOfRange`): the library's kernels read indices unchecked.
        So are inputs that are not one per :attr:`model.inputs <ImportedModel.inputs>`, of its type and shape
        (:class:`~collage_core.outputs.run_inputs.InputMismatch`, one line naming the input)."""
        inputs = checked_inputs([Expected(spec.name, spec.dtype, spec.shape) for spec in self.model.inputs], inputs)
        check_index_ranges(self.index_ranges, inputs)
        if self._vm is None:
            device = tvm_compat.device_for(self.target)
            self._vm = (relax.VirtualMachine(load_library(self.library_path, device=device), device), device)
        vm, device = self._vm
        result = vm["main"](*[tvm_compat.to_tensor(a, device) for a in inputs])
        return [tvm_compat.to_numpy(o) for o in (result if not hasattr(result, "numpy") else [result])]

    def latency(self, name: str = PLACEMENT) -> Cost:
        """The cost of the report's row called ``name`` (the placement's by default); :class:`CollageError` naming
        the rows there are when there is none of that name."""
        found = next((e.cost for e in self.end_to_end if e.name == name), None)
        if found is None:
            rows = ", ".join(repr(e.name) for e in self.end_to_end)
            raise CollageError(f"latency: no row called {name!r} in this result's table (its rows: {rows})")
        return found

    def save(self, directory: os.PathLike) -> Path:
        """Write ``placement.json``, the compiled library, the report table, ``results.json`` and, after
        a two-level search, its picture (``two-level-search.svg``) into ``directory``; after a search
        whose placement lost the contest in turns, that placement as ``searched-placement.json`` (a
        search's directory holds one only then). Each file is written whole under a temporary name and renamed
        into place, the library first; the search's best so far (``search-best-placement.json``) is then removed.
        The folder is held meanwhile, as a run holds it: one that a run is writing into is refused in one line."""
        with output_folder.saving_into(directory, "OptimizedModel.save") as folder:
            return self._save(folder)

    def _save(self, directory: Path) -> Path:
        # The library first (the slow copy; the one before stays in place until this one is renamed over it), then the
        # small files that describe it, within milliseconds: a run killed during the copy leaves the run before whole.
        library = output_folder.library_file(directory, self.model.name)
        if self.library_path.resolve() != library.resolve():
            copy_library(self.library_path, library)
        if self.searched_placement is not None:
            self.searched_placement.save(directory / SEARCHED_PLACEMENT_FILE)
        elif self.replayed_from is None:
            (directory / SEARCHED_PLACEMENT_FILE).unlink(missing_ok=True)
        output_folder.write_text(directory / "report.txt", render_report(self) + "\n")
        output_folder.write_text(directory / "results.json", json.dumps(self.results_json(), indent=1, sort_keys=True) + "\n")
        if self.drew_search:
            lost = (
                ""
                if self.searched_placement is None
                else (f"The search's best (the last bar) was not returned: {self.placement.why_chosen}")
            )
            output_folder.write_text(
                directory / SEARCH_PICTURE, history_svg(self.two_level.history, backend_colours(self.placement), caption=lost)
            )
        elif self.replayed_from is None:  # an op-level search over a two-level one's folder: its picture is not this run's
            (directory / SEARCH_PICTURE).unlink(missing_ok=True)
        self.placement.save(directory / "placement.json")
        (directory / SEARCH_BEST_FILE).unlink(missing_ok=True)
        return directory

    @property
    def drew_search(self) -> bool:
        """Whether ``save`` draws the two-level search (``two-level-search.svg``)."""
        return self.two_level is not None and bool(self.two_level.history)

    def results_json(self) -> dict:
        """The report's numbers for scripts: end-to-end latencies, measurement counts, search time, numerics."""
        measurement = self.measurement
        work = placement_throughput(self)
        return {
            "model": self.model.name,
            "precision": self.model.precision,
            "accuracy_budget": None if self.accuracy is None else self.accuracy.to_json(),
            "search": self.placement.search,
            "why_chosen": self.placement.why_chosen,
            "replayed_from": self.replayed_from,
            "chosen_by": self.chosen_by,
            "end_to_end": [{**row.to_json(), "noisy": is_noisy(row.cost)} for row in self.end_to_end],
            "candidates": self.candidates,
            "measurement": None
            if measurement is None
            else {
                "distinct": measurement.distinct,
                "measured": measurement.measured,
                "from_database": measurement.from_database,
                "invalid": measurement.invalid,
                "seconds": measurement.seconds,
                "noisy": list(measurement.noisy),
                "held_up": list(measurement.held_up),
            },
            "two_level": None
            if self.two_level is None
            else {
                "generations": self.two_level.generations,
                "measured": self.two_level.measured,
                "from_database": self.two_level.from_database,
                "evaluated": self.two_level.evaluated,
                "predicted": self.two_level.predicted,
                "seconds": self.two_level.seconds,
                "history": [attrs.asdict(record) for record in self.two_level.history],
            },
            "search_s": self.search_s,
            "phases_s": self.phases_s,
            "numerics": None if self.verification is None else attrs.asdict(self.verification),
            "throughput": None if work is None else work.to_json(),
            "threads": self.threads.to_json(),
        }


def kept(
    optimized: OptimizedModel, folder: RunFolder, finish: Optional[FinishKey] = None, model_file: Optional[os.PathLike] = None
) -> OptimizedModel:
    """``optimized``, saved in the run's folder when it is the caller's (with ``finish``, the run's end
    too, for a rerun from the same searched placement to reuse; with ``model_file``, the record of the file it came
    from, :func:`~collage_core.outputs.output_folder.record_model_file`); a temporary folder, which holds the
    library, is removed with the result instead."""
    if folder.kept:
        library = output_folder.library_file(folder.path, optimized.model.name)
        with replacing_outputs(folder.path, library, model_file):
            # Built in the run's scratch (see optimize): moved into place now, with the files that describe it, so
            # that a run killed before its end leaves the run before's library with its placement.json.
            if optimized.library_path.resolve() != library.resolve():
                copy_library(optimized.library_path, library, move=True)
                optimized.library_path = library
            optimized._save(folder.path)  # the run holds the folder
        if finish is not None:
            save_finished(
                folder.path,
                optimized.library_path,
                FinishedBuild(finish, optimized.placement, optimized.end_to_end, optimized.verification, optimized.searched_placement),
            )
    else:
        weakref.finalize(optimized, shutil.rmtree, str(folder.path), True)
    return optimized
