"""Each plugin's Python side writes kernel specs that its C++ runtime reads, both naming the layout's version: the
two must agree, or every kernel of the plugin fails to build on the device ("the spec was written for another
version of the kernels"), which no test without that device would show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
# The C++ source that reads a spec, and the Python module and constant that write it.
WRITERS = {
    "cublas/collage_cublas/runtime/collage_cublas.cc": ("cublas/collage_cublas/specs.py", "SPEC_VERSION"),
    "cudnn/collage_cudnn/runtime/collage_cudnn.cc": ("cudnn/collage_cudnn/specs.py", "SPEC_VERSION"),
    "dnnl/collage_dnnl/runtime/collage_dnnl.cc": ("dnnl/collage_dnnl/specs.py", "SPEC_VERSION"),
    "cutlass/collage_cutlass/runtime/gemm_runner.h": ("cutlass/collage_cutlass/specs.py", "SPEC_VERSION"),
    "cutlass/collage_cutlass/runtime/conv_runner.h": ("cutlass/collage_cutlass/conv_specs.py", "CONV_SPEC_VERSION"),
}
CPP_VERSION = re.compile(r"constexpr\s+int64_t\s+kSpecVersion\s*=\s*(\d+)\s*;")


def _one(pattern: re.Pattern, path: Path) -> int:
    found = pattern.findall(path.read_text())
    assert len(found) == 1, f"{path}: {len(found)} version declarations where one is expected"
    return int(found[0])


@pytest.mark.parametrize("reader", sorted(WRITERS))
def test_the_runtime_reads_the_spec_version_its_python_side_writes(reader):
    writer, constant = WRITERS[reader]
    written = _one(re.compile(rf"^{constant}\s*=\s*(\d+)\s*$", re.M), PLUGINS / writer)
    assert _one(CPP_VERSION, PLUGINS / reader) == written, f"{reader} reads a spec version other than {writer}'s {constant}"


def test_every_runtime_that_checks_a_spec_version_is_paired_with_its_writer():
    readers = {str(path.relative_to(PLUGINS)) for path in PLUGINS.glob("*/*/runtime/*") if path.suffix in (".cc", ".h", ".cu")}
    checking = {reader for reader in readers if CPP_VERSION.search((PLUGINS / reader).read_text())}
    assert checking == set(WRITERS)
