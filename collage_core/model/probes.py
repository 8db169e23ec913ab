"""Accuracy probes' builds: variants of one 16-bit model, each with some units back in float32, placed,
built and run once in fresh workers, several at once (see :mod:`collage_core.model.accuracy_budget`).

A probe needs its placement's outputs only: nothing is timed, no library is exported, no CUDA graph
is captured. The zygote holds the 16-bit model and its float32 original once; a worker forked from
it widens its own copy (:func:`collage_core.model.widening.widen`) and builds the placement it is sent as
partitions, so no variant is saved and loaded as IR on the way (BERT-base: 6 s to save and 5 s to
load, each time). Where workers are not forked from a zygote, each placed variant is sent whole.

Builds run ``settings.parallel_builds()`` at once. They share the device, which is safe: a probe is
not timed, and the GPU libraries' build-time tuning (cuBLAS, cuDNN) ran when the candidates were
measured, one at a time, and is remembered by problem; a build meeting a problem never tuned before
tunes it while others run, which may choose another algorithm, never a wrong one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import attrs
import numpy as np

from collage_core import tvm_compat
from collage_core.build.partition import partition_module
from collage_core.errors import CollageError
from collage_core.measure import zygote
from collage_core.measure.arrays_file import load_arrays
from collage_core.measure.job import BUILD_TIMEOUT_S, Job, parts_to_json
from collage_core.measure.worker_client import MeasurementWorker, WorkerFailure
from collage_core.model.precision import with_float32_units
from collage_core.model.relax_graph import RelaxGraph


def outputs_of_variants(base: Job, original, variants: Sequence[tuple[Sequence[int], Sequence]], workers: int) -> list[list[np.ndarray]]:
    """The outputs of each ``(float32_units, parts)`` of ``variants``: ``base``'s 16-bit model with those
    units widened from ``original`` (the same model at float32), placed by ``parts`` (partitions of that
    variant's graph), built in a fresh worker and run once on ``base``'s inputs, ``workers`` at once."""
    inputs = base.workdir / "probe-inputs.npz"
    np.savez(inputs, *base.inputs)
    key = f"{base.held_key}+widenable"
    held = zygote.hold_model(base.plugin_modules, base.disabled, key, lambda: _write_pair(base, original))
    for name in ("model.json", "original.json"):
        (base.workdir / name).unlink(missing_ok=True)
    requests = []
    for index, (units, parts) in enumerate(variants):
        request = {
            "op": "run_placement",
            "target": tvm_compat.target_to_json(base.target),
            "inputs": str(inputs),
            "outputs": str(base.workdir / f"probe-{index}-outputs.npz"),
            "settings": attrs.evolve(base.settings, cuda_graphs=False).to_json(),
            "library": None,
            "timed": False,
        }
        if base.remote is not None:  # built here for the servers, run on one of them
            request["library"] = str(base.workdir / f"probe-{index}.so")
            request["remote"] = base.remote.request_for_every_backend()
        if held:
            request.update(held=key, float32_units=sorted(units), parts=parts_to_json(parts))
        else:
            request["module"] = str(_write_variant(base, original, units, parts, index))
        requests.append(request)
    try:
        _run_all(base, requests, workers)
        outputs = []
        for request in requests:
            outputs.append(load_arrays(request["outputs"]))
        return outputs
    finally:
        for request in requests:
            for name in ("outputs", "module", "library"):
                if request.get(name):
                    Path(request[name]).unlink(missing_ok=True)
        inputs.unlink(missing_ok=True)


def _run_all(base: Job, requests: list[dict], workers: int) -> None:
    """Send each request to a fresh worker, ``workers`` at once; the first failure stops the rest."""

    def run(request: dict) -> None:
        try:
            with MeasurementWorker(base.plugin_modules, base.disabled) as worker:
                worker.request(request, base.settings.timeout_s + BUILD_TIMEOUT_S)
        except WorkerFailure as failure:
            raise CollageError(f"an accuracy probe's build or run failed: {failure}") from None

    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(requests))))
    try:
        for _ in pool.map(run, requests):
            pass
    finally:
        pool.shutdown(cancel_futures=True)


def _write_pair(base: Job, original) -> dict:
    """The 16-bit model and its float32 original saved for the zygote to hold."""
    paths = {"module": base.workdir / "model.json", "original": base.workdir / "original.json"}
    paths["module"].write_text(tvm_compat.save_ir_json(base.imported.mod))
    paths["original"].write_text(tvm_compat.save_ir_json(original.mod))
    return paths


def _write_variant(base: Job, original, units, parts, index: int) -> Path:
    """One variant placed by ``parts``, saved whole for a worker that holds no model."""
    variant = with_float32_units(base.imported, units, original)
    placed = partition_module(RelaxGraph.from_function(variant.mod["main"], variant.mod), list(parts))
    path = base.workdir / f"probe-{index}.json"
    path.write_text(tvm_compat.save_ir_json(placed))
    return path
