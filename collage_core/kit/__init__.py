"""The plugin API: all a backend plugin imports from Collage besides ``collage_core`` itself.

Everything here but the declarations of :mod:`collage_core.kit.declare` (``hookimpl_for``, ``backend_hooks``,
``reason_raised_by``, ``native_kernel_hooks``, ``engine_hooks``) is defined elsewhere in the core and re-exported, so a plugin's imports do
not follow the core's modules as they move. ``tests/test_plugin_api.py`` fails when a file under
``plugins/`` imports any other module of the core; docs/plugins.md ("The kit") lists every name.
A plugin's tests and benchmarks import their helpers from :mod:`collage_core.kit.testing`.

Names are loaded on first use, as ``collage_core``'s are: a plugin that imports only the records
and ``hookimpl_for`` at load does not pay for the ONNX converter or the native build.
"""

import importlib

# name -> "module" (the module itself) or "module:attribute"
_EXPORTS = {
    # hooks
    "hookimpl": "collage_core.hookspecs:hookimpl",
    "hookimpl_for": "collage_core.kit.declare:hookimpl_for",
    "backend_hooks": "collage_core.kit.declare:backend_hooks",
    "reason_raised_by": "collage_core.kit.declare:reason_raised_by",
    "native_kernel_hooks": "collage_core.kit.declare:native_kernel_hooks",
    "engine_hooks": "collage_core.kit.declare:engine_hooks",
    # records
    "Availability": "collage_core.records:Availability",
    "Backend": "collage_core.records:Backend",
    "Candidate": "collage_core.records:Candidate",
    "Cost": "collage_core.records:Cost",
    "GRAPH_LEVEL": "collage_core.records:GRAPH_LEVEL",
    "OP_LEVEL": "collage_core.records:OP_LEVEL",
    "Partition": "collage_core.records:Partition",
    "Pattern": "collage_core.records:Pattern",
    "PatternMatch": "collage_core.records:PatternMatch",
    "PatternRefused": "collage_core.records:PatternRefused",
    # reading Relax IR across TVM versions
    "tvm_compat": "collage_core.tvm_compat",
    # precision
    "FP32": "collage_core.model.dtypes:FP32",
    "TF32": "collage_core.model.dtypes:TF32",
    "TF32_PATTERN_SUFFIX": "collage_core.model.dtypes:TF32_PATTERN_SUFFIX",
    "computes_tf32": "collage_core.model.dtypes:computes_tf32",
    "has_fast_bf16": "collage_core.model.precision:has_fast_bf16",
    "at_precision": "collage_core.model.precision:at_precision",
    # reading a model the way the core does (a plugin that prepares kernels ahead, as CUTLASS's prebuild)
    "load_model": "collage_core.model.model_import:load_model",
    "RelaxGraph": "collage_core.model.relax_graph:RelaxGraph",
    "substitute": "collage_core.model.relax_graph:substitute",
    "enumerate_candidates": "collage_core.candidates.enumeration:enumerate_candidates",
    # lowering partitions
    "replace_functions": "collage_core.build.executable:replace_functions",
    "packed_call_function": "collage_core.build.executable:packed_call_function",
    "pattern_of": "collage_core.build.partition:pattern_of",
    # float32 products as six bfloat16 ones on the tensor cores
    "bf16_split": "collage_core.build.bf16_split",
    "BF16X6_PATTERN_SUFFIX": "collage_core.build.bf16_split:BF16X6_PATTERN_SUFFIX",
    "computes_bf16x6": "collage_core.build.bf16_split:computes_bf16x6",
    # fused groups: an anchor and its epilogue, one view of a match and of a partition
    "fused_groups": "collage_core.candidates.fused_groups",
    "Group": "collage_core.candidates.fused_groups:Group",
    "Refused": "collage_core.candidates.fused_groups:Refused",
    "recognizer_check": "collage_core.candidates.fused_groups:recognizer_check",
    "read_epilogue": "collage_core.candidates.fused_groups:read_epilogue",
    "StridedOperand": "collage_core.candidates.fused_groups:StridedOperand",
    "strided_operand": "collage_core.candidates.fused_groups:strided_operand",
    "viewed_operand": "collage_core.candidates.fused_groups:viewed_operand",
    "written_view": "collage_core.candidates.fused_groups:written_view",
    "ACTIVATIONS": "collage_core.candidates.fused_groups:ACTIVATIONS",
    "FLOAT32": "collage_core.candidates.fused_groups:FLOAT32",
    "activation_pattern": "collage_core.candidates.fused_groups:activation_pattern",
    "bias_pattern": "collage_core.candidates.fused_groups:bias_pattern",
    "cast_pattern": "collage_core.candidates.fused_groups:cast_pattern",
    "residual_pattern": "collage_core.candidates.fused_groups:residual_pattern",
    "scale_pattern": "collage_core.candidates.fused_groups:scale_pattern",
    "product_epilogues": "collage_core.candidates.fused_groups:product_epilogues",
    "as_dtype": "collage_core.candidates.fused_groups:as_dtype",
    "expect_dtype": "collage_core.candidates.fused_groups:expect_dtype",
    "expect_float32": "collage_core.candidates.fused_groups:expect_float32",
    "expect_plain_out_dtype": "collage_core.candidates.fused_groups:expect_plain_out_dtype",
    "uniform_operand_dtype": "collage_core.candidates.fused_groups:uniform_operand_dtype",
    "external": "collage_core.candidates.fused_groups:external",
    "ints": "collage_core.candidates.fused_groups:ints",
    "padding4": "collage_core.candidates.fused_groups:padding4",
    "plain_strides": "collage_core.candidates.fused_groups:plain_strides",
    "shape_of": "collage_core.candidates.fused_groups:shape_of",
    # strided products: batches merged into M or into one strided batch
    "strided_products": "collage_core.candidates.strided_products",
    "Axis": "collage_core.candidates.strided_products:Axis",
    "batch_loops": "collage_core.candidates.strided_products:batch_loops",
    # native kernels: build and cache, spec words, what the build chose by timing
    "NativeLibrary": "collage_core.build.native:NativeLibrary",
    "NativeBuildError": "collage_core.build.native:NativeBuildError",
    "cache_root": "collage_core.build.native:cache_root",
    "find_compiler": "collage_core.build.native:find_compiler",
    "sources_digest": "collage_core.build.native:sources_digest",
    "float_word": "collage_core.build.native:float_word",
    "spec_text": "collage_core.build.native:spec_text",
    "KERNEL_CACHE_HEADER": "collage_core.build.native:KERNEL_CACHE_HEADER",
    "ChoiceStore": "collage_core.build.choices:ChoiceStore",
    "ProgressBar": "collage_core.measure.progress:ProgressBar",
    # CUDA libraries
    "cuda_libraries": "collage_core.build.cuda_libraries",
    "CudaUnavailable": "collage_core.build.cuda_libraries:CudaUnavailable",
    "Requirement": "collage_core.build.cuda_libraries:Requirement",
    # threads
    "backend_threads": "collage_core.measure.threads:backend_threads",
    "WAIT_SETTINGS": "collage_core.measure.threads:WAIT_SETTINGS",
    # graph-level engines: the shared operator set, its patterns and lowering, and Relax to ONNX
    "relax_to_onnx": "collage_core.relax_onnx.converter",
    "engine_operators": "collage_core.relax_onnx.support",
    "engine_patterns": "collage_core.relax_onnx.patterns",
    "engine_lowering": "collage_core.relax_onnx.lowering",
    "engine_caches": "collage_core.relax_onnx.runtime_caches",
}

__all__ = sorted(_EXPORTS)


def _resolve(exports: dict, name: str, owner: str):
    """The object ``exports[name]`` names, imported on first use."""
    if name not in exports:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    module_name, _, attribute = exports[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def __getattr__(name):
    value = _resolve(_EXPORTS, name, __name__)
    globals()[name] = value
    return value


def __dir__():
    return __all__
