"""What a plugin's tests and benchmarks import from Collage, besides :mod:`collage_core.kit`.

- the helpers of :mod:`collage_core.testing` (small Relax functions, the candidate a pattern makes of
  them, TVM's own answer, tolerances, ``contract_problems``);
- the fixtures ``pm`` (the plugin manager of the installed plugins) and ``backends`` (their backends by
  name): a plugin's ``tests/conftest.py`` is ``from collage_core.kit.testing import backends, pm``;
- the pipeline, step by step, to place and build a model by hand: the plugin manager and its backends,
  patterns, candidates, partitions, the build, the op-level search, timing;
- for graph-level engines, :mod:`collage_core.kit.testing.operator_cases` (one small function per
  operator, with TVM's build as the reference) and :mod:`collage_core.kit.testing.placement_cases`
  (mixed placements with numpy references).

Names are loaded on first use.
"""

from collage_core.kit import _resolve

_EXPORTS = {
    # pytest's fixtures (pytest is imported only when they are)
    "pm": "collage_core.kit.testing.fixtures:pm",
    "backends": "collage_core.kit.testing.fixtures:backends",
    # collage_core.testing
    "function_module": "collage_core.testing:function_module",
    "whole_candidate": "collage_core.testing:whole_candidate",
    "WholeCandidate": "collage_core.testing:WholeCandidate",
    "run_on_cpu": "collage_core.testing:run_on_cpu",
    "inputs_and_answer": "collage_core.testing:inputs_and_answer",
    "assert_matches": "collage_core.testing:assert_matches",
    "operand_arrays": "collage_core.testing:operand_arrays",
    "rounded_to": "collage_core.testing:rounded_to",
    "sixteen_bit_atol": "collage_core.testing:sixteen_bit_atol",
    "tf32_atol": "collage_core.testing:tf32_atol",
    "EXACT_FLOAT32_ATOL": "collage_core.testing:EXACT_FLOAT32_ATOL",
    "product_case": "collage_core.testing:product_case",
    "widened_residual_case": "collage_core.testing:widened_residual_case",
    "contract_problems": "collage_core.testing:contract_problems",
    "cuda_source": "collage_core.testing:cuda_source",
    # the pipeline by hand
    "get_plugin_manager": "collage_core.plugins:get_plugin_manager",
    "discover_backends": "collage_core.backends:discover_backends",
    "select_backends": "collage_core.backends:select_backends",
    "contribute_patterns": "collage_core.backends:contribute_patterns",
    "partition_module": "collage_core.build.partition:partition_module",
    "partitions_by_backend": "collage_core.build.executable:partitions_by_backend",
    "build": "collage_core.build.executable:build",
    "lower_partitions": "collage_core.build.executable:lower_partitions",
    "search_op_level": "collage_core.search.op_level:search_op_level",
    "OpGroup": "collage_core.search.regions:OpGroup",
    "decode": "collage_core.search.regions:decode",
    "MeasureSettings": "collage_core.measure.timing:MeasureSettings",
    "time_callable": "collage_core.measure.timing:time_callable",
    "TwoLevelSettings": "collage_core.search.two_level:TwoLevelSettings",
    "format_table": "collage_core.outputs.report:format_table",
    "original_model": "collage_core.model.original_model",
    # precision: the dtypes of each option, tolerances, and the module (to patch what the CPU offers)
    "DTYPES": "collage_core.model.precision:DTYPES",
    "tolerance": "collage_core.model.precision:tolerance",
    "precision": "collage_core.model.precision",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    value = _resolve(_EXPORTS, name, __name__)
    globals()[name] = value
    return value


def __dir__():
    return __all__
