"""The two caches a run function of converted models keeps: compiled models by blob, and per
thread, what was bound to a set of tensor addresses.

The VM passes the same few buffers call after call (its memory plan is static; a returned output
alternates between two pooled blocks), so binding tensors, which can cost more than running a
small model, happens once per set of addresses and thread.
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Generic, TypeVar

import numpy as np

from collage_core.relax_onnx import lowering

Compiled = TypeVar("Compiled")
Bound = TypeVar("Bound")


class CompiledModels(Generic[Compiled]):
    """One compiled model per blob digest (content, not address: a freed constant's address can
    come back holding another model), least recently used dropped first beyond ``capacity``.

    ``compile(serialized, options)`` makes one from the blob's model and options byte; ``owner``
    names the run function in the error a blob that does not match its digest raises.
    """

    def __init__(self, capacity: int, compile: Callable[[bytes, int], Compiled], owner: str):
        self.capacity = capacity
        self._compile = compile
        self._owner = owner
        self._models: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, blob: np.ndarray) -> Compiled:
        key = lowering.blob_key(blob)
        with self._lock:
            model = self._models.get(key)
            if model is not None:
                self._models.move_to_end(key)
                return model
        model = self._compile(*lowering.unpack_blob(blob, self._owner))
        with self._lock:
            self._models[key] = model
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)
        return model

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def __len__(self) -> int:
        return len(self._models)


class BindingsByAddress(Generic[Bound]):
    """Per thread, up to ``capacity`` bindings keyed by the addresses of the tensors they hold,
    least recently used dropped first. ``bind(tensors, reused)`` makes a binding, given the one
    about to be dropped (or None) so that it can be reused."""

    def __init__(self, capacity: int, bind: Callable[[tuple, Bound | None], Bound]):
        self.capacity = capacity
        self._bind = bind
        self._per_thread = threading.local()

    def get(self, tensors) -> Bound:
        addresses = tuple(tensor.data_ptr() for tensor in tensors)
        bindings = self._per_thread.__dict__.setdefault("bindings", collections.OrderedDict())
        binding = bindings.get(addresses)
        if binding is not None:
            bindings.move_to_end(addresses)
            return binding
        dropped = bindings.popitem(last=False)[1] if len(bindings) >= self.capacity else None
        binding = bindings[addresses] = self._bind(tuple(tensors), dropped)
        return binding
