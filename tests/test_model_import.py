"""Importing models: the shipped ONNX files, PyTorch and Relax, what is refused and why, and the import's numerics."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import onnx
import pytest
import torch
import torch.utils._pytree as pytree
import tvm
from onnx import TensorProto, helper
from transformers.utils import ModelOutput
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

import collage_core
from collage_core import tvm_compat
from collage_core.model.model_import import (
    ImportNumericsError,
    ModelImportError,
    TensorSpec,
    UncheckableModel,
    as_tensor,
    check_against_reference,
    load_model,
)
from collage_core.model.verify import compare_outputs

MODELS = Path(__file__).parent.parent / "models"
TINY_RESNET = MODELS / "tiny_resnet.onnx"
TINY_BERT = MODELS / "tiny_bert.onnx"
OPSET = 17
# An ONNX operator that is in the standard opset but that TVM's Relax frontend cannot convert.
UNSUPPORTED_ONNX_OP = "Det"
# float32 kernels of TVM and of ONNX Runtime or PyTorch differ in summation order only: errors near 1e-7 of the
# output scale.
RTOL, ATOL = 1e-4, 1e-5


def assert_canonical(imported) -> None:
    """One dataflow block in ``main``, and every input a tensor of static shape matching the specs."""
    body = imported.mod["main"].body
    blocks = [block for block in body.blocks if block.bindings]
    assert len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock)
    params = imported.mod["main"].params
    assert [tvm_compat.tensor_shape_dtype(param) for param in params] == [(s.shape, s.dtype) for s in imported.inputs]
    assert all(all(isinstance(dim, int) and dim > 0 for dim in spec.shape) for spec in imported.inputs)


def run_relax(executable, target, arrays) -> list[np.ndarray]:
    device = tvm_compat.device_for(target)
    result = relax.VirtualMachine(executable, device)["main"](*[tvm_compat.to_tensor(a, device) for a in arrays])
    return [tvm_compat.to_numpy(value) for value in ([result] if hasattr(result, "numpy") else result)]


def onnx_model(node, inputs, outputs, name: str = "test") -> onnx.ModelProto:
    graph = helper.make_graph([node], name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def tiny_resnet():
    return load_model(TINY_RESNET)


def test_tiny_resnet_imports_and_its_reference_runs(tiny_resnet):
    assert tiny_resnet.source == "onnx" and tiny_resnet.name == "tiny_resnet"
    assert tiny_resnet.inputs == (TensorSpec("input", (1, 3, 32, 32), "float32"),)
    assert_canonical(tiny_resnet)
    assert tiny_resnet.reference_name.startswith("onnxruntime")
    (logits,) = tiny_resnet.reference(tiny_resnet.random_inputs())
    assert logits.shape == (1, 10) and np.all(np.isfinite(logits))


def test_tiny_bert_imports_and_its_reference_runs():
    imported = load_model(TINY_BERT)
    assert imported.inputs == (TensorSpec("input_ids", (1, 16), "int64"),)
    assert_canonical(imported)
    (hidden,) = imported.reference(imported.random_inputs())
    assert hidden.shape == (1, 16, 64) and np.all(np.isfinite(hidden))


def test_imported_tiny_resnet_built_by_tvm_matches_onnx_runtime(tiny_resnet):
    """The import itself (frontend, batch-norm decomposition, constant folding) keeps the numerics."""
    target = tvm_compat.host_cpu_target()
    executable = relax.build(tiny_resnet.mod, target)
    inputs = tiny_resnet.random_inputs(seed=1)
    outputs = run_relax(executable, target, inputs)
    verification = compare_outputs(outputs, tiny_resnet.reference(inputs), tiny_resnet.reference_name, RTOL, ATOL)
    assert verification.passed, verification.describe()


def test_truncated_onnx_file_is_refused_naming_the_file(tmp_path):
    truncated = tmp_path / "truncated.onnx"
    data = TINY_RESNET.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelImportError, match="truncated.onnx: not a valid ONNX model"):
        load_model(truncated)


def test_random_bytes_are_refused_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ModelImportError, match="garbage.onnx: not a valid ONNX model"):
        load_model(garbage)


def test_missing_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ModelImportError, match="absent.onnx: no such file"):
        load_model(tmp_path / "absent.onnx")


def test_dynamic_input_dimension_is_refused_naming_the_input():
    model = onnx_model(
        helper.make_node("Relu", ["features"], ["activated"]),
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("activated", TensorProto.FLOAT, ["batch", 4])],
    )
    with pytest.raises(ModelImportError, match=r"input 'features' has a dynamic shape \['batch', 4\]"):
        load_model(model)


def test_operator_the_frontend_lacks_is_refused_naming_it(tmp_path):
    assert UNSUPPORTED_ONNX_OP not in onnx_frontend._get_convert_map()
    path = tmp_path / "determinant.onnx"
    onnx.save(
        onnx_model(
            helper.make_node(UNSUPPORTED_ONNX_OP, ["matrix"], ["determinant"]),
            [helper.make_tensor_value_info("matrix", TensorProto.FLOAT, [3, 3])],
            [helper.make_tensor_value_info("determinant", TensorProto.FLOAT, [])],
        ),
        path,
    )
    expected = rf"determinant.onnx: unsupported ONNX operator\(s\): {UNSUPPORTED_ONNX_OP}"
    with pytest.raises(ModelImportError, match=expected):
        load_model(path)


class ConvReluLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.linear = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.linear(torch.flatten(torch.relu(self.conv(x)), 1))


def test_torch_module_with_example_inputs_imports_with_pytorch_as_reference():
    torch.manual_seed(0)
    module = ConvReluLinear()
    imported = load_model(module, example_inputs=(torch.randn(1, 3, 8, 8),))
    assert imported.source == "torch" and imported.name == "ConvReluLinear"
    assert imported.reference_name.startswith("pytorch")
    assert imported.inputs == (TensorSpec("x", (1, 3, 8, 8), "float32"),)  # forward(self, x)
    assert_canonical(imported)
    inputs = imported.random_inputs()
    with torch.no_grad():
        expected = module(torch.from_numpy(inputs[0])).numpy()
    (output,) = imported.reference(inputs)
    np.testing.assert_array_equal(output, expected)


def test_torch_module_without_example_inputs_is_refused():
    with pytest.raises(ModelImportError, match="needs example_inputs"):
        load_model(ConvReluLinear())


def test_a_torch_modules_inputs_are_named_after_forwards_parameters_in_the_model_and_its_library():
    """model.inputs, the Relax function's parameters (and so a tar's executor configuration) and the run's errors
    all say ``ids`` and ``scale``, as forward does."""

    class Scaled(torch.nn.Module):
        def forward(self, ids, scale):
            return ids.float() * scale

    imported = load_model(Scaled(), example_inputs=(torch.ones(1, 4, dtype=torch.int64), torch.ones(1, 4)))
    assert [spec.name for spec in imported.inputs] == ["ids", "scale"]
    assert [param.name for param in imported.mod["main"].params] == ["ids", "scale"]

    class Starred(torch.nn.Module):
        def forward(self, *args):
            return args[0] + args[1]

    imported = load_model(Starred(), example_inputs=(torch.ones(2), torch.ones(2)))
    assert [spec.name for spec in imported.inputs] == ["input0", "input1"]
    traced = torch.jit.trace(Scaled(), (torch.ones(1, 4, dtype=torch.int64), torch.ones(1, 4)))  # no signature to read
    imported = load_model(traced, example_inputs=(torch.ones(1, 4, dtype=torch.int64), torch.ones(1, 4)))
    assert [spec.name for spec in imported.inputs] == ["input0", "input1"]


def test_nested_or_other_example_inputs_are_refused_in_one_line_naming_the_item():
    """torch.export takes a tuple inside the tuple; the checks, the reference and the library take tensors one by one."""
    from collage_core.api_checks import ArgumentError

    x = torch.randn(1, 3, 8, 8)
    shape = "Tensor of shape \\(1, 3, 8, 8\\) \\(torch.float32\\)"
    cases = [
        ((x, (x, x)), f"item 1 is tuple of 2 items \\({shape}, {shape}\\) \\(a forward"),  # the items' shapes, on one line
        ((x, [x] * 4), f"item 1 is list of 4 items \\({shape}, {shape}, {shape}, ...\\) "),
        ((x, {"y": x}), "item 1 is dict"),
        ((3,), "item 0 is 3"),
        ((x.numpy(),), "item 0 is ndarray of shape \\(1, 3, 8, 8\\) \\(float32\\)"),
    ]
    for inputs, shown in cases:
        with pytest.raises(
            ArgumentError, match=f"example_inputs must be a tuple of tensors, one per argument of forward: {shown}"
        ) as raised:
            collage_core.optimize(ConvReluLinear(), example_inputs=inputs, backends=["tvm"])
        assert "\n" not in str(raised.value)
    with pytest.raises(
        ArgumentError, match=r"example_inputs must be a tuple of tensors, not Tensor of shape \(1, 3, 8, 8\) \(torch.float32\)$"
    ):
        collage_core.optimize(ConvReluLinear(), example_inputs=x, backends=["tvm"])  # a tensor's numbers are not shown


def test_relax_module_imports_into_one_dataflow_block():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        hidden = bb.emit(relax.op.nn.relu(x))
        bb.emit_func_output(bb.emit(relax.op.add(hidden, x)))
    imported = load_model(bb.get(), name="relu_add")
    assert imported.source == "relax" and imported.name == "relu_add"
    assert imported.reference is None
    assert imported.inputs == (TensorSpec("x", (2, 8), "float32"),)
    assert_canonical(imported)


def clip_model(low, high) -> onnx.ModelProto:
    """Clip(x, low, high) with the bounds as initializers (how exporters write ReLU6); None: bound left out."""
    names = ["x", "low" if low is not None else "", "high" if high is not None else ""]
    graph = helper.make_graph(
        [helper.make_node("Clip", names, ["y"])],
        "clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor(name, TensorProto.FLOAT, [], [value]) for name, value in (("low", low), ("high", high)) if value is not None],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


@pytest.mark.parametrize("low, high", [(0.0, 6.0), (None, 0.5), (-0.25, None), (0.5, -0.5)])
def test_clip_with_constant_bounds_matches_onnx_runtime(low, high):
    """Constant bounds become ``R.clip`` (which backends can take); low above high keeps ONNX's answer (high)."""
    imported = load_model(clip_model(low, high))
    operators = {call.op.name for call in _calls(imported.mod["main"])}
    assert ("relax.clip" in operators) == (low is None or high is None or low <= high), operators
    inputs = [np.linspace(-8, 8, 16, dtype="float32").reshape(2, 8)]
    target = tvm_compat.host_cpu_target()
    outputs = run_relax(relax.build(imported.mod, target), target, inputs)
    verification = compare_outputs(outputs, imported.reference(inputs), imported.reference_name, RTOL, ATOL)
    assert verification.passed, verification.describe()


