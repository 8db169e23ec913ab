// cuBLASLt matrix products for Collage's cuBLAS backend, registered as TVM FFI global functions.
//
// A lowered cuBLAS partition is one call
//     R.call_dps_packed("collage_cublas.run", [spec, first, second, (bias), (residual)], out)
// where `spec` is an int64 constant holding one cublasLtMatmul problem in cuBLAS's column-major
// terms (the Python side, specs.py, turns the row-major Relax product into it: operands swapped,
// transposes and head splits absorbed as leading dimensions and batch strides), its epilogue,
// the output's type (float32, or the operands' 16-bit type when the Relax program casts the product),
// and the algorithm chosen by timing at build time. The first call with a given spec creates
// the descriptors; later calls look them up and launch on TVM's CUDA stream. The workspace is
// allocated once per device. No Python runs on this path.
//
// An output whose rows are not 16 bytes apart (GPT-2's logits: 50257 columns) keeps cuBLASLt on its
// slow alignment-1 kernels. Such a product may instead be written to a scratch buffer whose rows are
// padded to a multiple of 16 elements, then copied into the output, by cudaMemcpy2DAsync or by cuBLASLt's own layout
// transform (cublasLtMatrixTransform); tuning decides which of the three routes is fastest. Where the
// first operand is a weight the lowering stored with zero rows up to the padded width (`padded_rows`), the
// padded routes compute those rows too: cuBLASLt's fast kernels want the product's rows of that width, not
// only the output's 16 bytes apart (GPT-2's head at batch 8, bf16 operands and float32 logits, on an H200:
// 844 us in place; with the weight and the output padded to 50260 rows, an sm_80 kernel at alignment 2 and
// 500 us; padded to 50272, sm_90's nvjet kernel, 136 us, and the transform 148 us: 284 us).
// That buffer, like the workspace, is one per kernel: calls of one spec are assumed to run on one stream
// (TVM's), one after another.
//
// `collage_cublas.tune(spec)` times cuBLASLt's heuristic candidates for a spec on scratch
// buffers, written in place and (where it may be) padded and copied either way, and returns the fastest
// one's words (its OutputRoute, then the algorithm), which the build stores in the spec.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "collage_kernel_cache.h"

namespace collage_cublas {
namespace {

constexpr int64_t kSpecVersion = 7;
constexpr int64_t kAlgoWords = sizeof(cublasLtMatmulAlgo_t) / sizeof(int64_t);
constexpr size_t kWorkspaceBytes = 32u << 20;  // what NVIDIA recommends for Hopper
constexpr int kHeuristicCandidates = 32;
// Of these, the first few are timed again with K split 2, 3 and 4 ways where the kernel can split it.
constexpr size_t kSplitKCandidates = 8;
constexpr int32_t kSplitKWays[] = {2, 3, 4};
constexpr int64_t kAlignmentBytes = 16;  // what cuBLASLt's fast kernels need of every leading dimension
// A padded output's row length, in elements, where the spec sets none (see above: 16 bytes apart was not enough for
// sm_90's kernels; the Python side pads weights to the same multiple, specs.PADDED_MULTIPLE).
constexpr int64_t kPaddedMultiple = 16;
enum Epilogue : int64_t { kNone = 0, kRelu = 1, kGeluTanh = 2 };
// How D reaches the output: written in place, or written padded and copied into place by
// cudaMemcpy2DAsync or by cublasLtMatrixTransform.
enum OutputRoute : int64_t { kInPlace = 0, kPaddedMemcpy = 1, kPaddedTransform = 2 };
// What the two matrix operands are, and what the output, bias and residual are; the product accumulates
// in float32 either way. kTf32Operands: float32 operands that the tensor cores round to TF32
// (CUBLAS_COMPUTE_32F_FAST_TF32); never an output type.
enum OperandType : int64_t { kF32Operands = 0, kBf16Operands = 1, kF16Operands = 2, kTf32Operands = 3 };

[[noreturn]] void Fail(const std::string& message) { TVM_FFI_THROW(RuntimeError) << "collage_cublas: " << message; }

cudaDataType_t DataTypeOf(int64_t type) {
  switch (type) {
    case kF32Operands: return CUDA_R_32F;
    case kTf32Operands: return CUDA_R_32F;
    case kBf16Operands: return CUDA_R_16BF;
    case kF16Operands: return CUDA_R_16F;
  }
  Fail("unknown tensor type in the spec");
}

int64_t BytesOf(int64_t type) { return type == kF32Operands || type == kTf32Operands ? 4 : 2; }

void Check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) Fail(std::string(what) + " failed: " + cublasLtGetStatusString(status));
}

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// One operand's matrix in cuBLAS's column-major terms.
struct Matrix {
  int64_t op, rows, cols, ld, batch_stride, outer_stride;
};

