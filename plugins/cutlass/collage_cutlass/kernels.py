"""CUTLASS 3 GEMM kernels for Hopper, as C++ sources instantiated from CUTLASS's templates.

A kernel is a :class:`KernelKind` (what it computes: operand and output types, operand layouts, the
fused epilogue) and a :class:`TileConfig` (how: CTA tile, cluster, warp-specialized schedule, tile
scheduler). Sizes, strides and the scale are not part of it: they come with each call in the spec
(specs.py), so one compiled kernel serves every problem of its kind. The source defines ``Gemm`` with
CUTLASS's collective builders and includes ``runtime/gemm_runner.h``, which registers
``collage_cutlass.<name>`` and ``collage_cutlass.time.<name>`` with TVM FFI.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import attrs

from collage_core.kit import Refused

ELEMENTS = {"bfloat16": "cutlass::bfloat16_t", "float16": "cutlass::half_t", "float32": "float"}
TYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}  # the runtime's Type enum
ACTIVATIONS = {None: "cutlass::epilogue::thread::Identity", "relu": "cutlass::epilogue::thread::ReLu",
               "gelu_erf": "cutlass::epilogue::thread::GELU", "gelu_tanh": "cutlass::epilogue::thread::GELU_taylor",
               "silu": "cutlass::epilogue::thread::SiLu"}
ACTIVATION_CODES = {name: code for code, name in enumerate(ACTIVATIONS)}
SCHEDULES = {  # kernel schedule and the epilogue schedule it pairs with
    "cooperative": ("cutlass::gemm::KernelTmaWarpSpecializedCooperative", "cutlass::epilogue::TmaWarpSpecializedCooperative"),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"),
}
TILE_SCHEDULERS = {"persistent": "cutlass::gemm::PersistentScheduler", "streamk": "cutlass::gemm::StreamKScheduler"}
OPERAND_ALIGNMENT_BYTES = 16  # TMA: every stride but the unit one a multiple of 16 bytes
OPERAND_DTYPES = ("bfloat16", "float16")  # and float32, as TF32
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def expect_kernel_operands(operand_dtype: str, tf32: bool) -> None:
    """Refuse operands the kernels do not take: 16-bit ones, or float32 ones on TF32 tensor cores (``tf32``) only."""
    if tf32 and operand_dtype != "float32":
        raise Refused("a TF32 kernel takes float32 operands")
    if operand_dtype == "float32" and not tf32:
        raise Refused("float32 operands: the CUTLASS kernels take bfloat16 or float16, or float32 as TF32 (--precision tf32)")


def epilogue_name(kind) -> str:
    """A kind's fused epilogue in words: ``bias+residual+relu``, or ``plain``."""
    return "+".join(part for part in ("bias" if kind.bias else "", "residual" if kind.residual else "",
                                      kind.activation or "") if part) or "plain"


def epilogue_fusion(kind) -> tuple[str, str]:
    """The C++ type of a kind's source operand C (``void`` without a residual: no source loads, no C
    descriptor) and of its epilogue's fusion: the bias per output column, then the activation."""
    out, activation = ELEMENTS[kind.out_dtype], ACTIVATIONS[kind.activation]
    source = out if kind.residual else "void"
    if kind.bias:
        return source, f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{activation}, {out}, float, {out}, {source}, float>"
    if kind.activation:
        return source, f"cutlass::epilogue::fusion::LinCombEltAct<{activation}, {out}, float, {source}, float>"
    return source, f"cutlass::epilogue::fusion::LinearCombination<{out}, float, {source}, float>"


