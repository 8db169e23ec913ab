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
// process's GPU is then taken by it). No Python runs on the call path. One workspace per device serves
// every kernel: calls on one stream (TVM's) only. Stream-K kernels count their split tiles' arrivals in
// that workspace and never reset the counts, so it is zeroed before every launch (what `initialize`
// does on the call path; a replayed CUDA graph replays the zeroing too).
#pragma once

#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"

namespace collage_cutlass {

constexpr int64_t kSpecVersion = 1;
constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr double kCannotRun = -1.0, kHung = -2.0;
constexpr int kHangSeconds = 10;
// Spec words; keep in step with collage_cutlass/specs.py.
enum Word : int {
  kVersion, kOperandType, kOutputType, kLayoutA, kLayoutB, kHasBias, kHasResidual, kActivation,
  kM, kN, kK, kL, kLeadA, kBatchA, kLeadB, kBatchB, kLeadD, kBatchD, kOuter, kOuterA, kOuterB, kOuterD, kAlpha,
  kWords
};
enum Type : int64_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

[[noreturn]] inline void Fail(const std::string& message) {
  TVM_FFI_THROW(RuntimeError) << "collage_cutlass: " << message;
  __builtin_unreachable();  // the throw is in the builder's destructor
}

inline void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

inline int64_t BytesOf(int64_t type) { return type == kF32 ? 4 : 2; }

// The spec's words from their host string (hex of little-endian int64 words).
inline std::vector<int64_t> ParseSpec(const std::string& text) {
  if (text.size() != kWords * 16) Fail("a spec of " + std::to_string(text.size()) + " hex digits, not " + std::to_string(kWords * 16));
  std::vector<uint8_t> bytes(kWords * 8);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  std::vector<int64_t> words(kWords);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (words[kVersion] != kSpecVersion) Fail("spec version " + std::to_string(words[kVersion]) + ", this kernel reads " + std::to_string(kSpecVersion));
  return words;
}

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

inline void* Workspace(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, void*> buffers;
  std::lock_guard<std::mutex> lock(mutex);
  void*& buffer = buffers[device];
  if (buffer == nullptr) Check(cudaMalloc(&buffer, kWorkspaceBytes), "cudaMalloc of the workspace");
  return buffer;
}

inline int SmCount(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, int> counts;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = counts.find(device);
  if (found != counts.end()) return found->second;
  int count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  counts[device] = count;
  return count;
}

// What the compiled kernel is, against what a spec asks for.
struct Kind {
  int64_t operand_type, output_type, layout_a, layout_b, has_bias, has_residual, activation;
};

template <class Gemm>
class Runner {
 public:
  using ElementA = typename Gemm::ElementA;
  using ElementD = typename Gemm::ElementD;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;

  explicit Runner(const Kind& kind) : kind_(kind) {}

  void CheckKind(const std::vector<int64_t>& w) const {
    const int64_t wanted[] = {kind_.operand_type, kind_.output_type, kind_.layout_a, kind_.layout_b,
                              kind_.has_bias, kind_.has_residual, kind_.activation};
    for (int i = 0; i < 7; ++i) {
      if (w[kOperandType + i] != wanted[i]) Fail("the spec asks for another kind of kernel (word " + std::to_string(kOperandType + i) + ")");
    }
  }

  int Arity() const { return 3 + static_cast<int>(kind_.has_bias) + static_cast<int>(kind_.has_residual); }

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

  // Why the kernel cannot run this problem, or "".
  std::string Refusal(const typename Gemm::Arguments& args) const {
    if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS cannot run this kernel on this problem (can_implement)";
    if (Gemm::get_workspace_size(args) > kWorkspaceBytes) return "the kernel needs more workspace than " + std::to_string(kWorkspaceBytes) + " bytes";
    return "";
  }

  // A Gemm ready to run one outer batch: its arguments checked and its parameters (TMA descriptors) built.
  void Prepare(Gemm& gemm, const std::vector<int64_t>& w, int64_t outer, const void* a, const void* b, const void* bias,
               const void* residual, void* d, int device, cudaStream_t stream) const {
    auto args = Arguments(w, outer, a, b, bias, residual, d, device);
    std::string refusal = Refusal(args);
    if (!refusal.empty()) Fail(refusal);
    auto status = gemm.initialize(args, Workspace(device), stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("initialize failed: ") + cutlassGetStatusString(status));
  }

