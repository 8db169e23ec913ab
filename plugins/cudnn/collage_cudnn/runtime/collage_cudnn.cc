// cuDNN graph-API kernels for Collage's cuDNN backend, registered as TVM FFI global functions.
//
// A lowered cuDNN partition is one call
//     R.call_dps_packed("collage_cudnn.run", [spec, x, w, (bias), (residual)], out)
// where `spec` is an int64 constant describing one cuDNN operation graph: a convolution or a
// matrix product (each tensor with its dims and strides, so transposes are read in place),
// then bias, residual add and activation as pointwise nodes, y written in float32 or (after a
// cast in the Relax program) in the operands' 16-bit type, and the engine and knobs chosen
// by timing the execution plans cuDNN ranks first, at build time. The first call with a given spec builds that
// plan (or, on a GPU where it does not exist, cuDNN's heuristic choice); later calls look it
// up and execute it on TVM's CUDA stream. Tensor cores are deselected: for float32 data they
// would round inputs to TF32, which is not what the Relax program computes. No Python runs on
// this path.
//
// An attention partition is one call on [spec, q, k, v] (16-bit, each read through its dims, strides and
// offset, so that q, k and v may be the three parts of one stacked projection) running cuDNN's fused
// attention (SDPA: softmax(scale * q @ k^T, causal mask optional) @ v, scores in float32) into a 16-bit
// output written through its strides (transposed back to (batch, sequence, heads, size) where the
// program reads it so).
//
// `collage_cudnn.tune(spec)` builds the first plans cuDNN's heuristics offer for a spec, times
// them on scratch buffers and returns the fastest plan's engine and knobs as spec words.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "collage_kernel_cache.h"

namespace collage_cudnn {
namespace {

namespace fe = cudnn_frontend;

constexpr int64_t kSpecVersion = 6;
constexpr int64_t kTunedPlans = 6;  // plans built and timed per graph at build time
constexpr size_t kMessageChars = 240;
enum Kind : int64_t { kConv2d = 1, kMatmul = 2, kAttention = 3 };
enum Mask : int64_t { kNoMask = 0, kCausal = 1 };
enum Activation : int64_t { kNone = 0, kRelu = 1, kGeluErf = 2, kGeluTanh = 3, kSilu = 4 };
enum Uid : int64_t { kX = 1, kW = 2, kBias = 3, kResidual = 4, kY = 5, kV = 6 };  // attention: q is x, k is w
// What x and w are, and what y and the residual are; the bias is float32 and the operation computes in
// float32 either way. kTf32Operands: float32 x and w that tensor-core engines may round to TF32 (an
// operand type only, at --precision tf32).
enum OperandType : int64_t { kF32Operands = 0, kBf16Operands = 1, kF16Operands = 2, kTf32Operands = 3 };

[[noreturn]] void Fail(const std::string& message) { TVM_FFI_THROW(RuntimeError) << "collage_cudnn: " << message; }

fe::DataType_t DataTypeOf(int64_t type) {
  switch (type) {
    case kF32Operands: return fe::DataType_t::FLOAT;
    case kTf32Operands: return fe::DataType_t::FLOAT;
    case kBf16Operands: return fe::DataType_t::BFLOAT16;
    case kF16Operands: return fe::DataType_t::HALF;
  }
  Fail("unknown tensor type " + std::to_string(type));
}

void Check(fe::error_t status, const char* what) {
  if (!status.is_bad()) return;
  // The frontend's messages span lines and list every engine it tried (kilobytes); a user reads one line.
  std::string message = status.get_message();
  std::replace(message.begin(), message.end(), '\n', ' ');
  if (message.size() > kMessageChars) message = message.substr(0, kMessageChars) + "...";
  Fail(std::string(what) + ": " + message);
}

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) Fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

void Check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) Fail(std::string(what) + " failed: " + cudnnGetErrorString(status));
}

struct Tensor {
  std::vector<int64_t> dims, strides;
  int64_t offset = 0;  // elements before the first one read (attention's parts of a stacked q, k, v)
  size_t Extent() const {
    size_t extent = 1 + offset;
    for (size_t i = 0; i < dims.size(); ++i) extent += (dims[i] - 1) * strides[i];
    return extent;
  }
};

