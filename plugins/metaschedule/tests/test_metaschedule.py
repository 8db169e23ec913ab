"""tvm-tuned: a matmul+relu partition tuned by MetaSchedule on this CPU into a database of its own, lowered with its
tuned kernel, built and run; partitions without records refused; a corrupt database named in one line.

The plugin is registered by module name (``extra_modules``), as it would be by its entry point once installed.
One tuning (one round of TRIALS trials, which the budget of TUNING_S seconds leaves room for on a loaded 2-core
machine) serves the module's tests.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

from collage_core.kit import tvm_compat
from collage_core.kit.testing import (
    build,
    contribute_patterns,
    discover_backends,
    function_module,
    get_plugin_manager,
    lower_partitions,
    partition_module,
    whole_candidate,
)

PLUGIN = "collage_metaschedule.hooks"
TRIALS = 8
TUNING_S = 60.0
SHAPES = ((64, 128), (128, 96))


def matmul_relu(bb, x, w):
    return bb.emit(relax.op.nn.relu(relax.op.matmul(x, w)))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The plugin manager, the target and the untuned TVM placement of matmul+relu, after tuning it into a fresh
    cache folder; how many kernels were tuned."""
    from collage_metaschedule import tuning

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        patch.setattr(tuning, "TRIALS_PER_ROUND", TRIALS)
        patch.setattr(tuning, "MAX_TRIALS_PER_KERNEL", TRIALS)
        pm = get_plugin_manager(extra_modules=[PLUGIN])
        target = tvm_compat.host_cpu_target()
        backends = {name: info.backend for name, info in discover_backends(pm).items()}
        mod = function_module(matmul_relu, *SHAPES)
        found = whole_candidate(mod, contribute_patterns(pm, backends["tvm"], target), "tvm.matmul_elementwise1")
        placed = partition_module(found.graph, [found.candidate])
        count = pm.hook.collage_tune_partitions(
            backend=backends["tvm-tuned"], mod=placed, function_names=["collage_tvm_0"], target=target, budget_s=TUNING_S
        )
        yield pm, target, backends, count


def backends_now(pm):
    return {name: info.backend for name, info in discover_backends(pm).items()}


def tuned_placement(pm, target, shapes=SHAPES):
    mod = function_module(matmul_relu, *shapes)
    found = whole_candidate(mod, contribute_patterns(pm, backends_now(pm)["tvm-tuned"], target), "tvm-tuned.matmul_elementwise1")
    return found


def test_collage_tune_partitions_tunes_the_kernel_and_changes_the_backends_version(tuned):
    pm, _, before, count = tuned
    assert count == 1
    assert backends_now(pm)["tvm-tuned"].version != before["tvm-tuned"].version


def test_the_tuned_kernel_is_built_into_the_module_and_computes_what_numpy_does(tuned):
    pm, target, _, _ = tuned
    found = tuned_placement(pm, target)
    assert found.candidate is not None
    placed = partition_module(found.graph, [found.candidate])
    executable = build(pm, placed, backends_now(pm), target)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(SHAPES[0], "float32"), rng.standard_normal(SHAPES[1], "float32")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    # float32 sums of 128 products in another order than numpy's: within 1e-4 relative to the largest output.
    np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=0, atol=1e-4 * np.abs(x @ w).max())
    assert "collage_tvm_tuned_0_fused_matmul_relu" in executable.as_text()


def test_the_tuned_kernel_survives_tvms_own_fusion_and_is_not_the_default_one(tuned):
    from collage_tvm import kernels as tvm_kernels

    pm, target, _, _ = tuned
    placed = partition_module(tuned_placement(pm, target).graph, [tuned_placement(pm, target).candidate])
    lowered = lower_partitions(pm, placed, backends_now(pm), target)
    kernel = lowered["collage_tvm_tuned_0_fused_matmul_relu"]
    assert int(kernel.attrs["op_pattern"]) == tvm_kernels.OPAQUE and bool(kernel.attrs[tvm_kernels.SCHEDULED])
    untuned = tvm_kernels.kernels(tvm_kernels.legalized(placed["collage_tvm-tuned_0"], target))[0][1]
    assert not tvm_compat.structural_equal(kernel.without_attr("global_symbol"), untuned)
    with target:
        fused = tvm.transform.Sequential(relax.backend.cpu_generic.legalize_passes(target))(lowered)
    kept = [func for gvar, func in fused.functions_items() if gvar.name_hint == "collage_tvm_tuned_0_fused_matmul_relu"]
    assert kept and tvm_compat.structural_equal(kept[0], kernel)
    assert int(kept[0].attrs["op_pattern"]) == tvm_kernels.OPAQUE


def test_a_partition_without_tuned_records_is_refused_in_one_line(tuned):
    from collage_core.kit import RelaxGraph, enumerate_candidates

    pm, target, _, _ = tuned
    mod = function_module(matmul_relu, (32, 128), (128, 96))
    refusals = []
    patterns = contribute_patterns(pm, backends_now(pm)["tvm-tuned"], target)
    candidates = enumerate_candidates(RelaxGraph.from_function(mod["main"], mod), patterns, refusals)
    assert candidates == []
    reasons = {refusal.reason for refusal in refusals if refusal.pattern == "tvm-tuned.matmul_elementwise1"}
    assert len(reasons) == 1
    (reason,) = reasons
    assert "\n" not in reason and "has no tuned record for this device" in reason and not any(r.broken for r in refusals)