struct Spec {
  int64_t m, n, k;
  Matrix a, b;
  int64_t ld_d, batch, outer, d_batch_stride, d_outer_stride;
  int64_t epilogue, has_bias, has_residual;
  double alpha;
  int64_t operand_type, output_type;
  // 0, or the rows of D the padded routes compute: the first operand a (op(a) = aᵀ) holds that many columns,
  // zeros past m, and the padded D's rows are that many elements apart
  int64_t padded_rows;
  int64_t has_algo, route;
  cublasLtMatmulAlgo_t algo;
  int64_t Arity() const { return 3 + has_bias + has_residual; }
  cudaDataType_t OperandDataType() const { return DataTypeOf(operand_type); }
  cudaDataType_t OutputDataType() const { return DataTypeOf(output_type); }
  int64_t OperandBytes() const { return BytesOf(operand_type); }
  int64_t OutputBytes() const { return BytesOf(output_type); }
  // D may be written padded when its rows are misaligned, nothing is read from it (no residual) and its
  // batches lie one after another, so that one two-dimensional copy moves every row into place.
  bool MayPadD() const {
    return (ld_d * OutputBytes()) % kAlignmentBytes != 0 && !has_residual && outer == 1 && (batch == 1 || d_batch_stride == ld_d * n);
  }
  int64_t PaddedLd() const { return padded_rows ? padded_rows : (ld_d + kPaddedMultiple - 1) / kPaddedMultiple * kPaddedMultiple; }
  // The rows of D that the padded routes compute: m, or with a padded first operand, as many as it holds.
  int64_t PaddedM() const { return padded_rows ? padded_rows : m; }
};