def _calls(func):
    found = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None
    )
    return found


@pytest.mark.parametrize("shape", [[], [4], [2, 4]])
def test_constant_of_constant_shape_imports_including_a_scalar_shape(shape):
    """GPT-2's causal mask starts from ConstantOfShape of an empty shape: a scalar."""
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["filled"], value=helper.make_tensor("value", TensorProto.FLOAT, [1], [2.5])),
            helper.make_node("Add", ["x", "filled"], ["y"]),
        ],
        "constant_of_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor("shape", TensorProto.INT64, [len(shape)], shape)],
    )
    imported = load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]))
    inputs = [np.arange(8, dtype="float32").reshape(2, 4)]
    target = tvm_compat.host_cpu_target()
    outputs = run_relax(relax.build(imported.mod, target), target, inputs)
    verification = compare_outputs(outputs, imported.reference(inputs), imported.reference_name, RTOL, ATOL)
    assert verification.passed, verification.describe()


def _shape_arithmetic_model() -> onnx.ModelProto:
    """``x + range(x.shape[0])`` reshaped to ``(x.shape[0], -1)``: shapes computed at run time
    (Shape -> Gather -> Range, Concat -> Reshape) although the input's shape is static, as exporters write."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
        helper.make_node("Range", ["zero", "rows", "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["offsets"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["offsets", "inner_axes"], ["column"]),
        helper.make_node("Add", ["x", "column"], ["shifted"]),
        helper.make_node("Unsqueeze", ["rows", "first_axis"], ["rows_1d"]),
        helper.make_node("Concat", ["rows_1d", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["shifted", "target"], ["out"]),
    ]
    constants = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("inner_axes", TensorProto.INT64, [2], [1, 2]),
        helper.make_tensor("first_axis", TensorProto.INT64, [1], [0]),
        helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "shape_arithmetic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 12])],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def test_shape_arithmetic_is_folded_before_tvm_imports_and_the_original_stays_the_reference(tmp_path):
    model = _shape_arithmetic_model()
    with pytest.raises(tvm_compat.OnnxNodeFailure, match="Reshape node 'out'.*known shape"):
        tvm_compat.from_onnx(model)  # what TVM's importer says without the folding
    path = tmp_path / "shape_arithmetic.onnx"
    onnx.save(model, path)
    imported = load_model(str(path))
    assert_canonical(imported)
    # the fingerprint (part of end-to-end cost keys) names the folding: the graph TVM got is not the file's
    assert imported.fingerprint == load_model(str(path)).fingerprint != hashlib.sha256(path.read_bytes()).hexdigest()
    inputs = imported.random_inputs(seed=2)
    executable = tvm.compile(imported.mod, target=tvm_compat.host_cpu_target())
    outputs = run_relax(executable, tvm_compat.host_cpu_target(), inputs)
    expected = (inputs[0] + np.arange(2, dtype=np.float32)[:, None, None]).reshape(2, 12)
    np.testing.assert_allclose(imported.reference(inputs)[0], expected, rtol=1e-6)  # ONNX Runtime on the original file
    verification = compare_outputs(outputs, [expected], "numpy", RTOL, ATOL)
    assert verification.passed, verification.describe()


def test_a_node_tvm_cannot_convert_is_named_with_its_operator_and_what_to_try(tmp_path):
    """Pads given at run time (an input) are beyond TVM's importer, folded or not."""
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["padded"], name="pad_by_input"), helper.make_node("Relu", ["padded"], ["out"])],
        "dynamic_pads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]), helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 6])],
    )
    path = tmp_path / "dynamic_pads.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), path)
    with pytest.raises(ModelImportError) as raised:
        load_model(str(path))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: TVM's ONNX importer cannot convert Pad node 'pad_by_input' (")
    assert "torch.export" in message


