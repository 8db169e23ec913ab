"""What lowered partitions call outside TVM's own kernels, and how often a run calls it.

A backend's lowering replaces a partition by calls to packed functions it registers, or gives it a
``Codegen`` attribute that TVM's ``RunCodegen`` turns into an external function compiled into the
library; a partition left as plain Relax is compiled by TVM like any other. :func:`calls_of` reads
which of these a function calls; :func:`counting_calls` counts the calls a run makes to registered
packed functions, through wrappers registered under their names.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterable, Iterator

import tvm_ffi
from tvm import ir, relax

from collage_core import tvm_compat

VM_BUILTINS = "vm.builtin."


def calls_of(func, module) -> dict:
    """What ``func``, a Relax function of ``module`` (lowered, ``RunCodegen`` done), calls: packed functions
    (registered at run time by a backend), external functions (compiled into the library by a TVM codegen)
    and TIR functions, each a sorted list of names. ``func`` None (a function the build inlined into its
    caller) calls nothing."""
    externals = list(module.attrs["external_mods"]) if module.attrs is not None and "external_mods" in module.attrs else []
    symbols, tir = set(), set()

    def visit(node):
        if isinstance(node, relax.ExternFunc) and not str(node.global_symbol).startswith(VM_BUILTINS):
            symbols.add(str(node.global_symbol))
        elif isinstance(node, ir.GlobalVar) and tvm_compat.is_tir_function(module[node]):
            tir.add(node.name_hint)

    if func is not None:
        relax.analysis.post_order_visit(func.body, visit)
    external = {name for name in symbols if any(m.implements_function(name) for m in externals)}
    return {"packed_functions": sorted(symbols - external), "external_functions": sorted(external), "tir_functions": sorted(tir)}


def outside_calls(module) -> set[str]:
    """The packed and external functions any Relax function of ``module`` calls: what runs outside TVM's kernels."""
    found = set()
    for func in module.functions.values():
        if isinstance(func, relax.Function):
            calls = calls_of(func, module)
            found |= {*calls["packed_functions"], *calls["external_functions"]}
    return found


@contextlib.contextmanager
def counting_calls(names: Iterable[str]) -> Iterator[Counter]:
    """While inside, each registered global function of ``names`` is a wrapper that counts its calls in the
    yielded ``Counter`` (from 0) and calls the function; the functions are registered back on leaving.
    Names no function is registered under are left alone, and out of the counter.

    A Relax VM looks its packed functions up when it is made: make it inside, as a run to be counted.
    """
    originals = {name: tvm_ffi.get_global_func(name, allow_missing=True) for name in sorted(set(names))}
    counts = Counter({name: 0 for name, original in originals.items() if original is not None})

    def counted(name, original):
        def wrapper(*args):
            counts[name] += 1
            return original(*args)

        return wrapper

    try:
        for name, original in originals.items():
            if original is not None:
                tvm_ffi.register_global_func(name, counted(name, original), override=True)
        yield counts
    finally:
        for name, original in originals.items():
            if original is not None:
                tvm_ffi.register_global_func(name, original, override=True)
