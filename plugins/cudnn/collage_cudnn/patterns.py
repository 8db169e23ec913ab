"""The cuDNN backend's patterns: convolutions and batched products that cuDNN runs in float32, named ``cudnn.<what>``.

The dataflow patterns only shape the search; every match is then read by
:func:`collage_cudnn.specs.recognize`, which refuses what cuDNN would compute differently.
"""

from __future__ import annotations

import functools

from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, wildcard

from collage_core.kit import (
    FLOAT32,
    TF32_PATTERN_SUFFIX,
    Pattern,
    Refused,
    activation_pattern,
    bias_pattern,
    cast_pattern,
    fused_groups,
    recognizer_check,
    residual_pattern,
    scale_pattern,
)
from collage_cudnn import specs

BACKEND = "cudnn"
# What cuDNN 9.19 runs in float32 without tensor cores on an H200 (sm_90), as the GPU tests found:
# a convolution alone, with a bias, or with a bias and ReLU (its fused conv-bias-activation
# engine), and batched products of the tests' sizes. cuDNN has no float32 engine for a convolution
# with a residual add, GELU or SiLU, nor for a product with a constant right operand and a bias, and
# such products alone differed from PyTorch's by up to 1.7e-3 (TF32-like), so dense layers are left
# to cuBLAS. At a model's sizes the float32 batched products are refused too (FLOAT32_PRODUCTS): the
# recognizer reads more (specs.py); these patterns offer only what runs exactly.
CONV2D_EPILOGUES = {"": lambda v: v, "_bias": bias_pattern, "_bias_relu": lambda v: activation_pattern(bias_pattern(v), ["relu"])}
# With 16-bit operands (`--precision bf16|fp16`) TVM's mixed-precision pass casts each float32 result to
# 16 bits before the epilogue; cuDNN takes that cast (the convolution writes 16 bits). On the H200 (cuDNN
# 9.19, NCHW tensors) it offered no engine for such a convolution followed by a bias (CUDNN_STATUS_NOT_SUPPORTED
# for conv-cast-bias, -bias-ReLU, -bias-add and -bias-add-ReLU), so the bias and what follows stay with TVM.
SIXTEEN_BIT_CONV2D_EPILOGUES = {"_cast": cast_pattern}
# cuDNN's runtime-fusion engines take channel-last tensors, so a 16-bit NHWC convolution (`--layout nhwc`)
# is offered with its bias, residual add and ReLU as well; the check refuses these in NCHW.
CHANNEL_LAST_CONV2D_EPILOGUES = {
    "_nhwc_cast_bias": lambda v: bias_pattern(cast_pattern(v)),
    "_nhwc_cast_bias_relu": lambda v: activation_pattern(bias_pattern(cast_pattern(v)), ["relu"]),
    "_nhwc_cast_bias_add_relu": lambda v: activation_pattern(residual_pattern(bias_pattern(cast_pattern(v))), ["relu"]),
}
OPERAND_FORMS = {"n": lambda: wildcard(), "t": lambda: is_op("relax.permute_dims")(wildcard())}
# Why a batched product of float32 operands is not offered exactly. GPT-2's 24 attention products (8 x 12 heads of
# 128 x 64 by 64 x 128, and 128 x 128 by 128 x 64) placed on cuDNN at fp32 ran cuBLAS's CUTLASS TF32 tensor-core
# kernel (`cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4`, 24 calls per run in
# benchmarks/raw-torch-compile-cuda/profile-gpt2_b8_s128-fp32.txt) although the engines whose numerical notes
# name tensor cores are deselected (runtime/collage_cudnn.cc, CreatePlans). cuBLAS runs them in float32; at
# --precision tf32 the `_tf32` patterns still offer them.
FLOAT32_PRODUCTS = (
    "cuDNN's float32 batched products ran a TF32 tensor-core kernel at a model's sizes (GPT-2's attention on an "
    "H100): cuBLAS runs them in float32; --precision tf32 offers them as batch_matmul_tf32"
)


def _maybe(value, wrap):
    return wrap(value) | value


