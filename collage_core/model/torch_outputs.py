"""What a PyTorch module returns, as the flat tuple of tensors Collage imports, places and checks.

A module may return a tensor, or tuples, lists, dicts, dataclasses and transformers ``ModelOutput``s
of them, nested. Its tensors are taken in the order ``torch.export`` gives them (its pytree,
``torch.utils._pytree``): tuple and list items by index, dict entries in insertion order, a
``ModelOutput``'s fields in declaration order (it holds only those that are not None), a named
tuple's fields in order, and a dataclass's fields in declaration order, as
``torch.export.register_dataclass`` would register them (PyTorch's pytree leaves a dataclass it
does not know whole). None, anywhere, is left out, as a ``ModelOutput`` leaves out its None fields.
Anything else (a number, a string, an object the pytree does not know) is not something Collage
can compare with the imported model's outputs: :class:`NotATensor`.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Sequence

import torch
import torch.utils._pytree as pytree


class NotATensor(Exception):
    """An output of the module that is neither a tensor nor None (``name``: where it is in the outputs)."""

    def __init__(self, name: str, value):
        super().__init__(f"{name} is not a tensor (type {type(value).__name__})")
        self.name = name


def forward_input_names(module, count: int) -> list[str]:
    """The names of ``module.forward``'s first ``count`` parameters (``input0``, ``input1``, ... where it takes
    fewer by name, ``*args``, or has no signature to read, a traced module's)."""
    try:
        signature = inspect.signature(module.forward)
    except (ValueError, TypeError):  # a traced module's ScriptMethod, a builtin: no signature to read
        return [f"input{index}" for index in range(count)]
    parameters = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return parameters[:count] if len(parameters) >= count else [f"input{index}" for index in range(count)]


def flatten(returned) -> list[tuple[str, torch.Tensor]]:
    """The module's tensors in order, each with its place in what it returned (``output['logits']``,
    ``output[1]``; ``output`` for a lone tensor)."""
    return list(_tensors(returned, "output"))


def _tensors(value, name: str):
    leaves, _ = pytree.tree_flatten_with_path(value)
    for path, leaf in leaves:
        where = name + pytree.keystr(path)
        if isinstance(leaf, torch.Tensor):
            yield where, leaf
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            for field in dataclasses.fields(leaf):
                yield from _tensors(getattr(leaf, field.name), f"{where}.{field.name}")
        elif leaf is not None:
            raise NotATensor(where, leaf)


class Flattened(torch.nn.Module):
    """``module`` returning its tensors as :func:`flatten` orders them: what ``torch.export`` is given.
    ``last.names`` says where each came from, as of the last call."""

    def __init__(self, module: torch.nn.Module, input_names: Sequence[str] = ()):
        super().__init__()
        self.module = module
        # torch.export puts a module's list attributes back as they were once it has traced; an object's it leaves.
        self.last = types.SimpleNamespace(names=())
        if input_names:  # torch.export names the program's inputs, and so the library's, after forward's parameters

            def forward(*args):
                return Flattened.forward(self, *args)

            forward.__signature__ = inspect.Signature(
                [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in input_names]
            )
            self.forward = forward

    def forward(self, *args):
        named = flatten(self.module(*args))
        self.last.names = tuple(name for name, _ in named)
        return tuple(tensor for _, tensor in named)