class BranchOnData(torch.nn.Module):
    """A branch on the input's values: torch.export refuses it, the TorchScript ONNX exporter traces one branch."""

    def forward(self, x):
        if x.sum() > 0:
            return torch.relu(x) * 2.0
        return x - 1.0


def test_a_module_torch_export_refuses_says_the_onnx_route_takes_it():
    with pytest.raises(ModelImportError) as raised:
        load_model(BranchOnData(), example_inputs=(torch.ones(2, 3),))
    message = str(raised.value)
    assert "\n" not in message and message.startswith("PyTorch module BranchOnData: export or import failed: ")
    assert message.endswith(
        "the ONNX route takes it: export it with torch.onnx.export(module, inputs, path, "
        "opset_version=17, dynamo=False) and optimize the file (a trace: branches on input values "
        "follow the example inputs)"
    )


class CacheThatStartsEmpty(torch.nn.Module):
    """Concatenates a 4-D tensor to an empty 1-D one, as transformers' key/value cache does on its first call."""

    def forward(self, x):
        cache = torch.zeros(0, dtype=x.dtype)
        return torch.cat([cache, x], dim=-2) * 2.0


def test_torch_cat_skips_empty_one_dimensional_inputs_as_pytorch_does():
    module = CacheThatStartsEmpty()
    imported = load_model(module, example_inputs=(torch.randn(1, 2, 3, 4),))
    inputs = imported.random_inputs(seed=4)
    target = tvm_compat.host_cpu_target()
    (output,) = run_relax(tvm.compile(imported.mod, target=target), target, inputs)
    np.testing.assert_array_equal(output, imported.reference(inputs)[0])


