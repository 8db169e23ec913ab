"""What ``optimize`` returns for a model optimized for several shapes: every shape's own result, the one
library that holds them all, and the checks of that library shape by shape."""

from __future__ import annotations

import json
import operator
import os
import shutil
import weakref
from pathlib import Path
from typing import Any, Optional

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.build.deploy import copy_library, load_library, replacing_outputs
from collage_core.errors import CollageError
from collage_core.model.verify import Verification
from collage_core.outputs import output_folder
from collage_core.outputs.dispatch import ShapeDispatch, run_dispatched
from collage_core.outputs.end_to_end import PLACEMENT
from collage_core.outputs.index_ranges import check_index_ranges
from collage_core.outputs.placement_file import SHAPES_FORMAT, SHAPES_VERSION
from collage_core.outputs.report import format_table, is_noisy
from collage_core.outputs.result import OptimizedModel
from collage_core.outputs.run_inputs import Expected, checked_inputs
from collage_core.outputs.shape_differences import placement_differences

# The file listing every shape's placement, written beside the library.
PLACEMENTS_FILE = "placements.json"


@attrs.frozen
class ShapeCheck:
    """The one library run at one shape, against the reference: a listed shape (``profile`` is its index) or
    a shape between them, padded up to ``profile``'s."""

    label: str
    profile: int
    padded: bool
    verification: Verification
    # The library's entry function timed in turns with the shape's own single-shape library (seconds, warm
    # medians); None when not timed.
    in_library_s: Optional[float] = None
    alone_s: Optional[float] = None

    def to_json(self) -> dict:
        return {
            **attrs.asdict(self, recurse=False, filter=lambda a, _: a.name != "verification"),
            "numerics": attrs.asdict(self.verification),
        }


@attrs.define
class ProfiledModel:
    """A model optimized for several shapes (``--shapes``): each profile's own optimization (``shapes``, in
    profile order, each saved in ``shape-K/``), the library holding every profile's placement with the
    dispatcher's record (``dispatch``), and the checks of that library."""

    name: str
    dispatch: ShapeDispatch = attrs.field(repr=lambda d: repr(d.listed()))
    shapes: tuple[OptimizedModel, ...] = attrs.field(repr=False)
    library_path: Path
    target: Any = attrs.field(repr=False)
    checks: tuple[ShapeCheck, ...] = attrs.field(repr=False)
    phases_s: dict = attrs.field(factory=dict, repr=False)
    _vm: Any = attrs.field(default=None, repr=False)

    @property
    def verified(self) -> bool:
        return all(check.verification.passed for check in self.checks)

    @property
    def index_ranges(self):
        """The range of each integer input that indexes a table (token ids), the same at every shape; :meth:`run`
        checks it."""
        return self.shapes[0].index_ranges

    def latency(self, shape: int | str, name: str = PLACEMENT):
        """The cost of the report's row called ``name`` (the placement's by default) in the run of one ``shape``: its
        index in :attr:`shapes` or its label (``"batch=8 sequence=128"``); :class:`CollageError` naming the shapes
        there are when there is none such (and the rows, as :meth:`OptimizedModel.latency
        <collage_core.outputs.result.OptimizedModel.latency>` names them, when there is no such row)."""
        labels = [profile.label for profile in self.dispatch.profiles]
        index = labels.index(shape) if isinstance(shape, str) and shape in labels else _as_index(shape)
        if index is None or not 0 <= index < len(self.shapes):
            raise CollageError(
                f"latency: no shape {shape!r} in this result (its shapes: {', '.join(map(repr, labels))}, or 0 to {len(labels) - 1})"
            )
        return self.shapes[index].latency(name)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the library on ``inputs``: the profile of their shapes, or the smallest that covers them, padded
        (see :mod:`collage_core.outputs.dispatch`). A token id past the vocabulary is refused as
        :meth:`OptimizedModel.run <collage_core.outputs.result.OptimizedModel.run>` refuses it, and so are inputs
        of another number or type (:class:`~collage_core.outputs.run_inputs.InputMismatch`)."""
        inputs = checked_inputs([Expected(spec.name, spec.dtype) for spec in self.dispatch.inputs], inputs)
        check_index_ranges(self.index_ranges, inputs)
        if self._vm is None:
            device = tvm_compat.device_for(self.target)
            self._vm = (tvm_compat.virtual_machine(load_library(self.library_path, device=device), device), device)
        vm, device = self._vm
        return run_dispatched(vm, device, self.dispatch, inputs)

    def save(self, directory: os.PathLike) -> Path:
        """Write the library (with its runtime file), ``placements.json``, ``report.txt`` and ``results.json``
        into ``directory`` (made if it does not exist), each whole; each shape's own run stays in ``shape-K/`` of the
        run's output folder. The folder is held meanwhile, as a run holds it: one that a run is writing into is
        refused in one line."""
        with output_folder.saving_into(directory, "ProfiledModel.save") as folder:
            return self._save(folder)

    def _save(self, directory: Path) -> Path:
        library = output_folder.library_file(directory, self.name)
        if self.library_path.resolve() != library.resolve():
            copy_library(self.library_path, library)
        output_folder.write_text(directory / PLACEMENTS_FILE, json.dumps(self.placements_json(), indent=1, sort_keys=True) + "\n")
        output_folder.write_text(directory / "report.txt", render_profiles_report(self) + "\n")
        output_folder.write_text(directory / "results.json", json.dumps(self.results_json(), indent=1, sort_keys=True) + "\n")
        return directory

    def placements_json(self) -> dict:
        """What ``placements.json`` holds: the shapes (inputs, profiles, entry functions, padding rule) and each
        shape's placement, in order; ``--placement`` replays it whole."""
        return {
            "format": SHAPES_FORMAT,
            "version": SHAPES_VERSION,
            "model": self.name,
            "shapes": self.dispatch.to_json(),
            "placements": [shape.placement.to_json() for shape in self.shapes],
        }

    def results_json(self) -> dict:
        return {
            "model": self.name,
            "shapes": self.dispatch.to_json(),
            "per_shape": [shape.results_json() for shape in self.shapes],
            "checks": [check.to_json() for check in self.checks],
            "phases_s": self.phases_s,
        }


