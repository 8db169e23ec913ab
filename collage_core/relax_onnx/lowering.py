"""A partition replaced by one packed call that runs its ONNX model, and the model's blob.

A lowered partition is ``R.call_dps_packed(run_function, [blob, *inputs], ...)``: the VM hands
the backend's run function the blob, the input tensors and the output tensors it allocated. The
blob (:func:`pack_blob`) is a uint8 constant: the SHA-256 digest of what follows, one options byte
the backend defines, then the serialized model. The digest is the key a runtime caches its
compiled model by, and a blob that does not match it is refused.
"""

from __future__ import annotations

import hashlib

import numpy as np
import tvm
from tvm import relax

from collage_core import tvm_compat
from collage_core.build import executable as build

DIGEST_BYTES = hashlib.sha256().digest_size


def pack_blob(serialized: bytes, options: int = 0) -> np.ndarray:
    """Digest, options byte, model: what a lowered partition carries."""
    payload = bytes([options]) + serialized
    return np.frombuffer(hashlib.sha256(payload).digest() + payload, dtype=np.uint8)


def blob_key(blob: np.ndarray) -> bytes:
    """The blob's digest: the same model with the same options has the same key."""
    return blob[:DIGEST_BYTES].tobytes()


def unpack_blob(blob: np.ndarray, owner: str = "collage") -> tuple[bytes, int]:
    """The serialized model and the options byte; ``owner`` names the run function in the error
    raised when the blob does not match its digest."""
    data = blob.tobytes()
    digest, payload = data[:DIGEST_BYTES], data[DIGEST_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError(f"{owner}: the model blob does not match its digest")
    return payload[1:], payload[0]


def packed_call_function(func: relax.Function, name: str, run_function: str, blob: np.ndarray) -> relax.Function:
    """``func`` with its body replaced by ``run_function(blob, *params)`` in destination-passing
    style, returning what ``func`` returns."""
    return build.packed_call_function(func, name, run_function, blob, list(func.params))


def runs_alone(mod, function_names) -> bool:
    """Whether every entry function (``main``; a library of shape profiles has one per shape) that calls these
    partitions does nothing else but call them (and pass tuples around): then no other backend's kernel runs
    between them, and their thread pools may keep the cores."""
    ours = set(function_names)
    for func in entry_functions(mod):
        calls_ours, calls_other = False, False
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Call):
                    if isinstance(value.op, tvm.ir.GlobalVar) and value.op.name_hint in ours:
                        calls_ours = True
                    else:
                        calls_other = True
                elif not (isinstance(value, (relax.Tuple, relax.TupleGetItem, relax.Var)) or tvm_compat.is_constant(value)):
                    calls_other = True
        if calls_ours and calls_other:
            return False
    return True


def entry_functions(mod) -> list:
    """The Relax functions of ``mod`` a caller may call by name (those with a global symbol)."""
    return [
        func
        for _, func in mod.functions_items()
        if isinstance(func, relax.Function) and func.attrs is not None and "global_symbol" in func.attrs
    ]
