"""Processes with TVM's runtime alone, as on a deployment machine: what the deployment tests run in."""

import os

# Python run first in such a process: TVM's own runtime-only mode (TVM_USE_RUNTIME_LIB=1, as with the
# runtime-only wheel) leaves its compiler library unloaded and tvm.relax unusable.
RUNTIME_ONLY_CHECK = (
    "import tvm.base\n"
    "from collage_core import tvm_compat\n"
    "assert 'tvm_compiler' not in tvm.base._LOADED_LIBS and not tvm_compat.has_compiler()\n"
)


def environment() -> dict:
    """This process's environment with TVM runtime-only and no C++ compiler."""
    return {**os.environ, "TVM_USE_RUNTIME_LIB": "1", "CXX": "/nonexistent/c++"}