def shown_ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _operators(shape: OptimizedModel) -> dict:
    return dict(shape.end_to_end[0].operators_by_backend)


def render_profiles_report(profiled: ProfiledModel) -> str:
    """The shapes side by side: each shape's latency alone and in the one library, its operators by backend,
    its numerics; then where the placements differ and why each was chosen."""
    lines = [f"{profiled.name}: one library for {len(profiled.shapes)} shapes ({profiled.library_path.name})", ""]
    rows = []
    for index, (profile, shape) in enumerate(zip(profiled.dispatch.profiles, profiled.shapes)):
        check = next((c for c in profiled.checks if c.profile == index and not c.padded), None)
        cost = shape.end_to_end[0].cost
        alone = f"{cost.median_s * 1e3:.3f} ms" + (" noisy" if is_noisy(cost) else "") if cost.is_measured else "invalid"
        rows.append(
            [
                profile.label,
                alone,
                shown_ms(None if check is None else check.in_library_s),
                shown_ms(None if check is None else check.alone_s),
                ", ".join(f"{b} {n}" for b, n in sorted(_operators(shape).items())),
                "-" if check is None else ("passed" if check.verification.passed else "FAILED"),
            ]
        )
    lines.append(
        format_table(["shape", "its own run", "in the library (turns)", "alone (turns)", "operators by backend", "numerics"], rows)
    )
    padded = [check for check in profiled.checks if check.padded]
    if padded:
        lines.append("")
        for check in padded:
            lines.append(
                f"padded: {check.label} runs on {profiled.dispatch.profiles[check.profile].label}: {check.verification.describe()}"
            )
    lines += ["", f"padding: {profiled.dispatch.padding.describe()}", ""]
    lines += placement_differences([p.label for p in profiled.dispatch.profiles], [shape.placement for shape in profiled.shapes])
    lines.append("")
    for profile, shape in zip(profiled.dispatch.profiles, profiled.shapes):
        lines.append(f"{profile.label}: {shape.placement.why_chosen}")
    return "\n".join(lines)


def _as_index(value) -> Optional[int]:
    """``value`` as an index (an int, or numpy's), or None (a bool, a string, anything else)."""
    if isinstance(value, (bool, str)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def kept_profiles(profiled: ProfiledModel, kept: bool, folder: Path, model_file: Optional[os.PathLike] = None) -> ProfiledModel:
    """``profiled`` saved in the caller's folder (with the record of ``model_file``, as
    :func:`~collage_core.outputs.result.kept` keeps it), or its temporary folder removed with it."""
    if kept:
        with replacing_outputs(folder, output_folder.library_file(folder, profiled.name), model_file):
            profiled._save(folder)  # the run holds the folder
    else:
        weakref.finalize(profiled, shutil.rmtree, str(folder), True)
    return profiled
