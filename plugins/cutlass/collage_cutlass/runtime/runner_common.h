// What the GEMM and convolution runners of Collage's CUTLASS backend share: errors, spec text, operand
// checks, one workspace per device, the fused bias, the packed call and the timing loop.
//
// A runner (gemm_runner.h's Runner, conv_runner.h's ConvRunner) knows its spec's words and its kernel's
// arguments; it gives RunPacked and the timing these members:
//     static std::vector<int64_t> Words(const std::string& text);   // the spec's words, version checked
//     using KindWords = ...;                                        // what COLLAGE_CUTLASS_REGISTER_RUNNER builds it from
//     void CheckKind(const std::vector<int64_t>& w) const;          // the spec names this kernel's kind
//     int Arity() const;                                            // tensors per call, output included
//     static constexpr SpecFields kFields;                          // where types, bias and residual are
//     void CheckOutput(const std::vector<int64_t>& w, const DLTensor* out) const;
//     void Launch(w, operand0, operand1, bias, residual, out, device, stream) const;
// No Python runs on the call path. One workspace per device serves every kernel: calls on one stream
// (TVM's) only.
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

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr double kCannotRun = -1.0, kHung = -2.0;
constexpr int kHangSeconds = 10;
enum Type : int64_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

// Where a spec keeps the words the packed call reads: the operands' and output's types, bias and residual.
struct SpecFields {
  int operand_type, output_type, has_bias, has_residual;
};

[[noreturn]] inline void Fail(const std::string& message) {
  TVM_FFI_THROW(RuntimeError) << "collage_cutlass: " << message;
  __builtin_unreachable();  // the throw is in the builder's destructor
}

inline void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

inline int64_t BytesOf(int64_t type) { return type == kF32 ? 4 : 2; }

