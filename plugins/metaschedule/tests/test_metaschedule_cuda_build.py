"""tvm-tuned on CUDA, on a machine without a GPU: a CUDA record of a softmax partition's kernel is applied by the
lowering and the placement builds for CUDA with that kernel in its CUDA code.

No GPU is here to measure schedules, so the record is the first of MetaSchedule's own CUDA design spaces for the
kernel, written into the device's database with a made-up time (the only thing not real in this test). Tuning on a
GPU writes records the same way (``tuning.py``); this test says the CUDA side of the lowering and the build works
before one is there. The tuning itself on a GPU is not tested here.
"""

from __future__ import annotations

import pytest
from tvm import relax

from collage_core.kit import tvm_compat
from collage_core.kit.testing import (
    build,
    contribute_patterns,
    cuda_source,
    discover_backends,
    function_module,
    get_plugin_manager,
    partition_module,
    whole_candidate,
)

PLUGIN = "collage_metaschedule.hooks"
SHAPE = (4, 12, 32, 128)


def softmax_scaled(bb, x):
    return bb.emit(relax.op.multiply(relax.op.nn.softmax(x, axis=-1), relax.const(2.0, "float32")))


def cuda_target():
    return tvm_compat.make_target({"kind": "cuda", "arch": "sm_90a"})


def write_design_space_record(kernel, target) -> None:
    """The first of MetaSchedule's CUDA design spaces for ``kernel``, in ``target``'s database, as if it had run in 10 us."""
    from collage_metaschedule import database, tuning

    tuning._import_intrinsics_of(tuning.tuning_target(target))
    from tvm.s_tir import meta_schedule as ms

    workload = database.workload(kernel)
    spaces = ms.TuneContext(
        mod=workload, target=tuning.tuning_target(target), space_generator="post-order-apply", task_name="k", num_threads=1
    ).generate_design_space()
    folder = database.prepare_folder(target)
    db = ms.database.JSONDatabase(path_workload=str(folder / database.WORKLOADS), path_tuning_record=str(folder / database.RECORDS))
    entry = db.commit_workload(workload)
    trace = spaces[0].trace.simplified(remove_postproc=False)
    db.commit_tuning_record(
        ms.database.TuningRecord(trace, entry, [1e-5], tuning.tuning_target(target), ms.arg_info.ArgInfo.from_prim_func(kernel))
    )


@pytest.fixture
def placed_with_a_cuda_record(tmp_path, monkeypatch):
    from collage_tvm import kernels as tvm_kernels

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    pm = get_plugin_manager(extra_modules=[PLUGIN])
    target = cuda_target()
    mod = function_module(softmax_scaled, SHAPE)
    assert contribute_patterns(pm, {n: i.backend for n, i in discover_backends(pm).items()}["tvm-tuned"], target) == []
    untuned = whole_candidate(mod, contribute_patterns(pm, discover_backends(pm)["tvm"].backend, target), "tvm.softmax_elementwise1")
    partition = partition_module(untuned.graph, [untuned.candidate])
    ((_, kernel),) = tvm_kernels.kernels(tvm_kernels.legalized(partition["collage_tvm_0"], target))
    write_design_space_record(kernel, target)
    backends = {name: info.backend for name, info in discover_backends(pm).items()}
    found = whole_candidate(mod, contribute_patterns(pm, backends["tvm-tuned"], target), "tvm-tuned.softmax_elementwise1")
    assert found.candidate is not None  # the record makes the partition a tvm-tuned candidate
    return pm, backends, target, partition_module(found.graph, [found.candidate])


def test_a_cuda_record_is_built_into_the_placements_cuda_code(placed_with_a_cuda_record):
    pm, backends, target, placed = placed_with_a_cuda_record
    executable = build(pm, placed, backends, target)
    sources = cuda_source(executable.mod)
    # The tuned kernel keeps the name the lowering gave it; dlight's own schedule of the partition would not have it.
    assert "collage_tvm_tuned_0_fused_softmax_multiply" in sources
    assert "__global__" in sources and "threadIdx" in sources
