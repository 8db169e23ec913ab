// Running one CUTLASS 3 GEMM kernel type for Collage's CUTLASS backend, registered as TVM FFI global functions.
//
// Each generated kernel source (collage_cutlass/kernels.py) defines `Gemm`, a CUTLASS 3
// GemmUniversalAdapter for Hopper (TMA, warp-specialized, WGMMA) with its tile, cluster, schedule, operand
// layouts and fused epilogue fixed at compile time, and the words of the spec it serves, then includes this
// file. Sizes, strides and the scale come with each call in the spec, so one compiled kernel serves every
// shape of its kind:
//     R.call_dps_packed("collage_cutlass.<kernel>", [spec, lhs, rhs, (bias), (residual)], out)
// computes, for each batch b and outer batch o,
//     out[o][b] = act(alpha * lhs[o][b] . rhs[o][b] + bias + residual[o][b])
// accumulating in float32 and rounding once to the output's type. `collage_cutlass.time.<kernel>(spec)`
// times the kernel on scratch buffers for a spec and returns the median milliseconds, kCannotRun when
// the kernel cannot run that problem, or kHung when a launch was still running after kHangSeconds (the
// process's GPU is then taken by it). The packed call, workspace and timing loop are runner_common.h's.
// Stream-K kernels count their split tiles' arrivals in
// that workspace and never reset the counts, so it is zeroed before every launch (what `initialize`
// does on the call path; a replayed CUDA graph replays the zeroing too).
#pragma once

#include "runner_common.h"

namespace collage_cutlass {

constexpr int64_t kSpecVersion = 1;
// Spec words; keep in step with collage_cutlass/specs.py.
enum Word : int {
  kVersion, kOperandType, kOutputType, kLayoutA, kLayoutB, kHasBias, kHasResidual, kActivation,
  kM, kN, kK, kL, kLeadA, kBatchA, kLeadB, kBatchB, kLeadD, kBatchD, kOuter, kOuterA, kOuterB, kOuterD, kAlpha,
  kWords
};

inline double AlphaOf(const std::vector<int64_t>& words) {
  double alpha;
  std::memcpy(&alpha, &words[kAlpha], sizeof(alpha));
  return alpha;
}

// A stride of a CUTLASS 3 operand: the one dynamic leading stride among (rows, cols), and the batch stride.
template <class Stride>
Stride MakeStride(int64_t lead, int64_t batch) {
  Stride stride{};
  if constexpr (cute::is_static<std::remove_cv_t<std::remove_reference_t<decltype(cute::get<1>(stride))>>>::value) {
    cute::get<0>(stride) = lead;
  } else {
    cute::get<1>(stride) = lead;
  }
  cute::get<2>(stride) = batch;
  return stride;
}

// What the compiled kernel is, against what a spec asks for.
struct Kind {
  int64_t operand_type, output_type, layout_a, layout_b, has_bias, has_residual, activation;
};

template <class Gemm>
class Runner {
 public:
  using KindWords = Kind;
  using ElementA = typename Gemm::ElementA;
  using ElementD = typename Gemm::ElementD;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  static constexpr SpecFields kFields{kOperandType, kOutputType, kHasBias, kHasResidual};

  explicit Runner(const Kind& kind) : kind_(kind) {}

  static std::vector<int64_t> Words(const std::string& text) { return ParseWords(text, kWords, kSpecVersion, "a spec"); }

  void CheckKind(const std::vector<int64_t>& w) const {
    const int64_t wanted[] = {kind_.operand_type, kind_.output_type, kind_.layout_a, kind_.layout_b,
                              kind_.has_bias, kind_.has_residual, kind_.activation};
    for (int i = 0; i < 7; ++i) {
      if (w[kOperandType + i] != wanted[i]) Fail("the spec asks for another kind of kernel (word " + std::to_string(kOperandType + i) + ")");
    }
  }

  int Arity() const { return 3 + static_cast<int>(kind_.has_bias) + static_cast<int>(kind_.has_residual); }

  // The output's extent is the spec's strides' business (CheckAligned and the call's strides).
  void CheckOutput(const std::vector<int64_t>&, const DLTensor*) const {}

  // What TMA needs and CUTLASS's can_implement does not check (it sees the strides' static part only):
  // every non-unit stride and every base address a multiple of 16 bytes.
  static void CheckAligned(const std::vector<int64_t>& w, const void* a, const void* b, const void* residual, const void* d) {
    int64_t in_bytes = BytesOf(w[kOperandType]), out_bytes = BytesOf(w[kOutputType]);
    for (int word : {kLeadA, kBatchA, kOuterA, kLeadB, kBatchB, kOuterB}) {
      if (w[word] * in_bytes % 16) Fail("an operand stride of " + std::to_string(w[word]) + " elements is not a multiple of 16 bytes");
    }
    for (int word : {kLeadD, kBatchD, kOuterD}) {
      if (w[word] * out_bytes % 16) Fail("an output stride of " + std::to_string(w[word]) + " elements is not a multiple of 16 bytes");
    }
    for (const void* pointer : {a, b, residual, static_cast<const void*>(d)}) {
      if (reinterpret_cast<uintptr_t>(pointer) % 16) Fail("a tensor whose address is not a multiple of 16 bytes");
    }
  }