struct Spec {
  int64_t kind = 0;
  Tensor x, w, y, bias, v;
  std::vector<int64_t> pre_padding, post_padding, stride, dilation;
  int64_t has_bias = 0, has_residual = 0, activation = kNone, operand_type = kF32Operands, output_type = kF32Operands;
  double scale = 1.0;  // attention
  int64_t mask = kNoMask;
  int64_t has_choice = 0, engine = 0;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
  int64_t Arity() const { return kind == kAttention ? 4 : 3 + has_bias + has_residual; }
  fe::DataType_t OperandDataType() const { return DataTypeOf(operand_type); }
  fe::DataType_t OutputDataType() const { return DataTypeOf(output_type); }
};

class Reader {
 public:
  Reader(const int64_t* begin, const int64_t* end) : at_(begin), end_(end) {}
  int64_t Next() {
    if (at_ >= end_) Fail("the spec ends early");
    return *at_++;
  }
  std::vector<int64_t> Next(int64_t count) {
    std::vector<int64_t> values;
    for (int64_t i = 0; i < count; ++i) values.push_back(Next());
    return values;
  }
  bool Done() const { return at_ == end_; }

 private:
  const int64_t* at_;
  const int64_t* end_;
};

std::vector<int64_t> PlainStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

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

void ReadChoice(Reader& reader, Spec& spec) {
  spec.has_choice = reader.Next();
  if (spec.has_choice) {
    spec.engine = reader.Next();
    int64_t knob_count = reader.Next();
    for (int64_t i = 0; i < knob_count; ++i) {
      auto type = static_cast<fe::KnobType_t>(reader.Next());
      spec.knobs[type] = reader.Next();
    }
  }
  if (!reader.Done()) Fail("the spec has trailing words");
}

// Attention's layout after the rank (4): q, k, v dims and strides each, o dims and strides, the offsets of
// q, k and v, the scale (a float64's bits), the mask, operand type, output type (both 16-bit), has_choice,
// [engine, knobs...].
Spec ParseAttention(Reader& reader, Spec spec, int64_t rank) {
  if (rank != 4) Fail("attention takes tensors of rank 4");
  spec.x = {reader.Next(rank), reader.Next(rank)};
  spec.w = {reader.Next(rank), reader.Next(rank)};
  spec.v = {reader.Next(rank), reader.Next(rank)};
  spec.y = {reader.Next(rank), reader.Next(rank)};
  spec.x.offset = reader.Next();
  spec.w.offset = reader.Next();
  spec.v.offset = reader.Next();
  if (spec.x.offset < 0 || spec.w.offset < 0 || spec.v.offset < 0) Fail("a negative offset of q, k or v");
  int64_t scale_bits = reader.Next();
  std::memcpy(&spec.scale, &scale_bits, sizeof(spec.scale));
  spec.mask = reader.Next();
  if (spec.mask != kNoMask && spec.mask != kCausal) Fail("unknown attention mask " + std::to_string(spec.mask));
  spec.operand_type = reader.Next();
  spec.output_type = reader.Next();
  if (spec.operand_type != kBf16Operands && spec.operand_type != kF16Operands) Fail("attention takes 16-bit q, k and v");
  if (spec.output_type != spec.operand_type) Fail("attention writes the type of q, k and v");
  ReadChoice(reader, spec);
  return spec;
}