def test_a_torch_node_tvm_cannot_convert_is_named_with_its_source_line(monkeypatch):
    from tvm.relax.frontend.torch import exported_program_translator as translator

    original = translator.ExportedProgramImporter.create_convert_map

    def without_working_relu(importer, *args, **kwargs):  # stands in for a converter TVM gets wrong
        converters = original(importer, *args, **kwargs)

        def refuse(node, *rest):
            raise ValueError("relu is not supported here")

        return {**converters, "relu.default": refuse}

    monkeypatch.setattr(translator.ExportedProgramImporter, "create_convert_map", without_working_relu)
    with pytest.raises(ModelImportError) as raised:
        load_model(ConvReluLinear(), example_inputs=(torch.randn(1, 3, 8, 8),))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("PyTorch module ConvReluLinear: TVM's importer cannot convert relu.default node 'relu' (made by ")
    assert "ValueError: relu is not supported here; the ONNX route " in message


# What PyTorch modules return, flattened (collage_core.model.torch_outputs). Each output has a shape of its own, so
# that the order of the imported outputs shows in their shapes.
@dataclasses.dataclass
class Pair:
    second: torch.Tensor
    absent: Optional[torch.Tensor]
    first: torch.Tensor


@dataclasses.dataclass
class RegisteredPair:  # Pair's twin, registered with torch.export: the order torch.export gives a dataclass
    second: torch.Tensor
    absent: Optional[torch.Tensor]
    first: torch.Tensor


