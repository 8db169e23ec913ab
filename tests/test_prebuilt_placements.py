"""Placements built several at once ahead of their timing (``Job.prebuild``), then timed one by one from their
libraries: with real workers, TVM and ONNX Runtime, against the same placements built where they are timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from collage_core import tvm_compat
from collage_core.backends import discover_backends, select_backends
from collage_core.candidates.enumeration import candidates_for
from collage_core.errors import CollageError
from collage_core.measure.job import Job, remove_prebuilt
from collage_core.measure.timing import MeasureSettings
from collage_core.model.model_import import load_model
from collage_core.model.relax_graph import RelaxGraph
from collage_core.plugins import get_plugin_manager
from collage_core.records import Cost, Partition
from collage_core.search.baselines import searched_parts

MODELS = Path(__file__).resolve().parents[1] / "models"
CPU = tvm_compat.make_target(tvm_compat.host_cpu_target())


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    pm = get_plugin_manager()
    chosen = select_backends(discover_backends(pm), ["tvm", "onnxruntime"])
    imported = load_model(MODELS / "tiny_bert.onnx")
    graph = RelaxGraph.from_function(imported.mod["main"], imported.mod)
    settings = MeasureSettings(build_workers=2, min_repeat_ms=1.0, max_repeats=5)
    return Job(imported, graph, CPU, pm, chosen, settings, tmp_path_factory.mktemp("job"), lambda message: None, False)


def placements_of(job):
    """TVM's op-level placement of the model, and the same with its first half in one ONNX Runtime region."""
    candidates = [c for c in candidates_for(job.pm, job.graph, job.chosen, CPU, job.imported.precision) if c.backend == "tvm"]
    op_level = searched_parts(job.graph, candidates, {c.key: Cost.measured(1e-3, 0.0, 1) for c in candidates})
    half = set(range(len(job.graph.graph) // 2))
    region = Partition("onnxruntime", "onnxruntime.region", sorted(half), "onnxruntime-region", Cost.unknown())
    mixed = [region] + [p for p in op_level if not set(p.nodes) & half]
    if any(set(p.nodes) & half and not set(p.nodes) <= half for p in op_level):
        pytest.skip("the op-level placement has a partition across the cut")
    return op_level, mixed


@pytest.mark.parametrize("warm", [False, True], ids=["built", "built and run once"])
def test_placements_built_at_once_run_and_time_as_those_built_where_they_are_timed(job, warm):
    placements = placements_of(job)
    libraries = job.prebuild(placements, workers=2, warm=warm)
    assert all(library is not None and library.exists() for library in libraries)
    reference = job.imported.reference(job.inputs)
    for parts, library in zip(placements, libraries):
        built_here, cost_here = job.run_built(parts, None)
        from_library, cost = job.run_built(parts, None, prebuilt=library)
        assert cost.is_measured and cost.repeats > 1 and cost_here.is_measured
        for got, expected, ref in zip(from_library, built_here, reference):
            np.testing.assert_array_equal(got, expected)  # the same code: the same outputs, bit for bit
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)  # against ONNX Runtime on the original file
        remove_prebuilt(library)
        assert not library.exists()
    assert not list(job.scratch.glob("prebuild-*")), "the batch's inputs, outputs and modules are removed"
    bogus = job.scratch / "bogus.so"
    bogus.write_bytes(b"not a library")
    with pytest.raises(CollageError, match="building or running the placement failed"):  # it is loaded, not built again
        job.run_built(placements[0], None, prebuilt=bogus)


def test_a_placement_that_cannot_be_built_ahead_is_left_to_be_built_and_reported_where_it_is_measured(job):
    op_level, _ = placements_of(job)
    broken = [Partition("onnxruntime", "onnxruntime.region", [0, len(job.graph.graph) - 1], "gap", Cost.unknown())] + [
        p for p in op_level if not set(p.nodes) & {0, len(job.graph.graph) - 1}
    ]
    libraries = job.prebuild([op_level, broken], workers=2)
    assert libraries[0] is not None and libraries[1] is None
    remove_prebuilt(libraries[0])


def test_a_placement_stopped_in_its_untimed_run_keeps_its_library_and_one_that_failed_leaves_nothing(job, monkeypatch):
    """A run stopped at its limit came after the library was written whole: the timing that follows stops it
    again at its own limit, so the library is kept; a build that failed leaves no file behind."""
    from collage_core.measure.worker_client import StageTooSlow

    op_level, mixed = placements_of(job)
    limits = []

    def answered(self, request, run_limit_s):
        limits.append(run_limit_s)
        Path(request["library"]).write_bytes(b"library")
        if request["placed_on"] == ["tvm"]:
            raise StageTooSlow("built", run_limit_s + 30)
        raise CollageError("building or running the placement failed: the build crashed")

    monkeypatch.setattr(Job, "_run_in_worker", answered)  # slotted: patched on the class, for this test only
    libraries = job.prebuild([op_level, mixed], workers=2, run_limit_s=1.5)
    assert libraries[0] is not None and libraries[0].read_bytes() == b"library"
    assert libraries[1] is None and sorted(job.scratch.glob("prebuild-*.so")) == [libraries[0]]
    assert limits == [1.5, 1.5]
    remove_prebuilt(libraries[0])
    assert not list(job.scratch.glob("prebuild-*"))