// Layout: version, kind, rank, x dims, x strides, w dims, w strides, y dims, y strides, [conv: pre, post,
// stride, dilation (2 each)], has_bias, has_residual, activation, operand type, output type, has_choice, [engine, knob count, knob type/value...]
Spec ParseSpec(const std::string& hex) {
  const std::string key = Decode(hex);
  const int64_t* words = reinterpret_cast<const int64_t*>(key.data());
  Reader reader(words, words + key.size() / sizeof(int64_t));
  if (reader.Next() != kSpecVersion) Fail("the spec was written for another version of the kernels");
  Spec spec;
  spec.kind = reader.Next();
  if (spec.kind != kConv2d && spec.kind != kMatmul && spec.kind != kAttention) Fail("unknown kernel kind " + std::to_string(spec.kind));
  int64_t rank = reader.Next();
  if (spec.kind == kAttention) return ParseAttention(reader, spec, rank);
  spec.x = {reader.Next(rank), reader.Next(rank)};
  spec.w = {reader.Next(rank), reader.Next(rank)};
  spec.y = {reader.Next(rank), reader.Next(rank)};
  if (spec.kind == kConv2d) {
    spec.pre_padding = reader.Next(2);
    spec.post_padding = reader.Next(2);
    spec.stride = reader.Next(2);
    spec.dilation = reader.Next(2);
  }
  spec.has_bias = reader.Next();
  spec.has_residual = reader.Next();
  spec.activation = reader.Next();
  spec.operand_type = reader.Next();
  spec.output_type = reader.Next();
  if (spec.output_type == kTf32Operands) Fail("TF32 is an operand type, not an output type");
  spec.OperandDataType();  // refuse an unknown type here, before anything is created
  spec.OutputDataType();
  std::vector<int64_t> bias_dims(rank, 1);
  int64_t channel_axis = spec.kind == kConv2d ? 1 : rank - 1;
  bias_dims[channel_axis] = spec.y.dims[channel_axis];
  spec.bias = {bias_dims, PlainStrides(bias_dims)};
  ReadChoice(reader, spec);
  return spec;
}

cudnnHandle_t Handle(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  cudnnHandle_t handle;
  Check(cudnnCreate(&handle), "cudnnCreate");
  handles[device] = handle;
  return handle;
}

// One workspace per device, grown when a kernel is created that needs more (never per call).
void* Workspace(int device, int64_t bytes) {
  static std::mutex mutex;
  static std::unordered_map<int, std::pair<void*, int64_t>> workspaces;
  std::lock_guard<std::mutex> lock(mutex);
  auto& [pointer, size] = workspaces[device];
  if (bytes > size) {
    if (pointer != nullptr) Check(cudaFree(pointer), "freeing the cuDNN workspace");
    Check(cudaMalloc(&pointer, bytes), "allocating the cuDNN workspace");
    size = bytes;
  }
  return pointer;
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& graph, const char* name, Uid uid, const Tensor& tensor,
                                                    fe::DataType_t type = fe::DataType_t::FLOAT) {
  return graph.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(tensor.dims).set_stride(tensor.strides).set_data_type(type));
}

std::shared_ptr<fe::graph::Tensor_attributes> Pointwise(fe::graph::Graph& graph, std::shared_ptr<fe::graph::Tensor_attributes> in,
                                                        fe::PointwiseMode_t mode) {
  auto attributes = fe::graph::Pointwise_attributes().set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
  if (mode == fe::PointwiseMode_t::SWISH_FWD) attributes.set_swish_beta(1.0f);
  return graph.pointwise(in, attributes);
}

// softmax(scale * q @ k^T) @ v in one SDPA node: cuDNN's flash-attention engine, the scores and softmax in
// float32, k given as (batch, heads, sequence, size) as q and v are.
std::shared_ptr<fe::graph::Graph> MakeAttentionGraph(const Spec& spec) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(spec.OperandDataType())
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Input(*graph, "q", kX, spec.x, spec.OperandDataType());
  auto k = Input(*graph, "k", kW, spec.w, spec.OperandDataType());
  auto v = Input(*graph, "v", kV, spec.v, spec.OperandDataType());
  auto attributes = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(false).set_attn_scale(static_cast<float>(spec.scale));
  if (spec.mask == kCausal) attributes.set_causal_mask(true);
  auto [o, stats] = graph->sdpa(q, k, v, attributes);
  o->set_output(true).set_uid(kY).set_dim(spec.y.dims).set_stride(spec.y.strides).set_data_type(spec.OutputDataType());
  Check(graph->validate(), "cuDNN refused the attention graph");
  return graph;
}

