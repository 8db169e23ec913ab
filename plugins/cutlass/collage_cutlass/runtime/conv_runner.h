// Running one CUTLASS 3 convolution kernel type for Collage's CUTLASS backend, registered as TVM FFI global functions.
//
// Each generated convolution source (collage_cutlass/conv_kernels.py) defines `Conv`, a CUTLASS 3
// ConvUniversalAdapter for a 2-d forward convolution on Hopper (implicit GEMM, TMA im2col, WGMMA) with
// its tile, cluster and fused epilogue fixed at compile time, and the words of the kind it serves, then
// includes this file. Sizes, padding, stride and dilation come with each call in the spec:
//     R.call_dps_packed("collage_cutlass.<kernel>", [spec, x, w, (bias), (residual)], y)
// computes y = act(conv(x, w) + bias + residual) with x NHWC, w KRSC, y and the residual NHWC (NPQK),
// accumulating in float32 and rounding once to y's type. `collage_cutlass.time.<kernel>(spec)` times it
// on scratch buffers as the GEMM runner's timing does. The packed call, workspace and timing loop are
// runner_common.h's.
#pragma once

#include "runner_common.h"

namespace collage_cutlass::conv2d {

constexpr int64_t kSpecVersion = 1;
// Spec words; keep in step with collage_cutlass/conv_specs.py.
enum Word : int {
  kVersion, kOperandType, kOutputType, kHasBias, kHasResidual, kActivation,
  kN, kH, kW, kC, kK, kR, kS, kP, kQ, kPadTop, kPadLeft, kPadBottom, kPadRight, kStrideH, kStrideW, kDilationH, kDilationW,
  kWords
};

struct ConvKind {
  int64_t operand_type, output_type, has_bias, has_residual, activation;
};

template <class Conv>
class ConvRunner {
 public:
  using KindWords = ConvKind;
  using Kernel = typename Conv::ConvKernel;
  using ProblemShape = typename Kernel::ProblemShape;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;
  static constexpr SpecFields kFields{kOperandType, kOutputType, kHasBias, kHasResidual};

  explicit ConvRunner(const ConvKind& kind) : kind_(kind) {}

  static std::vector<int64_t> Words(const std::string& text) { return ParseWords(text, kWords, kSpecVersion, "a convolution spec"); }

  void CheckKind(const std::vector<int64_t>& w) const {
    const int64_t wanted[] = {kind_.operand_type, kind_.output_type, kind_.has_bias, kind_.has_residual, kind_.activation};
    for (int i = 0; i < 5; ++i) {
      if (w[kOperandType + i] != wanted[i]) Fail("the spec asks for another kind of convolution kernel (word " + std::to_string(kOperandType + i) + ")");
    }
  }

  int Arity() const { return 3 + static_cast<int>(kind_.has_bias) + static_cast<int>(kind_.has_residual); }

  void CheckOutput(const std::vector<int64_t>& w, const DLTensor* out) const {
    int64_t elements = 1;
    for (int axis = 0; axis < out->ndim; ++axis) elements *= out->shape[axis];
    if (elements != w[kN] * w[kP] * w[kQ] * w[kK]) Fail("the output's size is not the one the spec names");
  }

  static ProblemShape Problem(const std::vector<int64_t>& w) {
    auto i = [&](int word) { return static_cast<int>(w[word]); };
    return ProblemShape(cutlass::conv::Mode::kCrossCorrelation, {i(kN), i(kH), i(kW), i(kC)}, {i(kK), i(kR), i(kS), i(kC)},
                        {i(kPadTop), i(kPadLeft)}, {i(kPadBottom), i(kPadRight)}, {i(kStrideH), i(kStrideW)},
                        {i(kDilationH), i(kDilationW)}, 1);
  }

