"""A Relax function for every cuDNN pattern, and what cuDNN's operation graph computes for a spec, in PyTorch.

``case(pattern_name, activation)`` builds a small function that the named pattern covers whole,
from the name's parts (anchor, operand forms, bias, residual, activation). ``reference`` builds
the graph a spec describes (tensors read and y written through the spec's dims and strides, a cross-correlation
or a batched product, then bias, residual and activation as cuDNN's pointwise modes define them)
with PyTorch: on the CPU in float64 for the spec tests, on CUDA in float32 with TF32 off for the
kernel tests. A pattern whose name holds ``cast`` is built the way `--precision bf16|fp16` converts a
model (16-bit operands and constants, the float32 result cast to 16 bits before the epilogue); the
reference computes its epilogue unrounded and rounds once to the spec's output type.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from collage_cudnn import specs
from tvm import relax

from collage_core.kit import ACTIVATIONS, tvm_compat
from collage_core.kit.testing import rounded_to

R = relax.op
F = "float32"


class _Words:
    def __init__(self, words):
        self.words, self.at = [int(w) for w in words], 0

    def take(self, count=1):
        values = self.words[self.at : self.at + count]
        self.at += count
        return values if count > 1 else values[0]


def reference(words, operands: list[np.ndarray], device: str = "cpu", dtype=torch.float64) -> np.ndarray:
    """What the cuDNN graph of a spec (without plan words) computes on the operands."""

    def tensor(array):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64).ravel()).to(device=device, dtype=dtype)

    w = _Words(words)
    assert w.take() == specs.SPEC_VERSION
    kind, rank = w.take(), w.take()
    if kind == specs.ATTENTION:
        return _attention(w, [tensor(array) for array in operands])
    x_dims, x_strides, w_dims, w_strides, y_dims, y_strides = (w.take(rank) for _ in range(6))
    x = torch.as_strided(tensor(operands[0]), x_dims, x_strides)
    weights = torch.as_strided(tensor(operands[1]), w_dims, w_strides)
    if kind == specs.CONV2D:
        top, left, bottom, right = w.take(4)
        stride, dilation = w.take(2), w.take(2)
        padded = torch.nn.functional.pad(x, (left, right, top, bottom))
        y = torch.nn.functional.conv2d(padded, weights, stride=stride, dilation=dilation, groups=x_dims[1] // w_dims[1])
        channel_shape = [1, y_dims[1], 1, 1]
    else:
        y = torch.matmul(x, weights)
        channel_shape = [1] * (rank - 1) + [y_dims[-1]]
    assert list(y.shape) == list(y_dims)
    has_bias, has_residual, activation, operand_type, output_type = (w.take() for _ in range(5))
    assert w.at == len(w.words) and {operand_type, output_type} <= {*specs.OPERAND_TYPES.values(), specs.TF32_OPERANDS}
    at = 2
    if has_bias:
        y = y + tensor(operands[at]).reshape(channel_shape)
        at += 1
    if has_residual:
        y = y + torch.as_strided(tensor(operands[at]), y_dims, y_strides)
    functions = {
        0: lambda t: t,
        1: torch.relu,
        2: lambda t: torch.nn.functional.gelu(t),
        3: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        4: torch.nn.functional.silu,
    }
    out = torch.zeros(math.prod(y_dims), dtype=y.dtype, device=y.device)  # y's memory, written through its strides
    torch.as_strided(out, y_dims, y_strides).copy_(functions[activation](y))
    return rounded_to(out.cpu().numpy(), specs.DTYPE_OF_TYPE[output_type]).astype(np.float64)


def _attention(w: _Words, operands: list) -> np.ndarray:
    """What cuDNN's fused attention computes: scores and softmax unrounded, the probabilities rounded to the
    operands' 16-bit type before the product with v (as its flash-attention engine does), the result rounded once
    and written through o's strides. q, k and v are read through their dims, strides and offsets."""
    q_dims, q_strides, k_dims, k_strides, v_dims, v_strides, o_dims, o_strides = (w.take(4) for _ in range(8))
    offsets = w.take(3)
    (scale,), mask, operand_type, output_type = np.frombuffer(np.int64(w.take()).tobytes(), np.float64), w.take(), w.take(), w.take()
    assert w.at == len(w.words) and mask in specs.MASK_CODES.values()
    q, k, v = (
        torch.as_strided(t, d, s, offset)
        for t, d, s, offset in zip(operands, (q_dims, k_dims, v_dims), (q_strides, k_strides, v_strides), offsets)
    )
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask == specs.MASK_CODES["causal"]:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    dtype = specs.DTYPE_OF_TYPE[operand_type]
    probabilities = torch.from_numpy(rounded_to(torch.softmax(scores, dim=-1).cpu().numpy(), dtype).astype(np.float64))
    out = torch.matmul(probabilities.to(v.device, v.dtype), v)
    assert list(out.shape) == list(o_dims)
    written = torch.zeros(math.prod(o_dims), dtype=out.dtype, device=out.device)  # o's memory, written through its strides
    torch.as_strided(written, o_dims, o_strides).copy_(out)
    return rounded_to(written.cpu().numpy(), specs.DTYPE_OF_TYPE[output_type]).astype(np.float64)