std::shared_ptr<fe::graph::Graph> MakeGraph(const Spec& spec) {
  if (spec.kind == kAttention) return MakeAttentionGraph(spec);
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::FLOAT)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto x = Input(*graph, "x", kX, spec.x, spec.OperandDataType());
  auto w = Input(*graph, "w", kW, spec.w, spec.OperandDataType());
  std::shared_ptr<fe::graph::Tensor_attributes> y;
  if (spec.kind == kConv2d) {
    auto attributes = fe::graph::Conv_fprop_attributes()
                          .set_pre_padding(spec.pre_padding)
                          .set_post_padding(spec.post_padding)
                          .set_stride(spec.stride)
                          .set_dilation(spec.dilation)
                          .set_convolution_mode(fe::ConvolutionMode_t::CROSS_CORRELATION)
                          .set_compute_data_type(fe::DataType_t::FLOAT);
    y = graph->conv_fprop(x, w, attributes);
  } else {
    y = graph->matmul(x, w, fe::graph::Matmul_attributes().set_compute_data_type(fe::DataType_t::FLOAT));
  }
  y->set_data_type(fe::DataType_t::FLOAT);
  if (spec.has_bias) {
    y = graph->pointwise(y, Input(*graph, "bias", kBias, spec.bias),
                         fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT));
  }
  if (spec.has_residual) {
    y = graph->pointwise(y, Input(*graph, "residual", kResidual, spec.y, spec.OutputDataType()),
                         fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD).set_compute_data_type(fe::DataType_t::FLOAT));
  }
  switch (spec.activation) {
    case kNone:
      break;
    case kRelu:
      y = Pointwise(*graph, y, fe::PointwiseMode_t::RELU_FWD);
      break;
    case kGeluErf:
      y = Pointwise(*graph, y, fe::PointwiseMode_t::GELU_FWD);
      break;
    case kGeluTanh:
      y = Pointwise(*graph, y, fe::PointwiseMode_t::GELU_APPROX_TANH_FWD);
      break;
    case kSilu:
      y = Pointwise(*graph, y, fe::PointwiseMode_t::SWISH_FWD);
      break;
    default:
      Fail("unknown activation " + std::to_string(spec.activation));
  }
  y->set_output(true).set_uid(kY).set_dim(spec.y.dims).set_stride(spec.y.strides).set_data_type(spec.OutputDataType());
  Check(graph->validate(), "cuDNN refused the operation graph");
  return graph;
}

// The engines cuDNN's heuristics offer; for float32 operands, less those that would round them to TF32
// (the Relax program computes in float32); for TF32 operands, less those that would convert them to 16 bits.
// Deselection filters the engine configs already listed.
void CreatePlans(fe::graph::Graph& graph, const Spec& spec) {
  Check(graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "cuDNN offers no execution plan");
  if (spec.operand_type == kF32Operands) {
    graph.deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  } else if (spec.operand_type == kTf32Operands) {
    graph.deselect_numeric_notes({fe::NumericalNote_t::DOWN_CONVERT_INPUTS});
  }
}

// The first kTunedPlans plans cuDNN's heuristics offer for the graph (best first), built: each
// build may compile a kernel at run time (seconds), so the tail of the list is not worth it.
void BuildPlansToTune(fe::graph::Graph& graph, const Spec& spec, cudnnHandle_t handle) {
  Check(graph.build_operation_graph(handle), "cuDNN could not build the operation graph");
  CreatePlans(graph, spec);
  Check(graph.check_support(handle), "cuDNN has no engine for this graph (float32 operands: without tensor cores)");
  int64_t built = 0;
  std::string last_failure;
  for (int64_t index = 0; index < graph.get_execution_plan_count() && built < kTunedPlans; ++index) {
    fe::error_t status = graph.build_plan_at_index(index);
    if (status.is_good()) {
      ++built;
    } else {
      last_failure = status.get_message();
    }
  }
  if (built == 0) Fail("cuDNN could not build any execution plan: " + last_failure);
}

// The plan chosen at build time, or cuDNN's first choice when that engine is not there (another GPU).
void BuildChosenPlan(fe::graph::Graph& graph, const Spec& spec, cudnnHandle_t handle) {
  Check(graph.build_operation_graph(handle), "cuDNN could not build the operation graph");
  if (spec.has_choice && graph.create_execution_plan(spec.engine, spec.knobs).is_good() && graph.check_support(handle).is_good() &&
      graph.build_plans(handle, fe::BuildPlanPolicy_t::ALL).is_good()) {
    return;
  }
  auto fresh = MakeGraph(spec);
  graph = std::move(*fresh);
  Check(graph.build_operation_graph(handle), "cuDNN could not build the operation graph");
  CreatePlans(graph, spec);
  Check(graph.check_support(handle), "cuDNN has no engine for this graph (float32 operands: without tensor cores)");
  Check(graph.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "cuDNN could not build an execution plan");
}