  // TMA's 16-byte rule: channels (the unit-stride mode of x, w and y) a multiple of 16 bytes, and every base
  // address; and its im2col element strides of 1 to 8, which CUTLASS's can_implement does not check.
  static void CheckAligned(const std::vector<int64_t>& w, const void* x, const void* f, const void* residual, const void* y) {
    for (int word : {kStrideH, kStrideW}) {
      if (w[word] < 1 || w[word] > 8) Fail("a convolution stride of " + std::to_string(w[word]) + " (TMA im2col takes 1 to 8)");
    }
    if (w[kC] * BytesOf(w[kOperandType]) % 16) Fail(std::to_string(w[kC]) + " input channels are not a multiple of 16 bytes");
    if (w[kK] * BytesOf(w[kOutputType]) % 16) Fail(std::to_string(w[kK]) + " output channels are not a multiple of 16 bytes");
    for (const void* pointer : {x, f, residual, y}) {
      if (reinterpret_cast<uintptr_t>(pointer) % 16) Fail("a tensor whose address is not a multiple of 16 bytes");
    }
  }

  typename Conv::Arguments Arguments(const std::vector<int64_t>& w, const void* x, const void* f, const void* bias,
                                     const void* residual, void* y, int device) const {
    ProblemShape problem = Problem(w);
    StrideC stride_c{};
    StrideD stride_d{};
    cute::for_each(cute::make_seq<cute::rank<0>(StrideC{})>{}, [&](auto i) {
      cute::get<0, i>(stride_c) = problem.stride_C[ProblemShape::RankT - 2 - i];
    });
    cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_d) = problem.stride_C[ProblemShape::RankT - 2 - i];
    });
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = device;
    hw_info.sm_count = SmCount(device);
    typename Conv::Arguments args{
        problem,
        {reinterpret_cast<const typename Conv::ElementA*>(x), reinterpret_cast<const typename Conv::ElementB*>(f)},
        {{}, reinterpret_cast<const typename Conv::ElementC*>(residual), stride_c, reinterpret_cast<typename Conv::ElementD*>(y), stride_d},
        hw_info};
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = residual ? 1.0f : 0.0f;
    SetBias(args, bias);
    return args;
  }

  void Launch(const std::vector<int64_t>& w, const void* x, const void* f, const void* bias, const void* residual, void* y,
              int device, cudaStream_t stream) const {
    CheckAligned(w, x, f, residual, y);
    Conv conv;
    Prepare(conv, Arguments(w, x, f, bias, residual, y, device), "convolution", device, stream);
    Run(conv, stream);
    Check(cudaGetLastError(), "the kernel launch");
  }

 private:
  ConvKind kind_;
};

// Median milliseconds of the kernel on scratch buffers for `spec`, kCannotRun or kHung, as the GEMM runner's Time.
template <class Conv>
double Time(const ConvRunner<Conv>& runner, const std::string& text) {
  std::vector<int64_t> w = ConvRunner<Conv>::Words(text);
  runner.CheckKind(w);
  Check(cudaSetDevice(0), "cudaSetDevice");
  if (!Refusal<Conv>(runner.Arguments(w, nullptr, nullptr, nullptr, nullptr, nullptr, 0), "convolution").empty()) return kCannotRun;
  int64_t x = w[kN] * w[kH] * w[kW] * w[kC], f = w[kK] * w[kR] * w[kS] * w[kC], y = w[kN] * w[kP] * w[kQ] * w[kK];
  Scratch scratch;
  TimingBuffers t = TakeTimingBuffers(scratch, w, ConvRunner<Conv>::kFields, x, f, y, w[kK]);
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  ConvRunner<Conv>::CheckAligned(w, t.operand0, t.operand1, t.residual, t.out);
  Conv conv;
  Prepare(conv, runner.Arguments(w, t.operand0, t.operand1, t.bias, t.residual, t.out, 0), "convolution", 0, stream);
  double ms = MedianMilliseconds(stream, [&] { Run(conv, stream); });
  if (ms == kHung) return kHung;  // its buffers stay allocated, as the kernel may still use them
  scratch.Release();
  cudaStreamDestroy(stream);
  return ms;
}

}  // namespace collage_cutlass::conv2d

// Registers `collage_cutlass.<NAME>` (the call) and `collage_cutlass.time.<NAME>` (the timing) for `Conv`.
#define COLLAGE_CUTLASS_REGISTER_CONV(NAME, CONV, ...)                                                   \
  COLLAGE_CUTLASS_REGISTER_RUNNER(NAME, collage_cutlass::conv2d::ConvRunner<CONV>, collage_cutlass::conv2d::Time, \
                                  __VA_ARGS__)
