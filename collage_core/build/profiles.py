"""One library for every shape profile: each profile's placed module, renamed apart, built as one executable.

Profile k's ``main`` becomes ``main_shape{k}`` (k from 1) and every other function of its module (partitions,
the importer's TIR functions) gains the suffix ``_shape{k}``, so that the profiles' partitions, placed on
different backends, live side by side; TVM's build keeps one copy of a weight the profiles share (its
constants are pooled by value). The runtime file beside the library lists the profiles, the function each
runs and the padding rule, for :mod:`collage_core.outputs.dispatch` to choose among them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build import deploy
from collage_core.errors import CollageError
from collage_core.outputs.dispatch import ShapeDispatch

# The attribute marking each Relax function of a merged module with the shape (from 1) it belongs to.
SHAPE_ATTR = "collage.shape"


class ProfilesBuildError(CollageError):
    """The shapes' placed modules cannot be merged into one."""


def entry_function(index: int) -> str:
    """The library's entry function of profile ``index`` (from 0)."""
    return f"main_shape{index + 1}"


@relax.expr_functor.mutator
class _Renamer(relax.PyExprMutator):
    """Points each reference to a global function at its renamed one (by the old name)."""

    def __init__(self, renamed: Mapping[str, tvm.ir.GlobalVar], mod=None):
        super().__init__(mod)
        self.renamed = renamed

    def visit_global_var_(self, op):
        return self.renamed.get(op.name_hint, op)


def merged_module(modules: Sequence[tvm.IRModule]) -> tvm.IRModule:
    """One module holding every profile's functions, renamed apart (see the module's docstring)."""
    bb = relax.BlockBuilder()
    for index, mod in enumerate(modules):
        suffix = f"_shape{index + 1}"
        renamed = {}
        for gvar, func in mod.functions_items():
            name = entry_function(index) if gvar.name_hint == "main" else f"{gvar.name_hint}{suffix}"
            if tvm_compat.is_tir_function(func):
                func = func.with_attr("global_symbol", name)
            else:  # the block builder takes a function equal to one it holds for that one: each stays its shape's
                func = func.with_attr(SHAPE_ATTR, index + 1)
            renamed[gvar.name_hint] = bb.add_func(func, name)
            if renamed[gvar.name_hint].name_hint != name:  # never, unless a module names a function twice
                raise ProfilesBuildError(f"shape {index + 1}: function {name} is named twice")
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                new = _Renamer(renamed).visit_expr(func)
                if new.attrs is not None and "global_symbol" in new.attrs:
                    new = new.with_attr("global_symbol", renamed[gvar.name_hint].name_hint)
                bb.update_func(renamed[gvar.name_hint], new)
    return bb.get()


def write_profiles_runtime_file(library: os.PathLike, libraries: Sequence[os.PathLike], dispatch: ShapeDispatch) -> Path:
    """The runtime file of ``library``, built from the profiles' placed modules: the backends of every
    profile's own library (``libraries``, each with its runtime file beside it), their native libraries copied
    beside it, and ``dispatch``: the profiles, their entry functions (:func:`entry_function`, in order) and the
    padding rule."""
    needs, carried, environment = {}, {}, {}
    for alone in libraries:
        record = deploy.read_runtime_file(alone)
        each_needs, each_carries = deploy.needs_and_carried(alone, record)
        needs.update(each_needs)
        carried.update(each_carries)
        environment.update(record.get("environment") or {})
    return deploy.write_runtime_file(library, needs, carried, environment or None, dispatch.to_json())