// The bits of a small whole number (below 256, so exact) as bfloat16 and as IEEE half.
uint16_t BfloatBits(uint32_t whole) {
  const float value = static_cast<float>(whole);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t HalfBits(uint32_t whole) {
  if (whole == 0) return 0;
  int exponent = 31 - __builtin_clz(whole);
  return static_cast<uint16_t>(((exponent + 15) << 10) | ((whole << (10 - exponent)) & 0x3FF));
}

// A tuning's scratch buffers, stream and timing events, released however the tuning ends.
struct TuningScratch {
  void* buffers[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~TuningScratch() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    for (void* buffer : buffers) {
      if (buffer) cudaFree(buffer);
    }
  }
};

class Reader {
 public:
  Reader(const int64_t* begin, const int64_t* end) : at_(begin), end_(end) {}
  int64_t Next() {
    if (at_ >= end_) Fail("the spec ends early");
    return *at_++;
  }
  double NextFloat() {
    int64_t word = Next();
    double value;
    std::memcpy(&value, &word, sizeof(value));
    return value;
  }
  Matrix NextMatrix() {
    Matrix matrix;
    matrix.op = Next();
    matrix.rows = Next();
    matrix.cols = Next();
    matrix.ld = Next();
    matrix.batch_stride = Next();
    matrix.outer_stride = Next();
    return matrix;
  }
  bool Done() const { return at_ == end_; }

 private:
  const int64_t* at_;
  const int64_t* end_;
};

// The spec arrives as a host string (hex of its int64 words), so it stays on the host whatever
// the device: the VM would copy a constant tensor to the GPU. The hex text is the cache key.
std::string Decode(const std::string& hex) {
  if (hex.size() % (2 * sizeof(int64_t)) != 0) Fail("the spec is not a whole number of words");
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return bytes;
}

std::string SpecText(const tvm::ffi::AnyView& spec) {
  auto text = spec.cast<tvm::ffi::String>();
  return std::string(text.data(), text.size());
}

Spec ParseSpec(const std::string& hex) {
  const std::string key = Decode(hex);
  const int64_t* words = reinterpret_cast<const int64_t*>(key.data());
  Reader reader(words, words + key.size() / sizeof(int64_t));
  if (reader.Next() != kSpecVersion) Fail("the spec was written for another version of the kernels");
  Spec spec;
  spec.m = reader.Next();
  spec.n = reader.Next();
  spec.k = reader.Next();
  spec.a = reader.NextMatrix();
  spec.b = reader.NextMatrix();
  spec.ld_d = reader.Next();
  spec.batch = reader.Next();
  spec.outer = reader.Next();
  spec.d_batch_stride = reader.Next();
  spec.d_outer_stride = reader.Next();
  spec.padded_rows = reader.Next();
  spec.epilogue = reader.Next();
  spec.has_bias = reader.Next();
  spec.has_residual = reader.Next();
  spec.alpha = reader.NextFloat();
  spec.operand_type = reader.Next();
  spec.output_type = reader.Next();
  spec.OperandDataType();  // refuse an unknown type here, before anything is created
  spec.OutputDataType();
  if (spec.output_type == kTf32Operands) Fail("TF32 is an operand type, not an output type");
  if (spec.padded_rows && !(spec.MayPadD() && !spec.has_bias && spec.batch == 1 && spec.outer == 1 && spec.a.op == 1 &&
                            spec.padded_rows >= spec.m && spec.padded_rows * spec.OutputBytes() % kAlignmentBytes == 0)) {
    Fail("the spec pads a first operand whose product's output cannot be padded so");
  }
  spec.has_algo = reader.Next();
  // without a timed choice, padding is cuBLASLt's fast kernels' condition
  spec.route = spec.MayPadD() ? kPaddedMemcpy : kInPlace;
  std::memset(&spec.algo, 0, sizeof(spec.algo));
  if (spec.has_algo) {
    spec.route = reader.Next();
    if (spec.route < kInPlace || spec.route > kPaddedTransform) Fail("unknown output route " + std::to_string(spec.route));
    if (spec.route != kInPlace && !spec.MayPadD()) Fail("the spec pads an output that cannot be padded");
    int64_t words_of_algo[kAlgoWords];
    for (int64_t i = 0; i < kAlgoWords; ++i) words_of_algo[i] = reader.Next();
    std::memcpy(&spec.algo, words_of_algo, sizeof(spec.algo));
  }
  if (!reader.Done()) Fail("the spec has trailing words");
  return spec;
}

cublasLtHandle_t Handle(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  cublasLtHandle_t handle;
  Check(cublasLtCreate(&handle), "cublasLtCreate");
  handles[device] = handle;
  return handle;
}

void* Workspace(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, void*> workspaces;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = workspaces.find(device);
  if (found != workspaces.end()) return found->second;
  void* workspace = nullptr;
  Check(cudaMalloc(&workspace, kWorkspaceBytes), "allocating the cuBLASLt workspace");
  workspaces[device] = workspace;
  return workspace;
}

cublasLtMatrixLayout_t Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout;
  Check(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld), "cublasLtMatrixLayoutCreate");
  int32_t count = static_cast<int32_t>(batch);
  Check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "batch count");
  Check(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        "batch stride");
  return layout;
}

cublasLtEpilogue_t EpilogueOf(const Spec& spec) {
  switch (spec.epilogue) {
    case kNone:
      return spec.has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case kRelu:
      return spec.has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case kGeluTanh:
      return spec.has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
  }
  Fail("unknown epilogue " + std::to_string(spec.epilogue));
}

// The descriptors of one problem, created once, and the algorithm it runs.
class Kernel {
 public:
  Kernel(const Spec& spec, int device) : spec_(spec), device_(device), handle_(Handle(device)) {
    try {
      Make(spec);
    } catch (...) {
      Release();  // a constructor that throws runs no destructor
      throw;
    }
  }
  ~Kernel() { Release(); }