  // Zeroes what the kernel keeps in the workspace across its blocks (stream-K's arrival counts), as
  // `initialize` does; a kernel without workspace needs nothing.
  static void ResetWorkspace(const typename Gemm::Arguments& args, int device, cudaStream_t stream) {
    if (Gemm::get_workspace_size(args) == 0) return;
    auto status = Gemm::GemmKernel::initialize_workspace(args, Workspace(device), stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("zeroing the workspace failed: ") + cutlassGetStatusString(status));
  }

  static void Run(Gemm& gemm, cudaStream_t stream) {
    auto status = gemm.run(stream);
    if (status != cutlass::Status::kSuccess) Fail(std::string("launch failed: ") + cutlassGetStatusString(status));
  }

  void Launch(const std::vector<int64_t>& w, const void* a, const void* b, const void* bias, const void* residual, void* d,
              int device, cudaStream_t stream) const {
    CheckAligned(w, a, b, residual, d);
    for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
      Gemm gemm;
      Prepare(gemm, w, outer, a, b, bias, residual, d, device, stream);
      Run(gemm, stream);
    }
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

  Kind kind_;
};

// `tensor`'s data, which must be on `device` and of `type`.
inline const void* DataOf(const DLTensor* tensor, int device, int64_t type) {
  if (tensor->device.device_type != kDLCUDA || tensor->device.device_id != device) {
    Fail("every operand must be on the same CUDA device as the output");
  }
  bool fits = tensor->dtype.lanes == 1 &&
              (type == kF32    ? tensor->dtype.code == kDLFloat && tensor->dtype.bits == 32
               : type == kBf16 ? tensor->dtype.code == kDLBfloat && tensor->dtype.bits == 16
                               : tensor->dtype.code == kDLFloat && tensor->dtype.bits == 16);
  if (!fits) Fail("a tensor's dtype is not the one the spec names");
  return static_cast<const char*>(tensor->data) + tensor->byte_offset;
}

inline std::string SpecText(const tvm::ffi::AnyView& arg) {
  auto text = arg.cast<tvm::ffi::String>();
  return std::string(text.data(), text.size());
}

template <class Gemm>
void RunPacked(const Runner<Gemm>& runner, tvm::ffi::PackedArgs args) {
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
  int device = out->device.device_id;
  Check(cudaSetDevice(device), "cudaSetDevice");
  size_t at = 2;
  const void* bias = w[kHasBias] ? DataOf(tensors[at++], device, w[kOutputType]) : nullptr;
  const void* residual = w[kHasResidual] ? DataOf(tensors[at++], device, w[kOutputType]) : nullptr;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  runner.Launch(w, DataOf(tensors[0], device, w[kOperandType]), DataOf(tensors[1], device, w[kOperandType]), bias, residual,
                const_cast<void*>(DataOf(out, device, w[kOutputType])), device, stream);
}

// The extent in elements of a strided operand: the farthest element it reaches, plus one.
inline int64_t Extent(int64_t rows, int64_t cols, int64_t lead, bool rows_lead, int64_t batch, int64_t batch_stride,
                      int64_t outer, int64_t outer_stride) {
  int64_t last = (rows_lead ? (rows - 1) * lead + (cols - 1) : (rows - 1) + (cols - 1) * lead);
  return last + (batch - 1) * batch_stride + (outer - 1) * outer_stride + 1;
}

// Median milliseconds of the kernel on scratch buffers for `spec`, kCannotRun when it cannot run it, or
// kHung when a launch did not finish within kHangSeconds.
template <class Gemm>
double Time(const Runner<Gemm>& runner, const std::string& text) {
  std::vector<int64_t> w = ParseSpec(text);
  runner.CheckKind(w);
  Check(cudaSetDevice(0), "cudaSetDevice");
  auto refusal = runner.Refusal(runner.Arguments(w, 0, nullptr, nullptr, nullptr, nullptr, nullptr, 0));
  if (!refusal.empty()) return kCannotRun;
  int64_t in_bytes = BytesOf(w[kOperandType]), out_bytes = BytesOf(w[kOutputType]);
  // A is M x K (rows lead when K-major), B is N x K (rows lead when K-major), D is M x N, rows leading.
  int64_t a = Extent(w[kM], w[kK], w[kLeadA], w[kLayoutA] == 0, w[kL], w[kBatchA], w[kOuter], w[kOuterA]);
  int64_t b = Extent(w[kN], w[kK], w[kLeadB], w[kLayoutB] == 0, w[kL], w[kBatchB], w[kOuter], w[kOuterB]);
  int64_t d = Extent(w[kM], w[kN], w[kLeadD], true, w[kL], w[kBatchD], w[kOuter], w[kOuterD]);
  void *a_ptr = nullptr, *b_ptr = nullptr, *bias_ptr = nullptr, *c_ptr = nullptr, *d_ptr = nullptr;
  Check(cudaMalloc(&a_ptr, a * in_bytes), "cudaMalloc");
  Check(cudaMalloc(&b_ptr, b * in_bytes), "cudaMalloc");
  Check(cudaMalloc(&d_ptr, d * out_bytes), "cudaMalloc");
  Check(cudaMemset(a_ptr, 0x3c, a * in_bytes), "cudaMemset");  // small nonzero values in every type
  Check(cudaMemset(b_ptr, 0x3c, b * in_bytes), "cudaMemset");
  if (w[kHasBias]) {
    Check(cudaMalloc(&bias_ptr, w[kN] * out_bytes), "cudaMalloc");
    Check(cudaMemset(bias_ptr, 0, w[kN] * out_bytes), "cudaMemset");
  }
  if (w[kHasResidual]) {
    Check(cudaMalloc(&c_ptr, d * out_bytes), "cudaMalloc");
    Check(cudaMemset(c_ptr, 0, d * out_bytes), "cudaMemset");
  }
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  // The kernels alone, as a replayed CUDA graph runs them: parameters built once per outer batch, then
  // kRepeats back-to-back launches of each per sample (the host's set-up does not count).
  constexpr int kSamples = 23, kWarmUps = 3, kRepeats = 10;
  Runner<Gemm>::CheckAligned(w, a_ptr, b_ptr, c_ptr, d_ptr);
  std::vector<Gemm> gemms(w[kOuter]);
  std::vector<typename Gemm::Arguments> arguments;
  for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
    arguments.push_back(runner.Arguments(w, outer, a_ptr, b_ptr, bias_ptr, c_ptr, d_ptr, 0));
    runner.Prepare(gemms[outer], w, outer, a_ptr, b_ptr, bias_ptr, c_ptr, d_ptr, 0, stream);
  }
  std::vector<float> times;
  for (int i = 0; i < kSamples; ++i) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int repeat = 0; repeat < kRepeats; ++repeat) {
      for (int64_t outer = 0; outer < w[kOuter]; ++outer) {
        Runner<Gemm>::ResetWorkspace(arguments[outer], 0, stream);
        Runner<Gemm>::Run(gemms[outer], stream);
      }
    }
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    // Waiting with a deadline: a kernel that never finishes is reported, not waited on forever (its
    // buffers stay allocated, as it may still use them).
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
  for (void* p : {a_ptr, b_ptr, bias_ptr, c_ptr, d_ptr}) cudaFree(p);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace collage_cutlass

// Registers `collage_cutlass.<NAME>` (the call) and `collage_cutlass.time.<NAME>` (the timing) for `Gemm`.
#define COLLAGE_CUTLASS_REGISTER(NAME, GEMM, ...)                                                              \
  TVM_FFI_STATIC_INIT_BLOCK() {                                                                                \
    static const collage_cutlass::Runner<GEMM> runner(collage_cutlass::Kind{__VA_ARGS__});                    \
    tvm::ffi::reflection::GlobalDef()                                                                          \
        .def_packed("collage_cutlass." NAME,                                                                   \
                    [](tvm::ffi::PackedArgs args, tvm::ffi::Any*) { collage_cutlass::RunPacked(runner, args); }) \
        .def("collage_cutlass.time." NAME, [](tvm::ffi::String spec) {                                         \
          return collage_cutlass::Time(runner, std::string(spec.data(), spec.size()));                        \
        });                                                                                                    \
  }
