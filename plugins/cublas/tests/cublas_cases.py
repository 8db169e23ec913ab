"""A Relax function for every cuBLAS pattern, and what cuBLASLt computes for a spec, in PyTorch.

``case(pattern_name)`` builds a small function that the named pattern covers whole, from the
name's parts (operand forms, bias, residual, reshape, activation, scale). ``reference`` follows
cuBLASLt's contract (column-major matrices read through leading dimensions and batch strides,
``D = act(alpha * op(a) op(b) + beta * C + bias)``) with PyTorch, on the CPU in float64 for the
spec tests and on CUDA in float32 with TF32 off for the kernel tests; D is rounded once to the spec's
output type.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch
from tvm import relax

from collage_core.testing import rounded_to
from collage_cublas import specs

R = relax.op
F = "float32"


def _float(word: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(word)))[0]


def reference(words, operands: list[np.ndarray], out_size: int, device: str = "cpu", dtype=torch.float64) -> np.ndarray:
    """What cuBLASLt computes for a spec (without algorithm words) on flat float32 operands."""
    w = [int(x) for x in words]
    assert w[0] == specs.SPEC_VERSION
    m, n, k = w[1:4]
    a, b = w[4:10], w[10:16]
    ld_d, batch, outer, d_stride, d_outer = w[16:21]
    activation, has_bias, has_residual, alpha = w[21], w[22], w[23], _float(w[24])
    out_dtype = specs.DTYPE_OF_TYPE[w[26]]
    flat = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64).ravel()).to(device=device, dtype=dtype) for x in operands]
    first, second = flat[0], flat[1]
    bias = flat[2] if has_bias else None
    residual = flat[2 + has_bias] if has_residual else None
    out = torch.full((out_size,), float("nan"), device=device, dtype=dtype)
    for o in range(outer):
        for t in range(batch):
            op_a = torch.as_strided(first, (a[1], a[2]), (1, a[3]), o * a[5] + t * a[4])
            op_b = torch.as_strided(second, (b[1], b[2]), (1, b[3]), o * b[5] + t * b[4])
            op_a, op_b = (op_a.T if a[0] else op_a), (op_b.T if b[0] else op_b)
            assert tuple(op_a.shape) == (m, k) and tuple(op_b.shape) == (k, n)
            d = alpha * (op_a @ op_b)
            offset = o * d_outer + t * d_stride
            if residual is not None:
                d = d + torch.as_strided(residual, (m, n), (1, ld_d), offset)
            if bias is not None:
                d = d + bias[:, None]
            if activation == specs.RELU:
                d = torch.relu(d)
            elif activation == specs.GELU_TANH:
                d = 0.5 * d * (1 + torch.tanh(math.sqrt(2 / math.pi) * (d + 0.044715 * d**3)))
            torch.as_strided(out, (m, n), (1, ld_d), offset).copy_(d)
    return rounded_to(out.cpu().numpy(), out_dtype).astype(np.float64)


def _const(rng, *shape, dtype=F):
    return relax.const(rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype))


def _gelu_tanh_spelt_out(bb, x):
    """tanh GELU as GPT-2's exporters write it."""
    cube = bb.emit(R.multiply(bb.emit(R.power(x, relax.const(3.0, F))), relax.const(0.044715, F)))
    inner = bb.emit(R.multiply(bb.emit(R.add(x, cube)), relax.const(math.sqrt(2 / math.pi), F)))
    one = bb.emit(R.add(bb.emit(R.tanh(inner)), relax.const(1.0, F)))
    return R.multiply(bb.emit(R.multiply(x, relax.const(0.5, F))), one)


def case(pattern_name: str, seed: int = 0, cast_to: str = F):
    """``(make(bb, *params), param shapes)`` for a function the pattern ``cublas.<pattern_name>`` covers whole.

    With ``cast_to`` a 16-bit type, it is written the way `--precision bf16|fp16` converts a model: parameters
    and constants of that type, the product accumulating in float32 and cast to 16 bits before the epilogue.
    """
    rng = np.random.default_rng(seed)
    parts = pattern_name.split("_")

    def product(bb, lhs, rhs):
        if cast_to == F:
            return bb.emit(R.matmul(lhs, rhs))
        return bb.emit(R.astype(bb.emit(R.matmul(lhs, rhs, out_dtype=F)), cast_to))

    if parts[0] == "dense":
        transposed = "t" in parts
        m_shape, k, n = (2, 8), 24, 40
        shapes = [(k, 16)] if transposed else [(*m_shape, k)]
        out_shape = (16, n) if transposed else (*m_shape, n)
        if "add" in parts:
            shapes.append(out_shape)

        def make(bb, x, *rest):
            if transposed:
                x = bb.emit(R.permute_dims(x, [1, 0]))
            v = product(bb, x, _const(rng, k, n, dtype=cast_to))
            if "bias" in parts:
                v = bb.emit(R.add(_const(rng, n, dtype=cast_to), v))
            if "add" in parts:
                v = bb.emit(R.add(v, rest[0]))
            if "reshape" in parts:
                v = bb.emit(R.reshape(v, (1, math.prod(out_shape[:-1]), n)))
            if "relu" in parts:
                v = bb.emit(R.nn.relu(v))
            if "gelu" in parts:
                v = bb.emit(_gelu_tanh_spelt_out(bb, v))
            return v

        return make, shapes
    forms = next((p for p in parts[2:] if p in ("nn", "nt", "tn", "tt")), "nn")
    batch, heads, m, k, n = 2, 3, 16, 8, 12
    lhs_shape = (batch, m, heads, k) if forms[0] == "t" else (batch, heads, m, k)
    rhs_shape = (batch, n, heads, k) if forms[1] == "t" else (batch, heads, k, n)

    def make(bb, lhs, rhs):
        if forms[0] == "t":
            lhs = bb.emit(R.permute_dims(lhs, [0, 2, 1, 3]))  # a head split read in place
        if forms[1] == "t":
            rhs = bb.emit(R.permute_dims(rhs, [0, 2, 3, 1]))  # K^T of a head split
        v = product(bb, lhs, rhs)
        if "scale" in parts:
            v = bb.emit(R.multiply(v, relax.const(0.125, cast_to)))
        return v

    return make, [lhs_shape, rhs_shape]