torch.export.register_dataclass(RegisteredPair)


@dataclasses.dataclass
class Classified(ModelOutput):
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None


class Returning(torch.nn.Module):
    """Returns ``make(pieces)``, where ``pieces[i]`` is computed from ``x``'s first ``i + 1`` rows: its shape says which it is."""

    def __init__(self, make):
        super().__init__()
        self.make = make
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.make([torch.tanh(self.linear(x[: i + 1])) * (i + 1) for i in range(5)])


# What the module returns, from its pieces (``p``); where each output is, in order; which piece each is.
RETURNED = {
    "tensor": (lambda p: p[2], ["output"], [2]),
    "tuple": (lambda p: (p[0], p[1]), ["output[0]", "output[1]"], [0, 1]),
    "list": (lambda p: [p[1], None, p[0]], ["output[0]", "output[2]"], [1, 0]),
    "nested dict": (
        lambda p: {"z": p[0], "a": [p[1], {"y": p[2], "b": (p[3], None)}], "none": None},
        ["output['z']", "output['a'][0]", "output['a'][1]['y']", "output['a'][1]['b'][0]"],
        [0, 1, 2, 3],
    ),
    "dataclass": (lambda p: Pair(p[1], None, p[0]), ["output.second", "output.first"], [1, 0]),
    "ModelOutput": (
        lambda p: Classified(logits=p[4], hidden_states=(p[1], p[2])),
        ["output['logits']", "output['hidden_states'][0]", "output['hidden_states'][1]"],
        [4, 1, 2],
    ),
    "nested": (
        lambda p: (Classified(logits=p[3]), {"pair": Pair(p[2], None, p[1])}, [p[0]]),
        ["output[0]['logits']", "output[1]['pair'].second", "output[1]['pair'].first", "output[2][0]"],
        [3, 2, 1, 0],
    ),
}


