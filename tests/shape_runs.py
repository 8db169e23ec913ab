"""A quick run of several shapes for the tests: TVM alone, no baselines or calibration, few short repeats."""

from __future__ import annotations

from pathlib import Path

import collage_core
from collage_core.measure.timing import MeasureSettings

QUICK = MeasureSettings(min_repeats=2, max_repeats=3, min_repeat_ms=1.0, time_bound_s=1.0)


def optimized_for_shapes(model, shapes: str, folder: Path, **options):
    """``model`` optimized for ``shapes`` into ``folder``, with a cost database beside it."""
    return collage_core.optimize(
        model,
        shapes=shapes,
        backends=["tvm"],
        output_dir=folder,
        cost_db=folder.parent / "costs.sqlite",
        compare_backends=False,
        calibration_rounds=0,
        settings=QUICK,
        show_progress=False,
        **options,
    )