def cast_dtype(pattern_name: str, dtype: str = "bfloat16") -> str:
    """The dtype a pattern's case takes: ``dtype`` (16 bits) for one that absorbs the cast, is fused attention or is
    a batched product (offered at float32 only as ``_tf32``: patterns.FLOAT32_PRODUCTS), else float32."""
    parts = pattern_name.split("_")
    return dtype if "cast" in parts or parts[0] in ("attention", "batch") else F


def _const(rng, *shape, dtype=F):
    return relax.const(rounded_to(rng.uniform(-1, 1, size=shape).astype(F), dtype))


def _activation(bb, x, name: str):
    """``name`` applied to ``x`` the way models spell it: ONNX's erf GELU and x * sigmoid(x) written out."""
    if name == "relu":
        return R.nn.relu(x)
    if name == "gelu_tanh":
        return R.nn.gelu_tanh(x)
    if name == "silu":
        return R.multiply(x, bb.emit(R.sigmoid(x)))
    erf = bb.emit(R.erf(bb.emit(R.divide(x, relax.const(math.sqrt(2.0), F)))))
    return R.multiply(bb.emit(R.multiply(x, bb.emit(R.add(erf, relax.const(1.0, F))))), relax.const(0.5, F))


def case(pattern_name: str, activation: str = "relu", seed: int = 0, dtype: str = "bfloat16"):
    """``(make(bb, *params), param shapes)`` for a function the pattern ``cudnn.<pattern_name>`` covers whole,
    with parameters of ``cast_dtype(pattern_name, dtype)``."""
    rng = np.random.default_rng(seed)
    parts = pattern_name.split("_")
    operand_dtype = cast_dtype(pattern_name, dtype)

    def anchored(bb, call):
        """The anchor's call, cast to 16 bits (emitted) for a pattern that absorbs the cast."""
        return bb.emit(R.astype(bb.emit(call), operand_dtype)) if "cast" in parts else call

    def epilogue(bb, v, channels, bias_shape, residual):
        if "bias" in parts:
            v = bb.emit(R.add(v, _const(rng, *bias_shape, dtype=operand_dtype)))
        if "add" in parts:
            v = bb.emit(R.add(v, residual[0]))
        if "act" in parts or "relu" in parts:
            v = bb.emit(_activation(bb, v, "relu" if "relu" in parts else activation))
        return v

    if parts[0] == "conv2d":  # NCHW, or NHWC for a pattern named _nhwc
        last = "nhwc" in parts
        x_shape, out_shape = ((2, 10, 10, 8), (2, 5, 5, 16)) if last else ((2, 8, 10, 10), (2, 16, 5, 5))
        shapes = [x_shape] + ([out_shape] if "add" in parts else [])
        layouts = dict(data_layout="NHWC", kernel_layout="OHWI") if last else {}

        def make(bb, x, *residual):
            weights = _const(rng, *((16, 3, 3, 4) if last else (16, 4, 3, 3)), dtype=operand_dtype)
            conv = R.nn.conv2d(x, weights, strides=(2, 2), padding=(1, 1, 1, 1), groups=2, out_dtype=F, **layouts)
            v = anchored(bb, conv)
            v = v if isinstance(v, relax.Var) else bb.emit(v)
            return epilogue(bb, v, 16, (1, 1, 1, 16) if last else (1, 16, 1, 1), residual)

        return make, shapes
    if parts[0] == "attention":  # a causal self-attention: q, k, v (batch, seq, heads, size), or stacked (batch, seq, 3 * heads * size)
        batch, sequence, heads, size = 2, 16, 3, 32
        make = attention(operand_dtype, 1 / math.sqrt(size), causal_mask(sequence), stacked="qkv" in parts, bshd="bshd" in parts)
        return make, [(batch, sequence, 3 * heads * size)] if "qkv" in parts else [(batch, sequence, heads, size)] * 3
    if parts[0] == "dense":
        transposed = "t" in parts
        k, n = 24, 40
        shapes = [(k, 16)] if transposed else [(2, 8, k)]
        out_shape = (16, n) if transposed else (2, 8, n)
        if "add" in parts:
            shapes.append(out_shape)

        def make(bb, x, *residual):
            if transposed:
                x = bb.emit(R.permute_dims(x, [1, 0]))
            v = bb.emit(R.matmul(x, _const(rng, k, n)))
            return epilogue(bb, v, n, (n,), residual)

        return make, shapes
    forms = next((p for p in parts[2:] if p in ("nn", "nt", "tn", "tt")), "nn")
    batch, heads, m, k, n = 1, 3, 16, 8, 12
    lhs_shape = (batch, m, heads, k) if forms[0] == "t" else (batch, heads, m, k)
    rhs_shape = (batch, n, heads, k) if forms[1] == "t" else (batch, heads, k, n)

    def make(bb, lhs, rhs):
        if forms[0] == "t":
            lhs = bb.emit(R.permute_dims(lhs, [0, 2, 1, 3]))
        if forms[1] == "t":
            rhs = bb.emit(R.permute_dims(rhs, [0, 2, 3, 1]))
        product = R.matmul(lhs, rhs, out_dtype=F)
        # 16-bit operands as `--precision bf16|fp16` writes them: the float32 product cast back (the pattern takes it)
        return product if operand_dtype == F else bb.emit(R.astype(bb.emit(product), operand_dtype))

    return make, [lhs_shape, rhs_shape]