def exported_order(module, example) -> list[tuple[int, ...]]:
    """The shapes of the outputs torch.export alone makes of ``module``'s, in its order (each Pair returned as
    its registered twin, as torch.export needs)."""

    class Exportable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = module

        def forward(self, x):
            return pytree.tree_map(
                lambda leaf: RegisteredPair(leaf.second, leaf.absent, leaf.first) if isinstance(leaf, Pair) else leaf, self.module(x)
            )

    program = torch.export.export(Exportable(), (example,))
    (outputs,) = [node.args[0] for node in program.graph.nodes if node.op == "output"]
    return [tuple(node.meta["val"].shape) for node in outputs if node is not None]


def declared_shapes(imported) -> list[tuple[int, ...]]:
    declared = tvm_compat.return_type(imported.mod["main"])
    return [tvm_compat.type_shape_dtype(ty)[0] for ty in (declared.fields if isinstance(declared, relax.TupleType) else [declared])]


@pytest.mark.parametrize("returned", list(RETURNED))
def test_outputs_are_the_returned_tensors_in_torch_exports_order_and_match_pytorch(returned):
    make, names, pieces = RETURNED[returned]
    torch.manual_seed(0)
    module, example = Returning(make), torch.randn(5, 4)
    in_order = [(piece + 1, 4) for piece in pieces]
    assert exported_order(module, example) == in_order
    imported = load_model(module, example_inputs=(example,))
    assert imported.output_names == tuple(names)
    assert declared_shapes(imported) == in_order
    inputs = imported.random_inputs(seed=5)
    expected = imported.reference(inputs)
    assert [array.shape for array in expected] == in_order
    target = tvm_compat.host_cpu_target()
    outputs = run_relax(relax.build(imported.mod, target), target, inputs)
    verification = compare_outputs(outputs, expected, imported.reference_name, RTOL, ATOL)
    assert verification.passed, verification.describe()
    assert "numerics passed" in check_against_reference(imported)


class CountsToo(torch.nn.Module):
    def forward(self, x):
        return x * 2.0, {"count": 3}


def test_an_output_that_is_not_a_tensor_is_refused_naming_where_it_is():
    with pytest.raises(UncheckableModel) as raised:
        load_model(CountsToo(), example_inputs=(torch.ones(2, 3),))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "PyTorch module CountsToo: Collage cannot check its outputs: output[1]['count'] is not a "
        "tensor (type int); a module's outputs must be tensors, or tuples, lists, "
    )


class ExportedDifferently(torch.nn.Module):
    """What torch.export sees is not what runs: ``exported`` and ``run`` make the outputs of each."""

    def __init__(self, exported, run):
        super().__init__()
        self.exported, self.run = exported, run

    def forward(self, x):
        return self.exported(x) if torch.compiler.is_exporting() else self.run(x)


def _refuse(x):
    raise ValueError("inputs of this kind are refused")


@pytest.mark.parametrize(
    "exported, run, error, message",
    [
        (lambda x: x + 1, lambda x: (x + 1, x * 2), UncheckableModel, "pytorch .* gives 2 outputs, the imported model 1$"),
        (
            lambda x: {"a": x[:1], "b": x},
            lambda x: {"a": x, "b": x},
            UncheckableModel,
            r"output 0 \(output\['a'\]\) is float32\[1, 3\] in the imported model, float32\[2, 3\] from pytorch",
        ),
        (
            lambda x: x + 1,
            lambda x: (x + 1).double(),
            UncheckableModel,
            r"output 0 \(output\) is float32\[2, 3\] in the imported "
            r"model, float64\[2, 3\] from pytorch",
        ),
        (
            lambda x: x + 1,
            _refuse,
            UncheckableModel,
            r"its reference \(pytorch .*\) fails on inputs of the model's shapes: "
            r"ValueError: inputs of this kind are refused$",
        ),
        (lambda x: x + 1, lambda x: x + torch.rand_like(x), UncheckableModel, "gives other outputs each time on the same inputs"),
        (
            lambda x: (x * 2, x + 1),
            lambda x: (x * 2, x + 2),
            ImportNumericsError,
            r"TVM's plain build of the imported model disagrees with pytorch .* at output 1 \(output\[1\]\) \(max abs error 1,",
        ),
    ],
    ids=["count", "shape", "dtype", "reference fails", "reference varies", "numerics"],
)
def test_a_model_collage_cannot_check_fails_before_anything_is_measured(monkeypatch, tmp_path, exported, run, error, message):
    from collage_core.search import stage as search_stage

    def measure(*args, **kwargs):
        raise AssertionError("candidates were measured")

    monkeypatch.setattr(search_stage, "measure", measure)
    with pytest.raises(error, match=f"^PyTorch module ExportedDifferently: .*{message}") as raised:
        collage_core.optimize(
            ExportedDifferently(exported, run),
            example_inputs=(torch.ones(2, 3),),
            backends=["tvm"],
            output_dir=tmp_path,
            cost_db=tmp_path / "costs.sqlite",
            show_progress=False,
        )
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "costs.sqlite").exists()


