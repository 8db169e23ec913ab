"""The precisions a placement may run at, by name, the 16-bit dtypes they convert a model to, and how a
pattern says it computes in TF32."""

FP32, TF32, BF16, FP16 = "fp32", "tf32", "bf16", "fp16"
PRECISIONS = (FP32, TF32, BF16, FP16)
DTYPES = {BF16: "bfloat16", FP16: "float16"}
TF32_PATTERN_SUFFIX = "_tf32"  # how a backend names a float32 pattern whose kernels use TF32 tensor cores


def computes_tf32(pattern_name: str) -> bool:
    """Whether a pattern's kernels round float32 operands to TF32 (contributed only at ``--precision tf32``).

    Such a pattern is named apart from the backend's exact one (``<backend>.<what>_tf32``), so its
    measured costs, keyed by pattern name, never stand for the exact kernels', and the lowering
    reads from the partition's pattern name which kernel to make.
    """
    return pattern_name.endswith(TF32_PATTERN_SUFFIX)