def causal_mask(sequence: int) -> np.ndarray:
    """The additive mask a causal self-attention's export adds to its scores: -inf above the diagonal."""
    return np.triu(np.full((sequence, sequence), -np.inf, dtype=np.float32), k=1).reshape(1, 1, sequence, sequence)


def attention(dtype: str, scale=None, mask=None, stacked: bool = False, bshd: bool = False, heads: int = 3):
    """``make(bb, q, k, v)`` for a self-attention over q, k, v of (batch, sequence, heads, size) as `--precision
    bf16|fp16` converts it: the scores cast to ``dtype``, multiplied by ``scale`` (unless None), cast to float32,
    ``mask`` added (unless None), the softmax's probabilities cast to ``dtype``, and the result cast to ``dtype``.
    With ``stacked``, ``make(bb, qkv)`` instead: q, k and v are the three parts of a split of one (batch, sequence,
    3 * heads * size) tensor, each reshaped to ``heads`` heads (GPT-2's stacked projection); with ``bshd`` the result
    is transposed back to (batch, sequence, heads, size) and reshaped to (batch * sequence, heads * size), as the
    output projection reads it."""

    def make(bb, *qkv):
        if stacked:
            (stacked_qkv,) = qkv
            batch, sequence, width = tvm_compat.tensor_shape_dtype(stacked_qkv)[0]
            parts = bb.emit(R.split(stacked_qkv, indices_or_sections=[width // 3, 2 * width // 3], axis=2))
            qkv = [
                bb.emit(R.reshape(bb.emit(relax.TupleGetItem(parts, i)), (batch, sequence, heads, width // 3 // heads))) for i in range(3)
            ]
        q, k, v = qkv
        q, k = bb.emit(R.permute_dims(q, [0, 2, 1, 3])), bb.emit(R.permute_dims(k, [0, 2, 3, 1]))
        scores = bb.emit(R.astype(bb.emit(R.matmul(q, k, out_dtype=F)), dtype))
        if scale is not None:
            scores = bb.emit(R.multiply(scores, relax.const(scale, dtype)))
        scores = bb.emit(R.astype(scores, F))
        if mask is not None:
            scores = bb.emit(R.add(scores, relax.const(mask)))
        probabilities = bb.emit(R.astype(bb.emit(R.nn.softmax(scores, axis=-1)), dtype))
        result = R.astype(bb.emit(R.matmul(probabilities, bb.emit(R.permute_dims(v, [0, 2, 1, 3])), out_dtype=F)), dtype)
        if not bshd:
            return result
        written = bb.emit(R.permute_dims(bb.emit(result), [0, 2, 1, 3]))
        batch, sequence, heads_, size = tvm_compat.tensor_shape_dtype(written)[0]
        return R.reshape(written, (batch * sequence, heads_ * size))

    return make


def case_ids(pattern_names) -> list[tuple[str, str]]:
    """(pattern, activation) pairs: each pattern once, and each activation once per pattern that fuses one."""
    return [(name, activation) for name in pattern_names for activation in (ACTIVATIONS if name.endswith("_act") else ("relu",))]
