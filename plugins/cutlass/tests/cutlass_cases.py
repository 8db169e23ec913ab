"""What a CUTLASS kernel computes for a spec, in PyTorch (the functions each pattern covers come from
:func:`collage_core.kit.testing.product_case`).

``reference`` follows the kernels' contract (``runtime/gemm_runner.h``): A (M x K) and B (N x K) read
through their leading and batch strides, ``D = act(alpha * A Bᵀ + bias + C)`` for each batch and outer
batch, with PyTorch, on the CPU in float64 for the spec tests and on CUDA in float32 for the kernel
tests; D is rounded once to the spec's output type.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch
from collage_cutlass import conv_specs, kernels, specs

from collage_core.kit.testing import rounded_to

OUT_DTYPES = {code: dtype for dtype, code in kernels.TYPE_CODES.items()}
ACTIVATIONS = {code: name for name, code in kernels.ACTIVATION_CODES.items()}


def _float(word: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(word)))[0]


def _activation(name, d):
    if name == "relu":
        return torch.relu(d)
    if name == "gelu_erf":
        return 0.5 * d * (1 + torch.erf(d / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * d * (1 + torch.tanh(math.sqrt(2 / math.pi) * (d + 0.044715 * d**3)))
    if name == "silu":
        return d * torch.sigmoid(d)
    return d


def reference(words, operands: list[np.ndarray], out_size: int, device: str = "cpu", dtype=torch.float64) -> np.ndarray:
    """What the CUTLASS kernel computes for a spec on flat operands."""
    w = [int(x) for x in words]
    assert w[0] == specs.SPEC_VERSION
    out_dtype, a_m_major, b_n_major, has_bias, has_residual, activation = (OUT_DTYPES[w[2]], w[3], w[4], w[5], w[6], ACTIVATIONS[w[7]])
    m, n, k, batch = w[8:12]
    lead_a, batch_a, lead_b, batch_b, lead_d, batch_d, outer, outer_a, outer_b, outer_d = w[12:22]
    alpha = _float(w[22])
    flat = [torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64).ravel()).to(device=device, dtype=dtype) for x in operands]
    first, second = flat[0], flat[1]
    bias = flat[2] if has_bias else None
    residual = flat[2 + has_bias] if has_residual else None
    out = torch.full((out_size,), float("nan"), device=device, dtype=dtype)
    for o in range(outer):
        for t in range(batch):
            a = torch.as_strided(first, (m, k), (1, lead_a) if a_m_major else (lead_a, 1), o * outer_a + t * batch_a)
            b = torch.as_strided(second, (n, k), (1, lead_b) if b_n_major else (lead_b, 1), o * outer_b + t * batch_b)
            d = alpha * (a @ b.T)
            offset = o * outer_d + t * batch_d
            if bias is not None:
                d = d + bias[None, :]
            if residual is not None:
                d = d + torch.as_strided(residual, (m, n), (lead_d, 1), offset)
            torch.as_strided(out, (m, n), (lead_d, 1), offset).copy_(_activation(activation, d))
    return rounded_to(out.cpu().numpy(), out_dtype).astype(np.float64)


def conv_reference(spec: conv_specs.ConvSpec, operands: list[np.ndarray], device: str = "cpu", dtype=torch.float64) -> np.ndarray:
    """What the CUTLASS convolution kernel computes for ``spec`` (runtime/conv_runner.h), with the lowering's layout
    changes: operands the spec names channel-first are taken NCHW, and the output is given in the partition's layout."""
    w = [int(x) for x in spec.words]
    assert w[0] == conv_specs.CONV_SPEC_VERSION
    out_dtype, has_bias, has_residual, activation = OUT_DTYPES[w[2]], w[3], w[4], ACTIVATIONS[w[5]]
    n, h, width, c, k, r, s, p, q, top, left, bottom, right, stride_h, stride_w, dilation_h, dilation_w = w[6:23]
    tensors = [torch.from_numpy(np.asarray(x, dtype=np.float64)).to(device=device, dtype=dtype) for x in operands]
    tensors = [x.permute(0, 2, 3, 1) if i in spec.channel_first else x for i, x in enumerate(tensors)]  # all NHWC now
    x, filters = tensors[0], tensors[1]
    assert tuple(x.shape) == (n, h, width, c) and tuple(filters.shape) == (k, r, s, c)
    padded = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (left, right, top, bottom))
    y = torch.nn.functional.conv2d(
        padded, filters.permute(0, 3, 1, 2), stride=(stride_h, stride_w), dilation=(dilation_h, dilation_w)
    ).permute(0, 2, 3, 1)
    assert tuple(y.shape) == (n, p, q, k)
    if has_bias:
        y = y + tensors[2]
    if has_residual:
        y = y + tensors[2 + has_bias]
    y = _activation(activation, y)
    if spec.output_channel_first:
        y = y.permute(0, 3, 1, 2)
    return rounded_to(y.contiguous().cpu().numpy(), out_dtype).astype(np.float64)
