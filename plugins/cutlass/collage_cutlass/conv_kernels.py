"""CUTLASS 3 convolution kernels for Hopper (2-d forward, implicit GEMM over NHWC), as C++ sources.

A convolution ``y[n, p, q, k] = sum_{r, s, c} x[n, h, w, c] . w[k, r, s, c]`` is a GEMM whose M runs
over the output pixels (N x P x Q), N over the output channels K and K over the filter taps
(R x S x C); CUTLASS's implicit-GEMM mainloop gathers the activation tiles with TMA's im2col mode,
so nothing is unfolded in memory. Both operands are channel-last: the activation NHWC, the filter
KRSC (``OHWI``), each contiguous along C, the GEMM's K. The output is NHWC. The fused epilogue is the
GEMM kernels' (a bias per output channel, a residual as C with beta 1, one activation), in float32.

A :class:`ConvKind` and a :class:`~collage_cutlass.kernels.TileConfig` make a :class:`ConvKernel`;
sizes, padding, stride and dilation come with each call in the spec (conv_specs.py). Hopper's
convolutions run one schedule in CUTLASS 4.2 (TMA warp-specialized, not persistent), so the
configurations differ in tile and cluster only. The source includes ``runtime/conv_runner.h``,
which registers ``collage_cutlass.<name>`` and ``collage_cutlass.time.<name>`` with TVM FFI.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import attrs

from collage_cutlass.kernels import ACTIVATION_CODES, ELEMENTS, TYPE_CODES, TileConfig, epilogue_fusion, epilogue_name, tile_of

SCHEDULE = "warpspecialized"
# Broad tiles for ResNet's wide layers first, then the narrow ones that keep 132 SMs busy on its
# small late feature maps (7 x 7 pixels a batch).
CONV_TILE_CONFIGS = (
    TileConfig(SCHEDULE, (128, 128, 64), scheduler="none"),
    TileConfig(SCHEDULE, (128, 64, 64), scheduler="none"),
    TileConfig(SCHEDULE, (64, 128, 64), scheduler="none"),
    TileConfig(SCHEDULE, (64, 256, 64), scheduler="none"),  # one consumer warpgroup: 128x256 would not fit its registers
    TileConfig(SCHEDULE, (128, 128, 64), (2, 1), scheduler="none"),
    TileConfig(SCHEDULE, (64, 64, 64), scheduler="none"),
)


@attrs.frozen
class ConvKind:
    """What a convolution kernel computes: ``y = act(conv(x, w) + bias + residual)``, accumulating in float32.

    ``operand_dtype`` float32 is TF32, as for the GEMM kernels (both operands are K-major here, the
    layout TF32 WGMMA reads without a transpose).
    """

    operand_dtype: str
    out_dtype: str
    bias: bool
    residual: bool
    activation: Optional[str]

    op = "conv2d"
    configs = CONV_TILE_CONFIGS

    def words(self) -> tuple[int, ...]:
        """The spec words naming this kind, as the runtime checks them."""
        return (TYPE_CODES[self.operand_dtype], TYPE_CODES[self.out_dtype], int(self.bias), int(self.residual),
                ACTIVATION_CODES[self.activation])

    def describe(self) -> str:
        return f"conv2d {self.operand_dtype}->{self.out_dtype} nhwc {epilogue_name(self)}"

    def kernel(self, config: TileConfig) -> "ConvKernel":
        return ConvKernel(self, config)


@attrs.frozen
class ConvKernel:
    kind: ConvKind
    config: TileConfig

    runner = "conv_runner.h"

    @property
    def name(self) -> str:
        """The kernel's registered name: a digest of what it is and how it runs."""
        return "conv2d_" + hashlib.sha256(repr((self.kind, self.config)).encode()).hexdigest()[:16]

    def source(self) -> str:
        kind, config = self.kind, self.config
        element, out = ELEMENTS[kind.operand_dtype], ELEMENTS[kind.out_dtype]
        source, fusion = epilogue_fusion(kind)
        m, n, k = tile_of(kind, config)
        words = ", ".join(str(word) for word in kind.words())
        return f"""// Collage CUTLASS kernel {self.name}: {kind.describe()}, {config.name} (sm90).
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "cute/tensor.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"

#include "conv_runner.h"

namespace {{
using namespace cute;
using Element = {element};
using ElementOut = {out};
using ElementSource = {source};
using TileShape = Shape<_{m}, _{n}, Shape<_{k}>>;
using ClusterShape = Shape<_{config.cluster[0]}, _{config.cluster[1]}, _1>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    ElementSource, cutlass::layout::TensorNHWC, 16 / sizeof(ElementOut),
    ElementOut, cutlass::layout::TensorNHWC, 16 / sizeof(ElementOut),
    cutlass::epilogue::TmaWarpSpecialized,
    {fusion}>::CollectiveOp;
using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
    Element, cutlass::layout::TensorNHWC, 16 / sizeof(Element),
    Element, cutlass::layout::TensorNHWC, 16 / sizeof(Element),
    float, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, CollectiveMainloop::DispatchPolicy::NumSpatialDimensions>;
using ConvKernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<ConvKernel>;
}}  // namespace

COLLAGE_CUTLASS_REGISTER_CONV("{self.name}", Conv, {words})
"""