 private:
  void Make(const Spec& spec) {
    cublasComputeType_t compute = spec.operand_type == kTf32Operands ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    Check(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    cublasOperation_t op_a = spec.a.op ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = spec.b.op ? CUBLAS_OP_T : CUBLAS_OP_N;
    Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
    Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
    cublasLtEpilogue_t epilogue = EpilogueOf(spec);
    Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue");
    if (spec.has_bias) {
      int64_t no_stride = 0;  // one bias vector for every batch
      Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &no_stride, sizeof(no_stride)),
            "bias batch stride");
      cudaDataType_t bias_type = spec.OutputDataType();  // cuBLASLt takes no float32 bias for a 16-bit D
      Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
            "bias type");
    }
    a_[0] = Layout(spec.OperandDataType(), spec.a.rows, spec.a.cols, spec.a.ld, spec.batch, spec.a.batch_stride);
    b_ = Layout(spec.OperandDataType(), spec.b.rows, spec.b.cols, spec.b.ld, spec.batch, spec.b.batch_stride);
    d_[0] = Layout(spec.OutputDataType(), spec.m, spec.n, spec.ld_d, spec.batch, spec.d_batch_stride);
    if (spec.MayPadD()) {
      d_[1] = Layout(spec.OutputDataType(), spec.PaddedM(), spec.n, spec.PaddedLd(), spec.batch, spec.PaddedLd() * spec.n);
      if (spec.padded_rows) {  // op(a) is a's transpose: its columns are the rows of D
        a_[1] = Layout(spec.OperandDataType(), spec.a.rows, spec.PaddedM(), spec.a.ld, spec.batch, spec.a.batch_stride);
        copied_ = Layout(spec.OutputDataType(), spec.m, spec.n, spec.PaddedLd(), spec.batch, spec.PaddedLd() * spec.n);
      }
      cublasStatus_t made = cublasLtMatrixTransformDescCreate(&transform_, CUDA_R_32F);
      if (made != CUBLAS_STATUS_SUCCESS) {
        transform_ = nullptr;
        Check(made, "cublasLtMatrixTransformDescCreate");
      }
    }
    route_ = spec.route;
    if (spec.has_algo && AlgoFits(spec.algo, route_ != kInPlace)) {
      algo_ = spec.algo;
    } else {
      std::vector<cublasLtMatmulHeuristicResult_t> candidates = Candidates(1, route_ != kInPlace);
      if (candidates.empty() && route_ != kInPlace && !spec.has_algo) {  // no padded kernel: the output in place
        route_ = kInPlace;
        candidates = Candidates(1, false);
      }
      if (candidates.empty()) Fail("cuBLASLt has no algorithm for this problem");
      algo_ = candidates[0].algo;
    }
    if (route_ != kInPlace) {  // last, so nothing after it throws; with the descriptors, so none is made while a CUDA graph is captured
      cudaError_t status = cudaMalloc(&padded_, spec.OutputBytes() * spec.PaddedLd() * spec.n * spec.batch);
      if (status != cudaSuccess) {
        padded_ = nullptr;
        Check(status, "allocating the padded output");
      }
    }
  }

 public:
  int64_t Arity() const { return spec_.Arity(); }
  const Spec& spec() const { return spec_; }
  size_t FirstOperandElements() const { return AExtent(); }

  std::vector<cublasLtMatmulHeuristicResult_t> Candidates(int wanted, bool padded) {
    cublasLtMatmulPreference_t preference;
    Check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    size_t bytes = kWorkspaceBytes;
    Check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)),
          "workspace preference");
    // A split K's parts summed in float32 only: the other schemes add them up in a 16-bit output's type.
    uint32_t schemes = spec_.OutputBytes() == 4 ? CUBLASLT_REDUCTION_SCHEME_MASK : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    Check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)),
          "reduction scheme preference");
    std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
    int returned = 0;
    cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, desc_, A(padded), b_, d_[padded], d_[padded], preference, wanted, results.data(), &returned);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS) returned = 0;
    results.resize(returned);
    return results;
  }

  // pointers: first, second, bias (or null), residual (or null), out; `route`: D is written in place, or to the
  // padded scratch buffer and then copied into `out` one of two ways
  void Launch(const void* first, const void* second, const void* bias, const void* residual, void* out,
              const cublasLtMatmulAlgo_t& algo, int64_t route, cudaStream_t stream) {
    const bool padded = route != kInPlace;
    float alpha = static_cast<float>(spec_.alpha), beta = residual ? 1.0f : 0.0f;
    const char* a = static_cast<const char*>(first);
    const char* b = static_cast<const char*>(second);
    char* d = static_cast<char*>(padded ? padded_ : out);
    const char* c = static_cast<const char*>(residual ? residual : d);
    const cublasLtMatrixLayout_t d_layout = d_[padded];
    if (bias) {
      Check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), "bias pointer");
    }
    const int64_t operand_bytes = spec_.OperandBytes(), output_bytes = spec_.OutputBytes();
    for (int64_t outer = 0; outer < spec_.outer; ++outer) {
      Check(cublasLtMatmul(handle_, desc_, &alpha, a + operand_bytes * outer * spec_.a.outer_stride, A(padded),
                           b + operand_bytes * outer * spec_.b.outer_stride, b_, &beta, c + output_bytes * outer * spec_.d_outer_stride,
                           d_layout, d + output_bytes * outer * spec_.d_outer_stride, d_layout, &algo, Workspace(device_),
                           kWorkspaceBytes, stream),
            "cublasLtMatmul");
    }
    if (route == kPaddedMemcpy) {
      Check(cudaMemcpy2DAsync(out, output_bytes * spec_.ld_d, padded_, output_bytes * spec_.PaddedLd(), output_bytes * spec_.m,
                              spec_.n * spec_.batch, cudaMemcpyDeviceToDevice, stream),
            "copying the padded output into place");
    } else if (route == kPaddedTransform) {
      Check(CopyByTransform(out, stream), "cublasLtMatrixTransform of the padded output into place");
    }
  }

  // Whether cuBLASLt's transform takes this output's type and layout and copies the padded D into place exactly
  // as cudaMemcpy2DAsync does: both copy a padded D of small integers (exact in every output type) into the
  // scratch outputs `by_memcpy` and `by_transform` (each DExtent() floats), which must then hold the same bytes.
  bool TransformCopiesAsMemcpy(void* by_memcpy, void* by_transform, cudaStream_t stream) {
    const int64_t bytes = spec_.OutputBytes(), count = spec_.PaddedLd() * spec_.n * spec_.batch;
    std::vector<char> pattern(static_cast<size_t>(count * bytes));
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t small = static_cast<uint32_t>(i % 251);
      if (bytes == 4) {
        const float value = static_cast<float>(small);
        std::memcpy(&pattern[i * 4], &value, 4);
      } else {
        const uint16_t bits = spec_.output_type == kBf16Operands ? BfloatBits(small) : HalfBits(small);
        std::memcpy(&pattern[i * 2], &bits, 2);
      }
    }
    const size_t compared = DExtent() * bytes;
    std::vector<char> copied(compared), transformed(compared);
    bool same = cudaMemcpy(padded_, pattern.data(), pattern.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
                cudaMemset(by_memcpy, 0, compared) == cudaSuccess && cudaMemset(by_transform, 0, compared) == cudaSuccess &&
                cudaMemcpy2DAsync(by_memcpy, bytes * spec_.ld_d, padded_, bytes * spec_.PaddedLd(), bytes * spec_.m,
                                  spec_.n * spec_.batch, cudaMemcpyDeviceToDevice, stream) == cudaSuccess &&
                CopyByTransform(by_transform, stream) == CUBLAS_STATUS_SUCCESS && cudaStreamSynchronize(stream) == cudaSuccess &&
                cudaMemcpy(copied.data(), by_memcpy, compared, cudaMemcpyDeviceToHost) == cudaSuccess &&
                cudaMemcpy(transformed.data(), by_transform, compared, cudaMemcpyDeviceToHost) == cudaSuccess &&
                copied == transformed;
    cudaGetLastError();  // a refused transform leaves no error behind for the timing that follows
    return same;
  }

  // The padded D copied into `out` by cuBLASLt's layout transform (out = 1 * padded, no second matrix).
  cublasStatus_t CopyByTransform(void* out, cudaStream_t stream) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatrixTransform(handle_, transform_, &one, padded_, copied_ ? copied_ : d_[1], &zero, nullptr, nullptr, out, d_[0],
                                   stream);
  }

  void Run(const void* first, const void* second, const void* bias, const void* residual, void* out, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);  // the bias pointer lives in the shared descriptor
    Launch(first, second, bias, residual, out, algo_, route_, stream);
  }

  // The fastest of cuBLASLt's heuristic candidates on scratch buffers, D written in place and (where it may be)
  // padded then copied either way, as spec words: the OutputRoute, then the algorithm.
  std::vector<int64_t> Tune() {
    TuningScratch scratch;
    size_t sizes[5] = {AExtent(), Extent(spec_.b), static_cast<size_t>(spec_.m), DExtent(), DExtent()};
    for (int i = 0; i < 5; ++i) {
      Check(cudaMalloc(&scratch.buffers[i], 4 * sizes[i]), "allocating tuning buffers");
      Check(cudaMemset(scratch.buffers[i], 0, 4 * sizes[i]), "clearing tuning buffers");
    }
    Check(cudaStreamCreate(&scratch.stream), "cudaStreamCreate");
    Check(cudaEventCreate(&scratch.start), "cudaEventCreate");
    Check(cudaEventCreate(&scratch.stop), "cudaEventCreate");
    void** buffers = scratch.buffers;
    cudaStream_t stream = scratch.stream;
    struct Candidate {
      int64_t route;
      cublasLtMatmulAlgo_t algo;
    };
    std::vector<Candidate> candidates;
    for (const auto& algo : WithSplitK(Candidates(kHeuristicCandidates, false), false)) candidates.push_back({kInPlace, algo});
    if (padded_) {  // the buffer is made where D may be padded and a padded kernel exists
      bool transforms = TransformCopiesAsMemcpy(buffers[3], buffers[4], stream);
      for (const auto& algo : WithSplitK(Candidates(kHeuristicCandidates, true), true)) {
        candidates.push_back({kPaddedMemcpy, algo});
        if (transforms) candidates.push_back({kPaddedTransform, algo});
      }
    }
    if (candidates.empty()) Fail("cuBLASLt has no algorithm for this problem");
    float best = std::numeric_limits<float>::infinity();
    const Candidate* fastest = &candidates[0];
    for (const auto& candidate : candidates) {
      auto run = [&] {
        Launch(buffers[0], buffers[1], spec_.has_bias ? buffers[2] : nullptr, spec_.has_residual ? buffers[3] : nullptr,
               buffers[4], candidate.algo, candidate.route, stream);
      };
      run();
      Check(cudaEventRecord(scratch.start, stream), "cudaEventRecord");
      for (int i = 0; i < 10; ++i) run();
      Check(cudaEventRecord(scratch.stop, stream), "cudaEventRecord");
      Check(cudaEventSynchronize(scratch.stop), "cudaEventSynchronize");
      float ms = 0;
      Check(cudaEventElapsedTime(&ms, scratch.start, scratch.stop), "cudaEventElapsedTime");
      if (ms < best) {
        best = ms;
        fastest = &candidate;
      }
    }
    std::vector<int64_t> words(1 + kAlgoWords);
    words[0] = fastest->route;
    std::memcpy(words.data() + 1, &fastest->algo, sizeof(fastest->algo));
    return words;
  }

 private:
  // What the constructor made, however far it got; each handle destroyed once.
  void Release() {
    for (cublasLtMatrixLayout_t* layout : {&a_[0], &a_[1], &copied_, &b_, &d_[0], &d_[1]}) {
      if (*layout) cublasLtMatrixLayoutDestroy(*layout);
      *layout = nullptr;
    }
    if (padded_) cudaFree(padded_);
    padded_ = nullptr;
    if (transform_) cublasLtMatrixTransformDescDestroy(transform_);
    transform_ = nullptr;
    if (desc_) cublasLtMatmulDescDestroy(desc_);
    desc_ = nullptr;
  }
  // `found`'s algorithms, then those among the first kSplitKCandidates that compute K whole, again with K split
  // kSplitKWays ways and the parts summed in float32 in the workspace. cuBLASLt's heuristic seldom offers a
  // split, which evens out the last wave of a problem with few output tiles (a projection back to the model
  // width: 1024 x 768 makes 192 tiles of 64 x 64 for an H100's 132 multiprocessors). Timing decides.
  std::vector<cublasLtMatmulAlgo_t> WithSplitK(const std::vector<cublasLtMatmulHeuristicResult_t>& found, bool padded) {
    std::vector<cublasLtMatmulAlgo_t> algos;
    for (const auto& result : found) algos.push_back(result.algo);
    for (size_t i = 0; i < found.size() && i < kSplitKCandidates; ++i) {
      const cublasLtMatmulAlgo_t& algo = found[i].algo;
      int32_t splittable = 0, ways = 0;
      uint32_t schemes = 0;
      size_t written = 0;
      if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splittable, sizeof(splittable), &written) !=
              CUBLAS_STATUS_SUCCESS ||
          !splittable)
        continue;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &ways, sizeof(ways), &written) !=
              CUBLAS_STATUS_SUCCESS ||
          ways > 1)
        continue;
      if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes), &written) !=
              CUBLAS_STATUS_SUCCESS ||
          !(schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE))
        continue;
      const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      for (int32_t split : kSplitKWays) {
        cublasLtMatmulAlgo_t variant = algo;
        if (cublasLtMatmulAlgoConfigSetAttribute(&variant, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split)) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulAlgoConfigSetAttribute(&variant, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) ==
                CUBLAS_STATUS_SUCCESS &&
            AlgoFits(variant, padded))
          algos.push_back(variant);
      }
    }
    return algos;
  }
  bool AlgoFits(const cublasLtMatmulAlgo_t& algo, bool padded) {
    cublasLtMatmulHeuristicResult_t result;
    return cublasLtMatmulAlgoCheck(handle_, desc_, A(padded), b_, d_[padded], d_[padded], &algo, &result) == CUBLAS_STATUS_SUCCESS &&
           result.workspaceSize <= kWorkspaceBytes;
  }
  size_t Extent(const Matrix& m) const {
    return static_cast<size_t>((spec_.outer - 1) * m.outer_stride + (spec_.batch - 1) * m.batch_stride +
                               (m.cols - 1) * m.ld + m.rows);
  }
  // The elements of the first operand that a run reads (with a padded first operand, its zero columns too).
  size_t AExtent() const {
    Matrix a = spec_.a;
    a.cols = spec_.padded_rows ? spec_.padded_rows : a.cols;
    return Extent(a);
  }
  size_t DExtent() const {
    return static_cast<size_t>((spec_.outer - 1) * spec_.d_outer_stride + (spec_.batch - 1) * spec_.d_batch_stride +
                               (spec_.n - 1) * spec_.ld_d + spec_.m);
  }

  Spec spec_;
  int device_;
  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  // The first operand as the product in place reads it, and (with a padded first operand) as the padded routes do.
  cublasLtMatrixLayout_t A(bool padded) const { return padded && a_[1] ? a_[1] : a_[0]; }
  cublasLtMatrixLayout_t a_[2] = {nullptr, nullptr}, b_ = nullptr;
  cublasLtMatrixLayout_t d_[2] = {nullptr, nullptr};  // D in place, and padded (when it may be)
  cublasLtMatrixLayout_t copied_ = nullptr;           // with a padded first operand: D's first m rows in the padded buffer
  void* padded_ = nullptr;                           // the padded D's scratch buffer
  cublasLtMatrixTransformDesc_t transform_ = nullptr;  // copies the padded D into place (kPaddedTransform)
  int64_t route_ = kInPlace;                          // how runs write D
  cublasLtMatmulAlgo_t algo_;
  std::mutex mutex_;
};

