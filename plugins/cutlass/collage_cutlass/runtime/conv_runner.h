// Running one CUTLASS 3 convolution kernel type for Collage's CUTLASS backend, registered as TVM FFI global functions.
//
// Each generated convolution source (collage_cutlass/conv_kernels.py) defines `Conv`, a CUTLASS 3
// ConvUniversalAdapter for a 2-d forward convolution on Hopper (implicit GEMM, TMA im2col, WGMMA) with
// its tile, cluster and fused epilogue fixed at compile time, and the words of the kind it serves, then
// includes this file. Sizes, padding, stride and dilation come with each call in the spec:
//     R.call_dps_packed("collage_cutlass.<kernel>", [spec, x, w, (bias), (residual)], y)
// computes y = act(conv(x, w) + bias + residual) with x NHWC, w KRSC, y and the residual NHWC (NPQK),
// accumulating in float32 and rounding once to y's type. `collage_cutlass.time.<kernel>(spec)` times it
// on scratch buffers as the GEMM runner's timing does. The helpers (spec text, dtype checks, the
// workspace, the hang deadline) are the GEMM runner's.
#pragma once

#include "gemm_runner.h"

namespace collage_cutlass::conv2d {

constexpr int64_t kSpecVersion = 1;
// Spec words; keep in step with collage_cutlass/conv_specs.py.
enum Word : int {
  kVersion, kOperandType, kOutputType, kHasBias, kHasResidual, kActivation,
  kN, kH, kW, kC, kK, kR, kS, kP, kQ, kPadTop, kPadLeft, kPadBottom, kPadRight, kStrideH, kStrideW, kDilationH, kDilationW,
  kWords
};

inline std::vector<int64_t> ParseSpec(const std::string& text) {
  if (text.size() != kWords * 16) Fail("a convolution spec of " + std::to_string(text.size()) + " hex digits, not " + std::to_string(kWords * 16));
  std::vector<uint8_t> bytes(kWords * 8);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  std::vector<int64_t> words(kWords);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (words[kVersion] != kSpecVersion) Fail("convolution spec version " + std::to_string(words[kVersion]) + ", this kernel reads " + std::to_string(kSpecVersion));
  return words;
}

struct ConvKind {
  int64_t operand_type, output_type, has_bias, has_residual, activation;
};

template <class Conv>
class ConvRunner {
 public:
  using Kernel = typename Conv::ConvKernel;
  using ProblemShape = typename Kernel::ProblemShape;
  using StrideC = typename Kernel::StrideC;
  using StrideD = typename Kernel::StrideD;

  explicit ConvRunner(const ConvKind& kind) : kind_(kind) {}

  void CheckKind(const std::vector<int64_t>& w) const {
    const int64_t wanted[] = {kind_.operand_type, kind_.output_type, kind_.has_bias, kind_.has_residual, kind_.activation};
    for (int i = 0; i < 5; ++i) {
      if (w[kOperandType + i] != wanted[i]) Fail("the spec asks for another kind of convolution kernel (word " + std::to_string(kOperandType + i) + ")");
    }
  }

  int Arity() const { return 3 + static_cast<int>(kind_.has_bias) + static_cast<int>(kind_.has_residual); }

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

