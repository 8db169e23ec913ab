"""What cuBLASLt computes for a spec, in PyTorch (the functions each pattern covers come from
:func:`collage_core.kit.testing.product_case`).

``reference`` follows cuBLASLt's contract (column-major matrices read through leading dimensions and batch strides,
``D = act(alpha * op(a) op(b) + beta * C + bias)``) with PyTorch, on the CPU in float64 for the
spec tests and on CUDA in float32 with TF32 off for the kernel tests; D is rounded once to the spec's
output type.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch
from collage_cublas import specs
from tvm import relax

from collage_core.kit.testing import rounded_to

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
    ld_d, batch, outer, d_stride, d_outer, padded_rows = w[16:22]
    activation, has_bias, has_residual, alpha = w[22], w[23], w[24], _float(w[25])
    out_dtype = specs.DTYPE_OF_TYPE[w[27]]
    flat = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64).ravel()).to(device=device, dtype=dtype) for x in operands]
    first, second = flat[0], flat[1]
    if padded_rows:  # op(a) = aᵀ, stored with zero columns up to the padded output's row length, which the padded routes read
        assert a[0] == 1 and batch == outer == 1 and not has_bias and not has_residual and padded_rows > m
        assert padded_rows * specs.OUTPUT_BYTES[out_dtype] % specs.ALIGNMENT_BYTES == 0
        assert first.numel() == a[3] * padded_rows and not first[a[3] * m :].any()
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