collage::KernelCache<Kernel>& Kernels() { return collage::ProcessKernels<Kernel>(); }

// The kernel of `key` (a spec) on `device`, made on first use.
Kernel* KernelFor(const std::string& key, int device) {
  return Kernels().Get(collage::DeviceKey(key, device), [&] { return std::make_unique<Kernel>(ParseSpec(key), device); });
}

// `tensor`'s data, which must be on `device` and of `type` (an OperandType).
const void* DataOf(const DLTensor* tensor, int device, int64_t type = kF32Operands) {
  if (tensor->device.device_type != kDLCUDA || tensor->device.device_id != device) {
    Fail("every operand must be on the same CUDA device as the output");
  }
  bool fits = tensor->dtype.lanes == 1 &&
              (type == kF32Operands || type == kTf32Operands ? tensor->dtype.code == kDLFloat && tensor->dtype.bits == 32
               : type == kBf16Operands ? tensor->dtype.code == kDLBfloat && tensor->dtype.bits == 16
                                       : tensor->dtype.code == kDLFloat && tensor->dtype.bits == 16);
  if (!fits) Fail("a tensor's dtype is not the one the spec names (matrix operands float32, bfloat16 or float16; output, bias and residual of one such type)");
  return static_cast<const char*>(tensor->data) + tensor->byte_offset;
}