class Kernel {
 public:
  Kernel(const Spec& spec, int device) : spec_(spec), device_(device), handle_(Handle(device)), graph_(MakeGraph(spec)) {
    BuildChosenPlan(*graph_, spec_, handle_);
    int64_t bytes = 0;
    Check(graph_->get_workspace_size(bytes), "cuDNN workspace size");
    workspace_bytes_ = bytes;
    Workspace(device_, workspace_bytes_);
  }

  const Spec& spec() const { return spec_; }

  void Run(std::unordered_map<int64_t, void*>& pointers, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    Check(cudnnSetStream(handle_, stream), "cudnnSetStream");
    Check(graph_->execute(handle_, pointers, Workspace(device_, workspace_bytes_)), "cuDNN execution failed");
  }

 private:
  Spec spec_;
  int device_;
  cudnnHandle_t handle_;
  std::shared_ptr<fe::graph::Graph> graph_;
  int64_t workspace_bytes_ = 0;
  std::mutex mutex_;
};

collage::KernelCache<Kernel>& Kernels() { return collage::ProcessKernels<Kernel>(); }

// The kernel of `key` (a spec) on `device`, made on first use.
Kernel* KernelFor(const std::string& key, int device) {
  return Kernels().Get(collage::DeviceKey(key, device), [&] { return std::make_unique<Kernel>(ParseSpec(key), device); });
}

// `tensor`'s data, which must be on `device` and of `type` (an OperandType).
void* DataOf(const DLTensor* tensor, int device, int64_t type = kF32Operands) {
  if (tensor->device.device_type != kDLCUDA || tensor->device.device_id != device) {
    Fail("every operand must be on the same CUDA device as the output");
  }
  bool fits = tensor->dtype.lanes == 1 &&
              (type == kF32Operands || type == kTf32Operands ? tensor->dtype.code == kDLFloat && tensor->dtype.bits == 32
               : type == kBf16Operands ? tensor->dtype.code == kDLBfloat && tensor->dtype.bits == 16
                                       : tensor->dtype.code == kDLFloat && tensor->dtype.bits == 16);
  if (!fits) Fail("a tensor's dtype is not the one the spec names (x and w, y and the residual, each float32, bfloat16 or float16; the bias float32)");
  return static_cast<char*>(tensor->data) + tensor->byte_offset;
}

// Attention's q, k and v pointers moved to their first elements (their offsets in the tensors passed).
void Shift(std::unordered_map<int64_t, void*>& pointers, const Spec& spec) {
  if (spec.kind != kAttention) return;
  const int64_t bytes = spec.operand_type == kF32Operands ? 4 : 2;
  for (auto [uid, tensor] : {std::pair<int64_t, const Tensor*>{kX, &spec.x}, {kW, &spec.w}, {kV, &spec.v}}) {
    pointers[uid] = static_cast<char*>(pointers[uid]) + tensor->offset * bytes;
  }
}

void RunPacked(tvm::ffi::PackedArgs args, tvm::ffi::Any* result) {
  if (args.size() < 2) Fail("collage_cudnn.run needs a spec and tensors");
  std::vector<DLTensor*> tensors;
  for (int i = 1; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
  DLTensor* out = tensors.back();
  if (out->device.device_type != kDLCUDA) Fail("the output is not on a CUDA device");
  int device = out->device.device_id;
  Check(cudaSetDevice(device), "cudaSetDevice");
  Kernel* kernel = KernelFor(SpecText(args[0]), device);
  const Spec& spec = kernel->spec();
  if (static_cast<int64_t>(tensors.size()) != spec.Arity()) {
    Fail("the kernel takes " + std::to_string(spec.Arity()) + " tensors but was passed " + std::to_string(tensors.size()));
  }
  std::unordered_map<int64_t, void*> pointers{{kX, DataOf(tensors[0], device, spec.operand_type)},
                                              {kW, DataOf(tensors[1], device, spec.operand_type)},
                                              {kY, DataOf(out, device, spec.output_type)}};
  if (spec.kind == kAttention) pointers[kV] = DataOf(tensors[2], device, spec.operand_type);
  Shift(pointers, spec);
  size_t at = 2;
  if (spec.has_bias) pointers[kBias] = DataOf(tensors[at++], device);
  if (spec.has_residual) pointers[kResidual] = DataOf(tensors[at++], device, spec.output_type);
  kernel->Run(pointers, static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device)));
}