// `count` int64 words from their host string (hex of little-endian words), the first of them `version`;
// `what` names the spec in errors.
inline std::vector<int64_t> ParseWords(const std::string& text, int count, int64_t version, const std::string& what) {
  if (text.size() != static_cast<size_t>(count) * 16) {
    Fail(what + " of " + std::to_string(text.size()) + " hex digits, not " + std::to_string(count * 16));
  }
  std::vector<uint8_t> bytes(count * 8);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(std::stoi(text.substr(2 * i, 2), nullptr, 16));
  std::vector<int64_t> words(count);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  if (words[0] != version) Fail(what + " version " + std::to_string(words[0]) + ", this kernel reads " + std::to_string(version));
  return words;
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

template <class Thread, class = void>
struct TakesBias : std::false_type {};
template <class Thread>
struct TakesBias<Thread, std::void_t<decltype(std::declval<Thread&>().bias_ptr)>> : std::true_type {};

// Points a fused epilogue at its bias; an epilogue without bias takes nothing.
template <class Args>
void SetBias(Args& args, const void* bias) {
  using Thread = std::remove_reference_t<decltype(args.epilogue.thread)>;
  if constexpr (TakesBias<Thread>::value) {
    args.epilogue.thread.bias_ptr = static_cast<decltype(args.epilogue.thread.bias_ptr)>(bias);
  }
}

// Why a CUTLASS 3 adapter (GEMM or convolution) cannot run its arguments, or "".
template <class Adapter>
std::string Refusal(const typename Adapter::Arguments& args, const char* what) {
  if (Adapter::can_implement(args) != cutlass::Status::kSuccess) {
    return std::string("CUTLASS cannot run this ") + what + " kernel on this problem (can_implement)";
  }
  if (Adapter::get_workspace_size(args) > kWorkspaceBytes) {
    return "the kernel needs more workspace than " + std::to_string(kWorkspaceBytes) + " bytes";
  }
  return "";
}

// An adapter ready to run: its arguments checked and its parameters (TMA descriptors) built.
template <class Adapter>
void Prepare(Adapter& adapter, const typename Adapter::Arguments& args, const char* what, int device, cudaStream_t stream) {
  std::string refusal = Refusal<Adapter>(args, what);
  if (!refusal.empty()) Fail(refusal);
  auto status = adapter.initialize(args, Workspace(device), stream);
  if (status != cutlass::Status::kSuccess) Fail(std::string("initialize failed: ") + cutlassGetStatusString(status));
}

template <class Adapter>
void Run(Adapter& adapter, cudaStream_t stream) {
  auto status = adapter.run(stream);
  if (status != cutlass::Status::kSuccess) Fail(std::string("launch failed: ") + cutlassGetStatusString(status));
}

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

// One packed call `[spec, operand0, operand1, (bias), (residual), out]`: the spec's kind and the tensors'
// count, devices and types checked, then the kernel launched on TVM's stream for the output's device.
template <class Runner>
void RunPacked(const Runner& runner, tvm::ffi::PackedArgs args) {
  if (args.size() < 2) Fail("a kernel call needs a spec and tensors");
  std::vector<int64_t> w = Runner::Words(SpecText(args[0]));
  runner.CheckKind(w);
  std::vector<DLTensor*> tensors;
  for (int i = 1; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
  if (static_cast<int>(tensors.size()) != runner.Arity()) {
    Fail("the kernel takes " + std::to_string(runner.Arity()) + " tensors but was passed " + std::to_string(tensors.size()));
  }
  DLTensor* out = tensors.back();
  if (out->device.device_type != kDLCUDA) Fail("the output is not on a CUDA device");
  runner.CheckOutput(w, out);
  int device = out->device.device_id;
  Check(cudaSetDevice(device), "cudaSetDevice");
  constexpr SpecFields fields = Runner::kFields;
  size_t at = 2;
  const void* bias = w[fields.has_bias] ? DataOf(tensors[at++], device, w[fields.output_type]) : nullptr;
  const void* residual = w[fields.has_residual] ? DataOf(tensors[at++], device, w[fields.output_type]) : nullptr;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  runner.Launch(w, DataOf(tensors[0], device, w[fields.operand_type]), DataOf(tensors[1], device, w[fields.operand_type]),
                bias, residual, const_cast<void*>(DataOf(out, device, w[fields.output_type])), device, stream);
}

// Device buffers for timing a kernel, each filled with one byte (0x3c gives small nonzero values in every
// type), freed together.
class Scratch {
 public:
  void* Take(int64_t bytes, int fill) {
    void* pointer = nullptr;
    Check(cudaMalloc(&pointer, bytes), "cudaMalloc");
    buffers_.push_back(pointer);
    Check(cudaMemset(pointer, fill, bytes), "cudaMemset");
    return pointer;
  }
  void Release() {
    for (void* pointer : buffers_) cudaFree(pointer);
    buffers_.clear();
  }

 private:
  std::vector<void*> buffers_;
};

// The tensors of one timed call, taken from `scratch`: the two operands (filled), the output, and the
// bias (`bias_elements` long) and residual (shaped as the output) where the spec `w` has them.
struct TimingBuffers {
  void *operand0, *operand1, *out, *bias, *residual;
};

inline TimingBuffers TakeTimingBuffers(Scratch& scratch, const std::vector<int64_t>& w, const SpecFields& fields,
                                       int64_t operand0_elements, int64_t operand1_elements, int64_t out_elements,
                                       int64_t bias_elements) {
  int64_t in_bytes = BytesOf(w[fields.operand_type]), out_bytes = BytesOf(w[fields.output_type]);
  TimingBuffers buffers;
  buffers.operand0 = scratch.Take(operand0_elements * in_bytes, 0x3c);
  buffers.operand1 = scratch.Take(operand1_elements * in_bytes, 0x3c);
  buffers.out = scratch.Take(out_elements * out_bytes, 0);
  buffers.bias = w[fields.has_bias] ? scratch.Take(bias_elements * out_bytes, 0) : nullptr;
  buffers.residual = w[fields.has_residual] ? scratch.Take(out_elements * out_bytes, 0) : nullptr;
  return buffers;
}

// Median milliseconds of one `launch()` on `stream`, timed as a replayed CUDA graph runs kernels:
// kRepeats back-to-back launches per sample, the first kWarmUps samples dropped; kHung when a sample
// did not finish within kHangSeconds (a kernel that never finishes is reported, not waited on forever;
// the stream and whatever it uses are then left as they are).
template <class Launch>
double MedianMilliseconds(cudaStream_t stream, Launch launch) {
  constexpr int kSamples = 23, kWarmUps = 3, kRepeats = 10;
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < kSamples; ++i) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int repeat = 0; repeat < kRepeats; ++repeat) launch();
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
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace collage_cutlass

// Registers `collage_cutlass.<NAME>` (the call) and `collage_cutlass.time.<NAME>` (the timing) for a runner
// of type RUNNER built from its kind's words, with TIME(runner, spec) its timing function.
#define COLLAGE_CUTLASS_REGISTER_RUNNER(NAME, RUNNER, TIME, ...)                                          \
  TVM_FFI_STATIC_INIT_BLOCK() {                                                                          \
    static const RUNNER runner(RUNNER::KindWords{__VA_ARGS__});                                          \
    tvm::ffi::reflection::GlobalDef()                                                                    \
        .def_packed("collage_cutlass." NAME,                                                             \
                    [](tvm::ffi::PackedArgs args, tvm::ffi::Any*) { collage_cutlass::RunPacked(runner, args); }) \
        .def("collage_cutlass.time." NAME, [](tvm::ffi::String spec) {                                   \
          return TIME(runner, std::string(spec.data(), spec.size()));                                    \
        });                                                                                              \
  }