  std::string Refusal(const typename Conv::Arguments& args) const {
    if (Conv::can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS cannot run this convolution kernel on this problem (can_implement)";
    if (Conv::get_workspace_size(args) > kWorkspaceBytes) return "the kernel needs more workspace than " + std::to_string(kWorkspaceBytes) + " bytes";
    return "";
  }

  void Prepare(Conv& conv, const typename Conv::Arguments& args, int device, cudaStream_t stream) const {
    std::string refusal = Refusal(args);
    if (!refusal.empty()) Fail(refusal);
    auto status = conv.initialize(args, Workspace(device), stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("initialize failed: ") + cutlassGetStatusString(status));
  }

  static void Run(Conv& conv, cudaStream_t stream) {
    auto status = conv.run(stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("launch failed: ") + cutlassGetStatusString(status));
  }

  void Launch(const std::vector<int64_t>& w, const void* x, const void* f, const void* bias, const void* residual, void* y,
              int device, cudaStream_t stream) const {
    CheckAligned(w, x, f, residual, y);
    Conv conv;
    Prepare(conv, Arguments(w, x, f, bias, residual, y, device), device, stream);
    Run(conv, stream);
    Check(cudaGetLastError(), "the kernel launch");
  }

 private:
  template <class Thread, class = void>
  struct TakesBias : std::false_type {};
  template <class Thread>
  struct TakesBias<Thread, std::void_t<decltype(std::declval<Thread&>().bias_ptr)>> : std::true_type {};

  template <class Args>
  static void SetBias(Args& args, const void* bias) {
    using Thread = std::remove_reference_t<decltype(args.epilogue.thread)>;
    if constexpr (TakesBias<Thread>::value) {
      args.epilogue.thread.bias_ptr = static_cast<decltype(args.epilogue.thread.bias_ptr)>(bias);
    }
  }

  ConvKind kind_;
};

template <class Conv>
void RunPacked(const ConvRunner<Conv>& runner, tvm::ffi::PackedArgs args) {
  if (args.size() < 2) Fail("a kernel call needs a spec and tensors");
  std::vector<int64_t> w = ParseSpec(SpecText(args[0]));
  runner.CheckKind(w);
  std::vector<DLTensor*> tensors;
  for (int i = 1; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
  if (static_cast<int>(tensors.size()) != runner.Arity()) {
    Fail("the kernel takes " + std::to_string(runner.Arity()) + " tensors but was passed " + std::to_string(tensors.size()));
  }
  DLTensor* out = tensors.back();
  if (out->device.device_type != kDLCUDA) Fail("the output is not on a CUDA device");
  int64_t elements = 1;
  for (int axis = 0; axis < out->ndim; ++axis) elements *= out->shape[axis];
  if (elements != w[kN] * w[kP] * w[kQ] * w[kK]) Fail("the output's size is not the one the spec names");
  int device = out->device.device_id;
  Check(cudaSetDevice(device), "cudaSetDevice");
  size_t at = 2;
  const void* bias = w[kHasBias] ? DataOf(tensors[at++], device, w[kOutputType]) : nullptr;
  const void* residual = w[kHasResidual] ? DataOf(tensors[at++], device, w[kOutputType]) : nullptr;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  runner.Launch(w, DataOf(tensors[0], device, w[kOperandType]), DataOf(tensors[1], device, w[kOperandType]), bias, residual,
                const_cast<void*>(DataOf(out, device, w[kOutputType])), device, stream);
}

// Median milliseconds of the kernel on scratch buffers for `spec`, kCannotRun or kHung, as the GEMM runner's Time.
template <class Conv>
double Time(const ConvRunner<Conv>& runner, const std::string& text) {
  std::vector<int64_t> w = ParseSpec(text);
  runner.CheckKind(w);
  Check(cudaSetDevice(0), "cudaSetDevice");
  if (!runner.Refusal(runner.Arguments(w, nullptr, nullptr, nullptr, nullptr, nullptr, 0)).empty()) return kCannotRun;
  int64_t in_bytes = BytesOf(w[kOperandType]), out_bytes = BytesOf(w[kOutputType]);
  int64_t x = w[kN] * w[kH] * w[kW] * w[kC], f = w[kK] * w[kR] * w[kS] * w[kC], y = w[kN] * w[kP] * w[kQ] * w[kK];
  void *x_ptr = nullptr, *f_ptr = nullptr, *bias_ptr = nullptr, *c_ptr = nullptr, *y_ptr = nullptr;
  Check(cudaMalloc(&x_ptr, x * in_bytes), "cudaMalloc");
  Check(cudaMalloc(&f_ptr, f * in_bytes), "cudaMalloc");
  Check(cudaMalloc(&y_ptr, y * out_bytes), "cudaMalloc");
  Check(cudaMemset(x_ptr, 0x3c, x * in_bytes), "cudaMemset");
  Check(cudaMemset(f_ptr, 0x3c, f * in_bytes), "cudaMemset");
  if (w[kHasBias]) {
    Check(cudaMalloc(&bias_ptr, w[kK] * out_bytes), "cudaMalloc");
    Check(cudaMemset(bias_ptr, 0, w[kK] * out_bytes), "cudaMemset");
  }
  if (w[kHasResidual]) {
    Check(cudaMalloc(&c_ptr, y * out_bytes), "cudaMalloc");
    Check(cudaMemset(c_ptr, 0, y * out_bytes), "cudaMemset");
  }
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  constexpr int kSamples = 23, kWarmUps = 3, kRepeats = 10;
  ConvRunner<Conv>::CheckAligned(w, x_ptr, f_ptr, c_ptr, y_ptr);
  Conv conv;
  runner.Prepare(conv, runner.Arguments(w, x_ptr, f_ptr, bias_ptr, c_ptr, y_ptr, 0), 0, stream);
  std::vector<float> times;
  for (int i = 0; i < kSamples; ++i) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int repeat = 0; repeat < kRepeats; ++repeat) ConvRunner<Conv>::Run(conv, stream);
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kHangSeconds);
    cudaError_t state;
    while ((state = cudaEventQuery(stop)) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) return kHung;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    Check(state, "the timed kernel");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i >= kWarmUps) times.push_back(ms / kRepeats);
  }
  for (void* p : {x_ptr, f_ptr, bias_ptr, c_ptr, y_ptr}) cudaFree(p);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace collage_cutlass::conv2d

// Registers `collage_cutlass.<NAME>` (the call) and `collage_cutlass.time.<NAME>` (the timing) for `Conv`.
#define COLLAGE_CUTLASS_REGISTER_CONV(NAME, CONV, ...)                                                             \
  TVM_FFI_STATIC_INIT_BLOCK() {                                                                                    \
    static const collage_cutlass::conv2d::ConvRunner<CONV> runner(collage_cutlass::conv2d::ConvKind{__VA_ARGS__}); \
    tvm::ffi::reflection::GlobalDef()                                                                              \
        .def_packed("collage_cutlass." NAME,                                                                       \
                    [](tvm::ffi::PackedArgs args, tvm::ffi::Any*) { collage_cutlass::conv2d::RunPacked(runner, args); }) \
        .def("collage_cutlass.time." NAME, [](tvm::ffi::String spec) {                                             \
          return collage_cutlass::conv2d::Time(runner, std::string(spec.data(), spec.size()));                    \
        });                                                                                                        \
  }