tvm::ffi::Bytes Tune(tvm::ffi::String spec_text) {
  Check(cudaSetDevice(0), "cudaSetDevice");
  Spec spec = ParseSpec(std::string(spec_text.data(), spec_text.size()));
  spec.has_choice = 0;
  cudnnHandle_t handle = Handle(0);
  auto graph = MakeGraph(spec);
  BuildPlansToTune(*graph, spec, handle);
  std::vector<std::pair<int64_t, size_t>> buffers{{kX, spec.x.Extent()}, {kW, spec.w.Extent()}, {kY, spec.y.Extent()}};
  if (spec.has_bias) buffers.push_back({kBias, spec.bias.Extent()});
  if (spec.has_residual) buffers.push_back({kResidual, spec.y.Extent()});
  if (spec.kind == kAttention) buffers.push_back({kV, spec.v.Extent()});
  std::unordered_map<int64_t, void*> pointers;
  std::vector<void*> allocated;
  for (auto [uid, extent] : buffers) {
    void* buffer = nullptr;
    Check(cudaMalloc(&buffer, extent * sizeof(float)), "allocating tuning buffers");
    allocated.push_back(buffer);
    Check(cudaMemset(buffer, 0, extent * sizeof(float)), "clearing tuning buffers");
    pointers[uid] = buffer;
  }
  Shift(pointers, spec);
  int64_t workspace_bytes = graph->get_autotune_workspace_size();
  void* workspace = nullptr;
  if (workspace_bytes > 0) Check(cudaMalloc(&workspace, workspace_bytes), "allocating the tuning workspace");
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Check(cudnnSetStream(handle, stream), "cudnnSetStream");
  fe::error_t tuned = graph->autotune(handle, pointers, workspace);
  int64_t engine = 0;
  std::unordered_map<fe::KnobType_t, int64_t> knobs;
  fe::error_t chosen = tuned.is_good() ? graph->get_engine_and_knobs_at_index(0, engine, knobs) : tuned;
  cudnnSetStream(handle, nullptr);
  cudaStreamDestroy(stream);
  if (workspace != nullptr) cudaFree(workspace);
  for (void* buffer : allocated) cudaFree(buffer);
  Check(chosen, "timing cuDNN's execution plans failed");
  std::vector<int64_t> words{engine, static_cast<int64_t>(knobs.size())};
  for (auto [type, value] : knobs) {
    words.push_back(static_cast<int64_t>(type));
    words.push_back(value);
  }
  return tvm::ffi::Bytes(reinterpret_cast<const char*>(words.data()), words.size() * sizeof(int64_t));
}

int64_t PlanCount(tvm::ffi::String spec_text) {
  Check(cudaSetDevice(0), "cudaSetDevice");
  Spec spec = ParseSpec(std::string(spec_text.data(), spec_text.size()));
  auto graph = MakeGraph(spec);
  BuildPlansToTune(*graph, spec, Handle(0));
  return graph->get_execution_plan_count();
}

}  // namespace
}  // namespace collage_cudnn

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("collage_cudnn.run", collage_cudnn::RunPacked)
      .def("collage_cudnn.tune", collage_cudnn::Tune)
      .def("collage_cudnn.plan_count", collage_cudnn::PlanCount)
      .def("collage_cudnn.kernel_count", []() { return static_cast<int64_t>(collage_cudnn::Kernels().Size()); })
      .def("collage_cudnn.cudnn_version", []() { return static_cast<int64_t>(cudnnGetVersion()); });
}