def tile_of(kind, config) -> tuple[int, int, int]:
    """The configuration's CTA tile for ``kind``: TF32 halves the K tile (the same bytes as the 16-bit kernels')."""
    m, n, k = config.tile
    return (m, n, k // 2) if kind.operand_dtype == "float32" else (m, n, k)


@attrs.frozen
class KernelKind:
    """What a kernel computes: ``out = act(alpha * a . b + bias + residual)``, accumulating in float32.

    ``operand_dtype`` float32 is TF32: CUTLASS's builder maps float operands to TF32 WGMMA (rounding
    each operand's mantissa to 10 bits), transposing in shared memory what is not K-major.

    ``a_k_major``: the left operand's rows are contiguous along K (a row-major Relax operand), else
    along M (a transposed one). ``b_k_major``: the right operand is contiguous along K (a transposed
    Relax right operand, ``x @ Wᵀ``), else along N (a row-major ``K x N`` one).
    """

    operand_dtype: str
    out_dtype: str
    a_k_major: bool
    b_k_major: bool
    bias: bool
    residual: bool
    activation: Optional[str]

    def words(self) -> tuple[int, ...]:
        """The spec words naming this kind, as the runtime checks them."""
        return (TYPE_CODES[self.operand_dtype], TYPE_CODES[self.out_dtype], int(not self.a_k_major), int(not self.b_k_major),
                int(self.bias), int(self.residual), ACTIVATION_CODES[self.activation])

    op = "gemm"

    def describe(self) -> str:
        layouts = f"{'k' if self.a_k_major else 'm'}{'k' if self.b_k_major else 'n'}-major"
        return f"{self.operand_dtype}->{self.out_dtype} {layouts} {epilogue_name(self)}"

    @property
    def configs(self) -> tuple["TileConfig", ...]:
        return TILE_CONFIGS

    def kernel(self, config: "TileConfig") -> "Kernel":
        return Kernel(self, config)


@attrs.frozen
class TileConfig:
    """How a kernel runs: CTA tile (M, N, K), cluster (M, N), schedule and tile scheduler."""

    schedule: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int] = (1, 1)
    scheduler: str = "persistent"

    @property
    def name(self) -> str:
        m, n, k = self.tile
        return f"{self.schedule}_{m}x{n}x{k}_c{self.cluster[0]}x{self.cluster[1]}_{self.scheduler}"


# The configurations tuning tries for each problem, broad tiles for large products first, then the
# small tiles and stream-K that keep a Hopper's 132 SMs busy on BERT-sized products at batch 1.
TILE_CONFIGS = (
    TileConfig("cooperative", (128, 128, 64)),
    TileConfig("cooperative", (128, 256, 64)),
    TileConfig("cooperative", (128, 128, 64), (2, 1)),
    TileConfig("pingpong", (64, 128, 64)),
    TileConfig("pingpong", (64, 64, 64)),
    TileConfig("cooperative", (128, 64, 64), scheduler="streamk"),
)


@attrs.frozen
class Kernel:
    kind: KernelKind
    config: TileConfig

    runner = "gemm_runner.h"

    @property
    def name(self) -> str:
        """The kernel's registered name: a digest of what it is and how it runs."""
        return "gemm_" + hashlib.sha256(repr((self.kind, self.config)).encode()).hexdigest()[:16]

    def source(self) -> str:
        kind, config = self.kind, self.config
        element, out = ELEMENTS[kind.operand_dtype], ELEMENTS[kind.out_dtype]
        layout_a = "cutlass::layout::RowMajor" if kind.a_k_major else "cutlass::layout::ColumnMajor"
        layout_b = "cutlass::layout::ColumnMajor" if kind.b_k_major else "cutlass::layout::RowMajor"
        source, fusion = epilogue_fusion(kind)
        kernel_schedule, epilogue_schedule = SCHEDULES[config.schedule]
        m, n, k = tile_of(kind, config)
        words = ", ".join(str(word) for word in kind.words())
        return f"""// Collage CUTLASS kernel {self.name}: {kind.describe()}, {config.name} (sm90).
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

#include "gemm_runner.h"

namespace {{
using namespace cute;
using Element = {element};
using ElementOut = {out};
using ElementSource = {source};
using TileShape = Shape<_{m}, _{n}, _{k}>;
using ClusterShape = Shape<_{config.cluster[0]}, _{config.cluster[1]}, _1>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    ElementSource, cutlass::layout::RowMajor, 16 / sizeof(ElementOut),
    ElementOut, cutlass::layout::RowMajor, 16 / sizeof(ElementOut),
    {epilogue_schedule},
    {fusion}>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, {layout_a}, 16 / sizeof(Element),
    Element, {layout_b}, 16 / sizeof(Element),
    float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    {kernel_schedule}>::CollectiveOp;
using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, {TILE_SCHEDULERS[config.scheduler]}>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
}}  // namespace

COLLAGE_CUTLASS_REGISTER("{self.name}", Gemm, {words})
"""