def attention_pattern(qkv: bool = False, bshd: bool = False):
    """``softmax(scores) @ v`` cast to 16 bits, the scores ``q @ k^T`` through the casts, scale (on the scores or
    on q and k) and additive mask the exporters write, a NaN guard after the softmax; the recognizer reads the rest.
    With ``qkv``, q, k and v are the three parts of one ``split`` (GPT-2's stacked projection), each split into heads
    and transposed; with ``bshd``, the result is transposed back to (batch, sequence, heads, size) and reshaped, as
    the next product reads it: the kernel reads and writes those layouts in place."""
    split = is_op("relax.split")(wildcard())

    def viewed(index):
        """q, k or v (``index``) as the product reads it."""
        if qkv:
            return is_op("relax.permute_dims")(fused_groups.reshape_pattern(is_tuple_get_item(split, index)))
        return is_op("relax.permute_dims")(wildcard()) | wildcard()

    def operand(index):
        plain = viewed(index)
        return scale_pattern(plain) | plain

    scores = is_op("relax.matmul")(operand(0), operand(1))
    scores = _maybe(_maybe(scores, cast_pattern), cast_pattern)
    scores = _maybe(scores, lambda v: scale_pattern(v) | is_op("relax.divide")(v, is_const()))
    scores = _maybe(_maybe(_maybe(scores, cast_pattern), bias_pattern), cast_pattern)
    probabilities = is_op("relax.nn.softmax")(scores)
    probabilities = _maybe(probabilities, lambda p: is_op("relax.where")(is_op("relax.isnan")(p), is_const(), p))
    probabilities = _maybe(_maybe(_maybe(probabilities, cast_pattern), cast_pattern), cast_pattern)
    result = cast_pattern(is_op("relax.matmul")(probabilities, viewed(2)))
    if not bshd:
        return result
    reshaped = fused_groups.reshape_pattern
    written = is_op("relax.permute_dims")(_maybe(result, reshaped))
    return _maybe(_maybe(written, reshaped), reshaped)


_check = recognizer_check(specs.recognize)


def _recognize_exact_product(group):
    """A batched product's spec when cuDNN computes it as the Relax program does: 16-bit operands only."""
    spec = specs.recognize(group)
    if spec.words[1] == specs.MATMUL and spec.words[-2] == specs.OPERAND_TYPES[FLOAT32]:
        raise Refused(FLOAT32_PRODUCTS)
    return spec


_check_exact_product = recognizer_check(_recognize_exact_product)
_check_tf32 = recognizer_check(functools.partial(specs.recognize, tf32=True))
_check_channel_last = recognizer_check(functools.partial(specs.recognize, channel_last=True))


def patterns(tf32: bool = False) -> list[Pattern]:
    """The exact patterns; with ``tf32`` also each float32 one again as ``<name>_tf32``, on engines that may use
    tensor cores (rounding the operands to TF32)."""
    found = []

    def add(name, dpl, sixteen_bit_only=False, check=_check):
        found.append(Pattern(f"{BACKEND}.{name}", dpl, check=check))
        if tf32 and not sixteen_bit_only:
            found.append(Pattern(f"{BACKEND}.{name}{TF32_PATTERN_SUFFIX}", dpl, check=_check_tf32))

    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    for suffix, epilogue in CONV2D_EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv))
    for suffix, epilogue in SIXTEEN_BIT_CONV2D_EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv), sixteen_bit_only=True)
    for suffix, epilogue in CHANNEL_LAST_CONV2D_EPILOGUES.items():
        add(f"conv2d{suffix}", epilogue(conv), sixteen_bit_only=True, check=_check_channel_last)
    for lhs_form, lhs in OPERAND_FORMS.items():
        for rhs_form, rhs in OPERAND_FORMS.items():
            forms = "" if lhs_form + rhs_form == "nn" else f"_{lhs_form}{rhs_form}"
            product = is_op("relax.matmul")(lhs(), rhs())
            # the cast only with 16-bit operands; float32 ones only as `_tf32` (FLOAT32_PRODUCTS)
            add(f"batch_matmul{forms}", product | cast_pattern(product), check=_check_exact_product)
    for qkv in (False, True):
        for bshd in (False, True):
            add("attention" + "_qkv" * qkv + "_bshd" * bshd, attention_pattern(qkv, bshd), sixteen_bit_only=True)
    return found
