"""The peak arithmetic rate of the GPUs Collage is measured on, and the fraction of it a latency reaches.

Peaks are NVIDIA's datasheet figures, in TFLOP/s (10^12 floating-point operations per second):

- fp32: the CUDA cores' float32 rate (no tensor cores; Collage's fp32 keeps TF32 off);
- tf32, bf16, fp16: the tensor cores' dense rate. The datasheets give these with 2:4 structured sparsity
  (marked "*", "Shown with sparsity. Specifications 1/2 lower without sparsity."), so the figures here are half
  of theirs.

The GPU is known by the name its driver reports, which Collage records in every cost key and placement
(``cuda:sm_90a (NVIDIA H200, compute capability 9.0, ...)``, :func:`collage_core.tvm_compat.device_name`).
A device not in the table (a CPU, another GPU, an H100 or H200 NVL) has no peak here.
"""

from __future__ import annotations

import re
from typing import Optional

import attrs

from collage_core.outputs.flops import COUNTED

H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/h100/")
H200_DATASHEET = ("NVIDIA H200 Tensor Core GPU datasheet", "https://www.nvidia.com/en-us/data-center/h200/")

# GPU: ({precision: dense TFLOP/s}, (source, URL)). H200 (SXM) has the H100 SXM's GH100 die and clocks.
PEAK_TFLOPS = {
    "H100 SXM": ({"fp32": 67.0, "tf32": 989 / 2, "bf16": 1979 / 2, "fp16": 1979 / 2}, H100_DATASHEET),
    "H100 PCIe": ({"fp32": 51.0, "tf32": 756 / 2, "bf16": 1513 / 2, "fp16": 1513 / 2}, H100_DATASHEET),
    "H200": ({"fp32": 67.0, "tf32": 989 / 2, "bf16": 1979 / 2, "fp16": 1979 / 2}, H200_DATASHEET),
}
UNITS = {"fp32": "fp32 (CUDA cores)", "tf32": "TF32 dense tensor-core", "bf16": "bf16 dense tensor-core", "fp16": "fp16 dense tensor-core"}


@attrs.frozen
class Peak:
    gpu: str
    precision: str
    tflops: float
    source: str
    url: str

    def describe(self) -> str:
        """``the H200's 67 TFLOP/s fp32 (CUDA cores) peak (NVIDIA H200 Tensor Core GPU datasheet, https://...)``."""
        return f"the {self.gpu}'s {self.tflops:g} TFLOP/s {UNITS[self.precision]} peak ({self.source}, {self.url})"


def gpu_name(device: str) -> str:
    """The GPU's name as its driver reports it (``NVIDIA H200``) from a device as Collage records it, or ""."""
    found = re.search(r"\((.*?), compute capability", device)
    return found.group(1) if found else ""


def gpu_model(name: str) -> Optional[str]:
    """The row of :data:`PEAK_TFLOPS` for a driver's GPU name, or None: ``NVIDIA H100 80GB HBM3`` is the SXM
    board, ``NVIDIA H100 PCIe`` the PCIe card, ``NVIDIA H200`` the SXM board; NVL boards and the Grace
    superchips (GH200) have other clocks and are not in the table."""
    if "NVL" in name or "GH200" in name:
        return None
    if re.search(r"\bH200\b", name):
        return "H200"
    if re.search(r"\bH100\b", name):
        if "PCIe" in name:
            return "H100 PCIe"
        if "HBM3" in name or "SXM" in name:
            return "H100 SXM"
    return None


def peak_of(device: str, precision: str) -> Optional[Peak]:
    """The peak of ``device`` (as Collage records it) at ``precision``, or None where it is not known."""
    model = gpu_model(gpu_name(device))
    if model is None:
        return None
    rates, (source, url) = PEAK_TFLOPS[model]
    return Peak(model, precision, rates[precision], source, url) if precision in rates else None


@attrs.frozen
class Throughput:
    """FLOPs of one run over its measured latency, beside the device's peak at the run's precision."""

    flops: int
    seconds: float
    device: str
    precision: str
    peak: Optional[Peak] = None

    @property
    def tflops(self) -> float:
        return self.flops / self.seconds / 1e12

    @property
    def fraction_of_peak(self) -> Optional[float]:
        return None if self.peak is None else self.tflops / self.peak.tflops

    def describe(self) -> str:
        """``12.3 GFLOP per run (...): 4.60 TFLOP/s, 6.9% of the H200's 67 TFLOP/s fp32 (CUDA cores) peak (...)``."""
        text = f"{_si(self.flops)}FLOP per run ({COUNTED}): {_si(self.flops / self.seconds)}FLOP/s"
        if self.peak is None:
            return text + f", peak of {gpu_name(self.device) or self.device} unknown"
        return text + f", {100 * self.fraction_of_peak:.1f}% of {self.peak.describe()}"

    def to_json(self) -> dict:
        return {
            "flops": self.flops,
            "seconds": self.seconds,
            "tflops": self.tflops,
            "device": self.device,
            "precision": self.precision,
            "fraction_of_peak": self.fraction_of_peak,
            "peak": None if self.peak is None else attrs.asdict(self.peak),
        }


def _si(value: float) -> str:
    """``12.3 G``, ``4.60 T``, ``850.0 M``: three significant figures or more, with an SI prefix."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.{2 if prefix == 'T' else 1}f} {prefix}"
    return f"{value:.0f} "


def throughput(flops: int, seconds: float, device: str, precision: str) -> Throughput:
    return Throughput(flops, seconds, device, precision, peak_of(device, precision))
