"""Names from inputs never lead out of the output folder.

The model is one ReLU (a run takes seconds), placed on TVM alone at the op level, with no baselines and
no calibration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import collage_core
from collage_core.deploy import carried_dir, read_runtime_file, write_runtime_file
from collage_core.output_folder import NAME_BYTES, library_file, safe_file_name

onnx = pytest.importorskip("onnx")

HOSTILE = {
    "parent": "../../escaped",
    "absolute": "ABSOLUTE",  # a path in the test's own folder, outside the output folder
    "empty": "",
    "nul": "re\0lu",
    "long": "x" * 300,
    "non-ascii": "модель/../../名前",
}


def relu_model(graph_name: str = "relu"):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], graph_name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


@pytest.fixture(scope="module")
def cost_db(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("costs") / "costs.sqlite"


def optimize_into(out: Path, model, cost_db: Path):
    return collage_core.optimize(model, backends=["tvm"], search="op-level", compare_backends=False,
                                 calibration_rounds=0, output_dir=out, cost_db=cost_db, show_progress=False)


def files_under(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_graph_name_writes_nothing_outside_the_output_folder(kind, tmp_path, cost_db):
    name = str(tmp_path / "elsewhere" / "escaped") if kind == "absolute" else HOSTILE[kind]
    out = tmp_path / "out" / "a" / "b"
    optimized = optimize_into(out, relu_model(name), cost_db)
    assert files_under(tmp_path) == files_under(out)
    library = optimized.library_path
    assert library.parent == out and library.is_file() and read_runtime_file(library)["library"] == library.name
    assert optimized.verification.passed


def test_a_plain_name_is_kept_and_none_leads_out_of_its_folder(tmp_path):
    for plain in ("tiny_resnet", "resnet-50.v1", "my model", "модель", "名前"):
        assert safe_file_name(plain) == plain
        assert library_file(tmp_path, plain) == tmp_path / f"{plain}.so"
    names = [*HOSTILE.values(), "/etc/passwd", "..", ".", "a/../../b", "a\\..\\b", "\n", "\udcff", "😀" * 300]
    for name in names:
        library = library_file(tmp_path, name)
        assert library.parent == tmp_path and library.resolve().parent == tmp_path.resolve(), name
        assert "\0" not in library.name and not library.name.startswith(".")
        assert len(f"{library.name}.runtime.json".encode()) <= NAME_BYTES + len(".so.runtime.json") < 255
    assert safe_file_name("x" * 300) != safe_file_name("x" * 299 + "y")  # cut names stay distinct


def test_a_backend_name_does_not_lead_out_of_the_carried_libraries(tmp_path):
    kernels = tmp_path / "kernels" / "libkernels.so"
    kernels.parent.mkdir()
    kernels.write_bytes(b"kernels")
    library = tmp_path / "out" / "m.so"
    library.parent.mkdir()
    library.write_bytes(b"library")
    needs = {"../../evil": {"kind": "op-level", "version": "1", "needs": ""}}
    write_runtime_file(library, needs, {"../../evil": [kernels]})
    (carried,) = read_runtime_file(library)["backends"]["../../evil"]["carried"]
    assert (library.parent / carried).resolve().is_relative_to(carried_dir(library).resolve())
    assert files_under(tmp_path) == {kernels, library, library.parent / "m.so.runtime.json", library.parent / carried}
