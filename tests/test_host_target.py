"""This CPU as a target: the model LLVM names, without the features a virtual machine hides from it (an AMD EPYC
"znver4" without AVX-512 otherwise builds code that dies of an illegal instruction)."""

from __future__ import annotations

import tvm

from collage_core import tvm_compat


def test_the_features_a_cpu_lacks_are_turned_off_and_none_else():
    # LLVM knows what a Zen 4 has, whatever CPU runs this test
    lacking = tvm_compat.cpu_target_spec("znver4", "x86_64-linux-gnu", {"avx512f": False, "avx512bw": False, "avx2": True})
    assert lacking == {"kind": "llvm", "mcpu": "znver4", "mtriple": "x86_64-linux-gnu", "mattr": ["-avx512bw", "-avx512f"]}
    assert "mattr" not in tvm_compat.cpu_target_spec("znver4", "x86_64-linux-gnu", {"avx512f": True, "avx2": True})
    assert "mattr" not in tvm_compat.cpu_target_spec("znver4", "x86_64-linux-gnu", {})  # nothing read: the model's


def test_this_cpus_target_asks_for_no_feature_this_cpu_lacks():
    target = tvm_compat.host_cpu_target()
    features = dict(tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")())
    used = tvm.target.codegen.llvm_get_cpu_features(target)
    assert not [str(name) for name in used if str(name) in features and not bool(features[str(name)])]
