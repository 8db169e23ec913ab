"""ResNet-50's 53 convolutions on cuDNN (through PyTorch), NCHW against NHWC, at each precision and batch.

    python benchmarks/conv_layout.py [--batches 1,8] [--precisions fp32,bf16,fp16]

ONNX models write convolutions NCHW; tensor-core convolutions are built for NHWC. This table says what
the layout costs, summed over ResNet-50's convolutions at 224x224 (each timed alone with CUDA events,
median of 5 rounds of 100 calls, cuDNN's autotuner on, TF32 off): the measurement behind
``collage optimize --layout auto`` (NHWC at 16 bits on CUDA). Needs PyTorch with CUDA.
"""

from __future__ import annotations

import argparse
import statistics

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resnet50_convolutions() -> list[tuple[int, int, int, int, int]]:
    """(in channels, out channels, kernel, stride, input height) of each convolution of ResNet-50 at 224."""
    convs = [(3, 64, 7, 2, 224)]
    size = 56
    for in_channels, middle, out_channels, blocks, stride in [
        (64, 64, 256, 3, 1),
        (256, 128, 512, 4, 2),
        (512, 256, 1024, 6, 2),
        (1024, 512, 2048, 3, 2),
    ]:
        for block in range(blocks):
            step = stride if block == 0 else 1
            source = in_channels if block == 0 else out_channels
            convs += [(source, middle, 1, 1, size), (middle, middle, 3, step, size), (middle, out_channels, 1, 1, size // step)]
            if block == 0:
                convs.append((source, out_channels, 1, step, size))
            size //= step
    return convs


def time_ms(torch, call, calls: int = 100, rounds: int = 5) -> float:
    for _ in range(10):
        call()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def summed_ms(torch, batch: int, dtype, channels_last: bool) -> float:
    import torch.nn.functional as F

    total = 0.0
    for in_channels, out_channels, kernel, stride, size in resnet50_convolutions():
        x = torch.randn(batch, in_channels, size, size, device="cuda", dtype=dtype)
        w = torch.randn(out_channels, in_channels, kernel, kernel, device="cuda", dtype=dtype)
        if channels_last:
            x, w = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
        total += time_ms(torch, lambda: F.conv2d(x, w, stride=stride, padding=kernel // 2))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--precisions", default="fp32,bf16,fp16")
    args = parser.parse_args()
    import torch

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}, cuDNN {torch.backends.cudnn.version()}, {len(resnet50_convolutions())} convolutions")
    print("| batch | precision | NCHW (ms) | NHWC (ms) | NCHW / NHWC |")
    print("|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        for name in args.precisions.split(","):
            dtype = getattr(torch, DTYPES[name])
            nchw, nhwc = summed_ms(torch, batch, dtype, False), summed_ms(torch, batch, dtype, True)
            print(f"| {batch} | {name} | {nchw:.3f} | {nhwc:.3f} | {nchw / nhwc:.2f} |", flush=True)


if __name__ == "__main__":
    main()