def test_a_corrupt_database_file_is_named_in_one_line_and_nothing_else_is_lost(tuned, caplog):
    from collage_metaschedule import database

    pm, target, _, _ = tuned
    folder = database.folder_for(target)
    records = folder / database.RECORDS
    kept = {path: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    try:
        records.write_bytes(kept[records] + b"not a record\n")
        with pytest.raises(database.TuningDatabaseError) as raised:
            database.open_database(target)
        message = str(raised.value)
        assert "\n" not in message and str(records) in message and "line" in message
        with caplog.at_level(logging.WARNING, logger="collage"):
            assert contribute_patterns(pm, backends_now(pm)["tvm-tuned"], target) == []
        assert any(str(records) in record.getMessage() for record in caplog.records)
        assert all(path.read_bytes() == data for path, data in kept.items() if path != records)
        assert records.read_bytes() == kept[records] + b"not a record\n"  # left for the user to look at
    finally:
        records.write_bytes(kept[records])


def test_a_record_torn_by_a_killed_run_is_cut_off_and_the_rest_kept(tuned):
    from collage_metaschedule import database

    _, target, _, _ = tuned
    records = database.folder_for(target) / database.RECORDS
    whole = records.read_bytes()
    try:
        records.write_bytes(whole + b'[0, [["half a rec')
        with database.tuning_lock(records.parent) as held:  # a tuning run may be writing that line: it is left
            assert held
            with pytest.raises(database.TuningDatabaseError, match="a tuning run is writing it"):
                database.open_database(target)
        assert database.open_database(target) is not None
        assert records.read_bytes() == whole
    finally:
        records.write_bytes(whole)


def test_the_hooks_keep_the_plugin_contract_where_records_exist(tuned):
    from collage_core.kit.testing import contract_problems

    pm, _, _, _ = tuned
    assert contract_problems(pm, "tvm-tuned", function_module(matmul_relu, *SHAPES), timed=False) == []


def test_without_a_database_for_this_device_there_are_no_tuned_patterns(tuned, tmp_path, monkeypatch):
    pm, target, _, _ = tuned
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    assert contribute_patterns(pm, backends_now(pm)["tvm-tuned"], target) == []


def test_the_tuning_target_of_a_gpu_carries_what_metaschedules_cuda_rules_read():
    """TVM's cuda target leaves out the threads and shared memory per block, without which MetaSchedule's CUDA rules
    stop before a schedule is made (seen on an H100); here, without a GPU, every NVIDIA GPU's values stand in. The
    rule that stopped (binding threads) and the check of the GPU code's limits make the design space."""
    from collage_metaschedule import database, tuning

    tuning._import_intrinsics_of(tvm_compat.host_cpu_target())  # MetaSchedule without every kind's intrinsics (30 s)
    from tvm.s_tir import meta_schedule as ms

    target = tvm_compat.make_target({"kind": "cuda", "arch": "sm_90"})
    with target:
        lowered = relax.transform.LegalizeOps()(function_module(matmul_relu, *SHAPES))
    kernel = next(func for _, func in lowered.functions_items() if isinstance(func, tvm.tirx.PrimFunc))

    def design_spaces(tuning_target):
        rules = ms.space_generator.PostOrderApply(
            sch_rules=[ms.schedule_rule.AutoBind()], postprocs=[ms.postproc.VerifyGPUCode()], mutator_probs={}
        )
        return ms.TuneContext(
            mod=database.workload(kernel), target=tuning_target, space_generator=rules, task_name="k", num_threads=1
        ).generate_design_space()

    with pytest.raises(ValueError, match="max_threads_per_block"):
        design_spaces(target)
    spec = tvm_compat.target_to_dict(tuning.tuning_target(target))
    if not tvm.cuda(0).exist:
        assert (spec["max_threads_per_block"], spec["max_shared_memory_per_block"]) == (1024, 48 * 1024)
    assert design_spaces(tuning.tuning_target(target))


def test_repeated_partitions_take_one_place_among_the_kernels_to_tune(tmp_path, monkeypatch):
    """Twelve layers repeat their partitions: the kernels tuned are the first distinct ones, not the first
    partitions' (which here are one kernel three times)."""
    from collage_metaschedule import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "MAX_KERNELS", 2)
    target = tvm_compat.host_cpu_target()

    def relu(bb, x):
        return bb.emit(relax.op.nn.relu(x))

    def sigmoid(bb, x):
        return bb.emit(relax.op.sigmoid(x))

    def exp(bb, x):
        return bb.emit(relax.op.exp(x))

    functions = {f"layer{i}": function_module(relu, (64, 64))["main"] for i in range(3)}
    functions.update(head=function_module(sigmoid, (64, 64))["main"], tail=function_module(exp, (64, 64))["main"])
    mod = tvm.IRModule(functions)
    wanted = tuning.kernels_to_tune(mod, ["layer0", "layer1", "layer2", "head", "tail"], target)
    assert [name.split("/")[0] for name, _ in wanted] == ["layer0", "head"]


def test_partitions_that_differ_only_in_a_constants_value_each_give_their_kernel(tmp_path, monkeypatch):
    """LegalizeOps writes a scalar constant into the kernel: a scale of 0.125 and one of 3.0 are two kernels to tune."""
    from collage_metaschedule import tuning

    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path))

    def scaled(value):
        return lambda bb, x: bb.emit(relax.op.multiply(relax.op.exp(x), relax.const(value, "float32")))

    mod = tvm.IRModule({"p0": function_module(scaled(0.125), (64, 64))["main"], "p1": function_module(scaled(3.0), (64, 64))["main"]})
    wanted = tuning.kernels_to_tune(mod, ["p0", "p1"], tvm_compat.host_cpu_target())
    assert [name.split("/")[0] for name, _ in wanted] == ["p0", "p1"]