def test_the_check_before_measuring_runs_an_onnx_model_too(tiny_resnet):
    assert check_against_reference(tiny_resnet).startswith("ONNX model tiny_resnet: its output agrees with onnxruntime")


def test_a_model_too_large_to_run_unscheduled_is_checked_in_shapes_only_before_measuring(monkeypatch):
    """ConvReluLinear: a 3x3 convolution from 3 to 4 channels at 8x8 (256 x 27 multiply-adds) and 256 to 5 (5 x 256)."""
    from collage_core.model import model_import

    imported = load_model(ConvReluLinear(), example_inputs=(torch.randn(1, 3, 8, 8),))
    assert model_import._multiply_adds(imported.mod["main"]) == 256 * 27 + 5 * 256

    def build(*args):
        raise AssertionError("built")

    monkeypatch.setattr(model_import, "CHECK_BUILD_MULTIPLY_ADDS", 256 * 27)
    monkeypatch.setattr(model_import, "_run_plain_build", build)
    assert check_against_reference(imported).endswith(
        "its output agrees with " + imported.reference_name + "'s in shape and dtype; numerics are verified at the end "
        "only (0.0 G multiply-adds, too many to run TVM's unscheduled build first)"
    )


def test_a_module_in_training_mode_is_imported_in_eval_mode_and_given_back_in_training_mode(caplog):
    """Collage optimizes inference: dropout off and batch norm on its running statistics, in the import and the
    reference alike, and the user's module keeps training afterwards as it was. A warning says so, since the
    result then computes what ``module.eval()`` does, not what the module as passed does."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5), torch.nn.ReLU()).train()
    with caplog.at_level(logging.WARNING, logger="collage"):
        imported = load_model(module, (torch.randn(4, 8),), name="trained")
    (warning,) = [record.getMessage() for record in caplog.records if "training mode" in record.getMessage()]
    assert warning.startswith("model trained: the module is in training mode") and "module.eval()" in warning
    assert module.training and all(child.training for child in module)
    inputs = imported.random_inputs()
    first, second = imported.reference(inputs)[0], imported.reference(inputs)[0]
    np.testing.assert_array_equal(first, second)  # no dropout: eval mode
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(inputs[0])).numpy()
    np.testing.assert_allclose(first, expected, rtol=1e-6, atol=1e-6)
    module.train()
    assert module.training


def test_a_name_with_control_characters_is_shown_with_them_escaped(tmp_path):
    """A graph name cannot forge report lines or send escape sequences to the terminal."""
    import onnx

    proto = onnx.load(str(MODELS / "tiny_resnet.onnx"))
    proto.graph.name = "evil\n\x1b[31mRED\x1b[0m$(id)"
    imported = load_model(proto)
    assert imported.name == "evil\\n\\x1b[31mRED\\x1b[0m$(id)" and imported.name.isprintable()


def test_names_tvm_renames_on_import_raise_no_warning_of_its_own(tmp_path):
    """TVM's importer warns of each ONNX name it changes into a valid Relax name (``input.1``, ``1x``): those are the
    model's names, not something the user can act on, so the import keeps them quiet."""
    node = helper.make_node("Relu", ["input.1"], ["1out"], name="relu.0")
    graph = helper.make_graph(
        [node],
        "renamed",
        [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("1out", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "renamed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = load_model(str(path))
    assert not [w for w in caught if "Renaming name" in str(w.message)]
    assert imported.inputs[0].shape == (2, 3)


def test_a_model_that_computes_nothing_once_imported_is_refused_in_plain_words(tmp_path):
    """An Identity (or a constant output) folds away on import: there is no operator to place, and the error says so
    rather than speaking of Relax's dataflow blocks."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="same")],
        "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "identity.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelImportError, match=r": the model computes nothing once imported .*: nothing to place$"):
        load_model(str(path))


class _BranchesOnValues(torch.nn.Module):
    def forward(self, x):
        doubled = x * 2
        if doubled.sum() > 0:
            return doubled * 2
        return doubled


def test_a_module_that_branches_on_its_values_is_refused_with_what_torch_export_found():
    """torch.export ends such an error with "The error above occurred when calling torch.export.export", after the
    user's stack: the one line keeps what it found, not that pointer."""
    with pytest.raises(ModelImportError) as refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_model(_BranchesOnValues().eval(), (torch.randn(2, 3),))
    message = str(refused.value)
    assert "Could not guard on data-dependent expression" in message and "The error above" not in message
    assert "\n" not in message


class _ValuesAbove0(torch.nn.Module):
    def forward(self, x):
        return x[x > 0]


def test_the_onnx_route_is_advised_only_where_optimize_would_take_its_export():
    """Its export imports, but the output's shape depends on the values: optimize refuses the file, so the advice
    to take that route would lead nowhere."""
    with pytest.raises(ModelImportError) as refused, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_model(_ValuesAbove0().eval(), (torch.randn(2, 3),))
    assert "the ONNX route fails too" in str(refused.value) and "not a tensor of known shape" in str(refused.value)


def test_example_inputs_given_with_a_model_that_has_its_own_inputs_are_refused_not_ignored(tmp_path):
    """They shaped nothing: an ONNX model's inputs are its own (a dynamic one takes shapes=)."""
    with pytest.raises(collage_core.CollageError, match="example_inputs are a PyTorch module's; this model's inputs are its own"):
        collage_core.optimize(str(tmp_path / "read-after-the-checks.onnx"), example_inputs=(torch.randn(1, 8),))


class TwoLinear(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 6).to(dtype), torch.nn.Linear(6, 3).to(dtype)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_a_module_of_another_float_dtype_runs_in_its_dtype_and_is_held_to_its_tolerance(dtype, tmp_path):
    """A Linear with a bias is aten.addmm, whose product TVM 0.27's converter made float32 whatever the module's dtype
    (its bias add then mixed two dtypes and failed); a bfloat16 module's reference could not read numpy's arrays.
    A 16-bit module is held to its precision's tolerance: its reference answers in 16 bits too."""
    torch.manual_seed(0)
    module = TwoLinear(dtype).eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(dtype)
    result = collage_core.optimize(
        module, example_inputs=(x,), backends=["tvm"], cost_db=tmp_path / "costs.sqlite", compare_backends=False, show_progress=False
    )
    assert result.verification.passed
    name = str(dtype).removeprefix("torch.")
    assert [spec.dtype for spec in result.model.inputs] == [name]
    (x,) = result.model.random_inputs()
    (got,) = result.run(x)
    assert str(got.dtype) == name
    with torch.no_grad():
        expected = module(as_tensor(x, torch)).double()
    scale = float(expected.abs().max())
    # float64: exact to rounding; 16 bits: each layer's output is rounded to 16 bits, and a rounding that goes the other
    # way in the first layer moves the second's: within four units in the last place at the output's scale
    tolerance = {torch.float64: 1e-12, torch.float16: 4 * 2.0**-11, torch.bfloat16: 4 * 2.0**-8}[dtype] * scale
    assert np.max(np.abs(np.asarray(got, dtype=np.float64) - expected.double().numpy())) <= tolerance
    assert result.verification.rtol == {torch.float64: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
