"""The precisions a placement may run at, by name, and the 16-bit dtypes they convert a model to."""

FP32, TF32, BF16, FP16 = "fp32", "tf32", "bf16", "fp16"
PRECISIONS = (FP32, TF32, BF16, FP16)
DTYPES = {BF16: "bfloat16", FP16: "float16"}