size_t ElementsOf(const DLTensor* tensor) {
  size_t count = 1;
  for (int i = 0; i < tensor->ndim; ++i) count *= static_cast<size_t>(tensor->shape[i]);
  return count;
}

void RunPacked(tvm::ffi::PackedArgs args, tvm::ffi::Any* result) {
  if (args.size() < 2) Fail("collage_cublas.run needs a spec and tensors");
  std::vector<DLTensor*> tensors;
  for (int i = 1; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
  DLTensor* out = tensors.back();
  if (out->device.device_type != kDLCUDA) Fail("the output is not on a CUDA device");
  int device = out->device.device_id;
  Check(cudaSetDevice(device), "cudaSetDevice");
  Kernel* kernel = KernelFor(SpecText(args[0]), device);
  if (static_cast<int64_t>(tensors.size()) != kernel->Arity()) {
    Fail("the kernel takes " + std::to_string(kernel->Arity()) + " tensors but was passed " + std::to_string(tensors.size()));
  }
  const Spec& spec = kernel->spec();
  if (ElementsOf(tensors[0]) < kernel->FirstOperandElements()) {  // a spec written for another padding of the weight
    Fail("the first operand holds " + std::to_string(ElementsOf(tensors[0])) + " elements where the spec reads " +
         std::to_string(kernel->FirstOperandElements()));
  }
  size_t at = 2;
  const void* bias = spec.has_bias ? DataOf(tensors[at++], device, spec.output_type) : nullptr;
  const void* residual = spec.has_residual ? DataOf(tensors[at++], device, spec.output_type) : nullptr;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device));
  kernel->Run(DataOf(tensors[0], device, spec.operand_type), DataOf(tensors[1], device, spec.operand_type), bias, residual, const_cast<void*>(DataOf(out, device, spec.output_type)),
              stream);
}

tvm::ffi::Bytes Tune(tvm::ffi::String spec) {
  Check(cudaSetDevice(0), "cudaSetDevice");
  Kernel kernel(ParseSpec(std::string(spec.data(), spec.size())), 0);
  std::vector<int64_t> words = kernel.Tune();
  return tvm::ffi::Bytes(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(int64_t));
}

}  // namespace
}  // namespace collage_cublas

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("collage_cublas.run", collage_cublas::RunPacked)
      .def("collage_cublas.tune", collage_cublas::Tune)
      .def("collage_cublas.kernel_count", []() { return static_cast<int64_t>(collage_cublas::Kernels().Size()); })
      .def("collage_cublas.algo_words", []() { return 1 + collage_cublas::kAlgoWords; })  // the output route, then the algorithm
      .def("collage_cublas.cublaslt_version", []() { return static_cast<int64_t>(cublasLtGetVersion()); });
}