  typename Gemm::Arguments Arguments(const std::vector<int64_t>& w, int64_t outer, const void* a, const void* b,
                                     const void* bias, const void* residual, void* d, int device) const {
    const char* a_bytes = static_cast<const char*>(a) + outer * w[kOuterA] * BytesOf(w[kOperandType]);
    const char* b_bytes = static_cast<const char*>(b) + outer * w[kOuterB] * BytesOf(w[kOperandType]);
    int64_t d_offset = outer * w[kOuterD] * BytesOf(w[kOutputType]);
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = device;
    hw_info.sm_count = SmCount(device);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(w[kM]), static_cast<int>(w[kN]), static_cast<int>(w[kK]), static_cast<int>(w[kL])},
        {reinterpret_cast<const ElementA*>(a_bytes), MakeStride<StrideA>(w[kLeadA], w[kBatchA]),
         reinterpret_cast<const typename Gemm::ElementB*>(b_bytes), MakeStride<StrideB>(w[kLeadB], w[kBatchB])},
        {{},
         residual ? reinterpret_cast<const typename Gemm::ElementC*>(static_cast<const char*>(residual) + d_offset) : nullptr,
         MakeStride<StrideC>(w[kLeadD], w[kBatchD]),
         reinterpret_cast<ElementD*>(static_cast<char*>(d) + d_offset), MakeStride<StrideD>(w[kLeadD], w[kBatchD])},
        hw_info};
    args.epilogue.thread.alpha = static_cast<float>(AlphaOf(w));
    args.epilogue.thread.beta = residual ? 1.0f : 0.0f;
    SetBias(args, bias);
    return args;
  }

  // Zeroes what the kernel keeps in the workspace across its blocks (stream-K's arrival counts), as
  // `initialize` does; a kernel without workspace needs nothing.
  static void ResetWorkspace(const typename Gemm::Arguments& args, int device, cudaStream_t stream) {
    if (Gemm::get_workspace_size(args) == 0) return;
    auto status = Gemm::GemmKernel::initialize_workspace(args, Workspace(device), stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("zeroing the workspace failed: ") + cutlassGetStatusString(status));
  }

  void Launch(const std::vector<int64_t>& w, const void* a, const void* b, const void* bias, const void* residual, void* d,
              int device, cudaStream_t stream) const {
    CheckAligned(w, a, b, residual, d);
    for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
      Gemm gemm;
      Prepare(gemm, Arguments(w, outer, a, b, bias, residual, d, device), "GEMM", device, stream);
      Run(gemm, stream);
    }
    Check(cudaGetLastError(), "the kernel launch");
  }

 private:
  Kind kind_;
};

// The extent in elements of a strided operand: the farthest element it reaches, plus one.
inline int64_t Extent(int64_t rows, int64_t cols, int64_t lead, bool rows_lead, int64_t batch, int64_t batch_stride,
                      int64_t outer, int64_t outer_stride) {
  int64_t last = (rows_lead ? (rows - 1) * lead + (cols - 1) : (rows - 1) + (cols - 1) * lead);
  return last + (batch - 1) * batch_stride + (outer - 1) * outer_stride + 1;
}

// Median milliseconds of the kernel on scratch buffers for `spec`, kCannotRun when it cannot run it, or
// kHung when a launch did not finish within kHangSeconds. The kernels alone, as a replayed CUDA graph runs
// them: parameters built once per outer batch before timing (the host's set-up does not count).
template <class Gemm>
double Time(const Runner<Gemm>& runner, const std::string& text) {
  std::vector<int64_t> w = Runner<Gemm>::Words(text);
  runner.CheckKind(w);
  Check(cudaSetDevice(0), "cudaSetDevice");
  if (!Refusal<Gemm>(runner.Arguments(w, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0), "GEMM").empty()) return kCannotRun;
  // A is M x K (rows lead when K-major), B is N x K (rows lead when K-major), D is M x N, rows leading.
  int64_t a = Extent(w[kM], w[kK], w[kLeadA], w[kLayoutA] == 0, w[kL], w[kBatchA], w[kOuter], w[kOuterA]);
  int64_t b = Extent(w[kN], w[kK], w[kLeadB], w[kLayoutB] == 0, w[kL], w[kBatchB], w[kOuter], w[kOuterB]);
  int64_t d = Extent(w[kM], w[kN], w[kLeadD], true, w[kL], w[kBatchD], w[kOuter], w[kOuterD]);
  Scratch scratch;
  TimingBuffers t = TakeTimingBuffers(scratch, w, Runner<Gemm>::kFields, a, b, d, w[kN]);
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Runner<Gemm>::CheckAligned(w, t.operand0, t.operand1, t.residual, t.out);
  std::vector<Gemm> gemms(w[kOuter]);
  std::vector<typename Gemm::Arguments> arguments;
  for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
    arguments.push_back(runner.Arguments(w, outer, t.operand0, t.operand1, t.bias, t.residual, t.out, 0));
    Prepare(gemms[outer], arguments.back(), "GEMM", 0, stream);
  }
  double ms = MedianMilliseconds(stream, [&] {
    for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
      Runner<Gemm>::ResetWorkspace(arguments[outer], 0, stream);
      Run(gemms[outer], stream);
    }
  });
  if (ms == kHung) return kHung;  // its buffers stay allocated, as the kernel may still use them
  scratch.Release();
  cudaStreamDestroy(stream);
  return ms;
}

}  // namespace collage_cutlass

// Registers `collage_cutlass.<NAME>` (the call) and `collage_cutlass.time.<NAME>` (the timing) for `Gemm`.
#define COLLAGE_CUTLASS_REGISTER(NAME, GEMM, ...) \
  COLLAGE_CUTLASS_REGISTER_RUNNER(NAME, collage_cutlass::Runner<GEMM>, collage_cutlass::Time, __VA_ARGS__)
