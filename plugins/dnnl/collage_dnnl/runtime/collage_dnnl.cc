// oneDNN kernels for Collage's DNNL backend, registered as TVM FFI global functions.
//
// A lowered DNNL partition is one call
//     R.call_dps_packed("collage_dnnl.run", [spec, *operands], out)
// where `spec` is an int64 constant that describes the whole partition (operator, shapes,
// attributes, fused post-operations and, for convolutions, the memory layout its weights were
// packed into at build time). The first call with a given spec creates the oneDNN primitive;
// later calls look it up by the spec's contents and execute it on the VM's tensors in place.
//
// `collage_dnnl.pack_weights(spec, weights)` is called once at build time: it returns the
// convolution's weights reordered into the layout oneDNN prefers on this CPU, preceded by that
// layout's memory descriptor, which the runtime checks against the primitive it creates (a
// library built on one CPU and run on another reorders the weights again instead of
// misreading them).
#include <dlpack/dlpack.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/ffi/string.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "collage_kernel_cache.h"

namespace collage_dnnl {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;

constexpr int64_t kSpecVersion = 2;
enum Kind : int64_t { kConv2d = 1, kMatmul = 2, kPool2d = 3, kSoftmax = 4, kLayerNorm = 5 };
enum Eltwise : int64_t { kNoEltwise = 0, kRelu = 1, kGeluErf = 2 };
enum PoolAlgorithm : int64_t { kMax = 0, kAvgIncludePad = 1, kAvgExcludePad = 2 };
enum ConvLayout : int64_t { kPlainActivations = 0, kBlockedActivations = 1 };
// What convolutions and matmuls read their data and weights as; they accumulate and write float32 either way.
enum OperandType : int64_t { kF32Operands = 0, kBf16Operands = 1 };
constexpr size_t kMaxKernels = 4096;
constexpr int64_t kDescWords = (sizeof(dnnl_memory_desc_t) + sizeof(int64_t) - 1) / sizeof(int64_t);

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

[[noreturn]] void Fail(const std::string& message) { TVM_FFI_THROW(ValueError) << "collage_dnnl: " << message; }

class SpecReader {
 public:
  SpecReader(const int64_t* begin, const int64_t* end) : at_(begin), end_(end) {}
  int64_t Int() {
    if (at_ >= end_) Fail("the spec ends early");
    return *at_++;
  }
  memory::dims Dims(int64_t count) {
    memory::dims dims;
    for (int64_t i = 0; i < count; ++i) dims.push_back(Int());
    return dims;
  }
  double Float() {
    int64_t bits = Int();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  }
  // A memory descriptor stored as kDescWords words, or none (a leading 0).
  bool Desc(memory::desc* desc) {
    if (Int() == 0) return false;
    if (end_ - at_ < kDescWords) Fail("the spec ends inside a memory descriptor");
    std::memcpy(&desc->data, at_, sizeof(dnnl_memory_desc_t));
    at_ += kDescWords;
    return true;
  }
  void ExpectEnd() const {
    if (at_ != end_) Fail("the spec has trailing words");
  }

 private:
  const int64_t* at_;
  const int64_t* end_;
};

memory::desc Plain(const memory::dims& dims, memory::data_type type = memory::data_type::f32) {
  memory::dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return memory::desc(dims, type, strides);
}

memory::data_type OperandDataType(int64_t word) {
  if (word == kF32Operands) return memory::data_type::f32;
  if (word == kBf16Operands) return memory::data_type::bf16;
  Fail("unknown operand type in the spec");
}

size_t ByteSize(const DLTensor* tensor) {
  size_t count = 1;
  for (int i = 0; i < tensor->ndim; ++i) count *= static_cast<size_t>(tensor->shape[i]);
  return count * ((tensor->dtype.bits * tensor->dtype.lanes + 7) / 8);
}

// `tensor` seen through `desc`; its size must be the size `desc` describes.
memory Wrap(const memory::desc& desc, DLTensor* tensor, const char* role) {
  if (tensor->device.device_type != kDLCPU) Fail(std::string(role) + " is not on the CPU");
  if (tensor->strides != nullptr) {
    for (int i = tensor->ndim - 1, expected = 1; i >= 0; expected *= tensor->shape[i], --i) {
      if (tensor->shape[i] != 1 && tensor->strides[i] != expected) Fail(std::string(role) + " is not contiguous");
    }
  }
  if (ByteSize(tensor) != desc.get_size()) {
    Fail(std::string(role) + " has " + std::to_string(ByteSize(tensor)) + " bytes where the kernel expects " +
         std::to_string(desc.get_size()));
  }
  return memory(desc, Engine(), static_cast<char*>(tensor->data) + tensor->byte_offset);
}

dnnl::post_ops PostOps(bool residual, const memory::desc& dst, int64_t eltwise, double scale) {
  dnnl::post_ops post_ops;
  if (scale != 1.0) post_ops.append_eltwise(1.f, algorithm::eltwise_linear, static_cast<float>(scale), 0.f);
  if (residual) post_ops.append_binary(algorithm::binary_add, dst);
  if (eltwise == kRelu) post_ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  if (eltwise == kGeluErf) post_ops.append_eltwise(1.f, algorithm::eltwise_gelu_erf, 0.f, 0.f);
  if (eltwise != kNoEltwise && eltwise != kRelu && eltwise != kGeluErf) Fail("unknown elementwise post-op");
  return post_ops;
}

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Operands then outputs, as the VM passes them after the spec.
  virtual size_t Arity() const = 0;
  virtual void Run(DLTensor** tensors) = 0;
  // oneDNN's name for the implementation it chose (e.g. "jit:avx512_core", "gemm:jit", "ref:any").
  virtual std::string Implementation() const = 0;
};

// Scratch memory for activations in oneDNN's blocked layouts, reused call after call by one thread.
class Scratch {
 public:
  void* Get(int slot, size_t bytes) {
    Buffer& buffer = buffers_[slot];
    if (buffer.bytes < bytes) {
      buffer.data.reset(static_cast<char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      if (!buffer.data) Fail("out of memory for " + std::to_string(bytes) + " bytes of scratch");
      buffer.bytes = bytes;
    }
    return buffer.data.get();
  }

 private:
  struct Free {
    void operator()(char* data) const { std::free(data); }
  };
  struct Buffer {
    std::unique_ptr<char, Free> data;
    size_t bytes = 0;
  };
  Buffer buffers_[2];
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

// conv2d (NCHW data, OIHW weights, any groups) + bias + residual add + ReLU, in that order.
// Two layouts, named in the spec: kPlainActivations runs on NCHW data and output as they are
// (oneDNN's GEMM convolution, often faster for 1x1 kernels); kBlockedActivations lets oneDNN
// pick the data and output layouts too (blocked ones on AVX-512) and reorders around the
// convolution. Either way oneDNN picks the weights' layout, and a residual is added by placing
// it in the output buffer first (oneDNN's sum post-op), which its fast kernels fuse.
// Data and weights are float32 or bfloat16 (named in the spec); bias, residual and output float32.
// Spec: operand-type N C H W O KH KW groups OH OW stride(2) dilation(2) padding(t l b r) bias residual relu layout [weights desc]
class Conv2d : public Kernel {
 public:
  explicit Conv2d(SpecReader& spec) {
    memory::data_type operand_type = OperandDataType(spec.Int());
    int64_t n = spec.Int(), c = spec.Int(), h = spec.Int(), w = spec.Int(), o = spec.Int();
    int64_t kh = spec.Int(), kw = spec.Int(), groups = spec.Int(), oh = spec.Int(), ow = spec.Int();
    memory::dims strides = spec.Dims(2), dilation = spec.Dims(2), padding = spec.Dims(4);
    has_bias_ = spec.Int() != 0;
    has_residual_ = spec.Int() != 0;
    bool relu = spec.Int() != 0;
    int64_t layout = spec.Int();
    if (layout != kPlainActivations && layout != kBlockedActivations) Fail("unknown convolution layout");
    if (groups < 1 || c % groups != 0 || o % groups != 0) Fail("channels not divisible by groups");
    memory::dims weights = groups == 1 ? memory::dims{o, c, kh, kw} : memory::dims{groups, o / groups, c / groups, kh, kw};
    src_ = Plain({n, c, h, w}, operand_type);
    dst_ = Plain({n, o, oh, ow});
    plain_weights_ = Plain(weights, operand_type);
    bias_ = has_bias_ ? Plain({o}) : memory::desc();
    dnnl::post_ops post_ops;
    if (has_residual_) post_ops.append_sum(1.f);
    if (relu) post_ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(post_ops);
    auto any = [](const memory::dims& dims, memory::data_type type) { return memory::desc(dims, type, memory::format_tag::any); };
    bool blocked = layout == kBlockedActivations;
    dnnl::convolution_forward::desc desc(prop_kind::forward_inference, algorithm::convolution_direct,
                                         blocked ? any({n, c, h, w}, operand_type) : src_, any(weights, operand_type), bias_,
                                         blocked ? any({n, o, oh, ow}, memory::data_type::f32) : dst_, strides, {dilation[0] - 1, dilation[1] - 1},
                                         {padding[0], padding[1]}, {padding[2], padding[3]});
    pd_ = dnnl::convolution_forward::primitive_desc(desc, attr, Engine());
    primitive_ = dnnl::convolution_forward(pd_);
    if (!spec.Desc(&given_weights_)) given_weights_ = plain_weights_;
    spec.ExpectEnd();
    if (given_weights_ != pd_.weights_desc()) repack_ = Reorder(given_weights_, pd_.weights_desc());
    if (pd_.src_desc() != src_) src_in_ = Reorder(src_, pd_.src_desc());
    if (pd_.dst_desc() != dst_) {
      dst_out_ = Reorder(pd_.dst_desc(), dst_);
      if (has_residual_) residual_in_ = Reorder(dst_, pd_.dst_desc());
    }
  }

  size_t Arity() const override { return 3 + has_bias_ + has_residual_; }
  std::string Implementation() const override { return pd_.impl_info_str(); }

  void Run(DLTensor** tensors) override {
    size_t at = 0;
    std::unordered_map<int, memory> args;
    memory src = Wrap(src_, tensors[at++], "conv2d data");
    if (src_in_) {
      memory blocked(pd_.src_desc(), Engine(), ThreadScratch().Get(0, pd_.src_desc().get_size()));
      src_in_.execute(Stream(), src, blocked);
      src = blocked;
    }
    args[DNNL_ARG_SRC] = src;
    memory given = Wrap(given_weights_, tensors[at++], "conv2d weights");
    if (repack_) {
      memory repacked(pd_.weights_desc(), Engine());
      repack_.execute(Stream(), given, repacked);
      args[DNNL_ARG_WEIGHTS] = repacked;
    } else {
      args[DNNL_ARG_WEIGHTS] = given;
    }
    if (has_bias_) args[DNNL_ARG_BIAS] = Wrap(bias_, tensors[at++], "conv2d bias");
    DLTensor* residual = has_residual_ ? tensors[at++] : nullptr;
    memory out = Wrap(dst_, tensors[at++], "conv2d output");
    memory dst = dst_out_ ? memory(pd_.dst_desc(), Engine(), ThreadScratch().Get(1, pd_.dst_desc().get_size())) : out;
    if (residual != nullptr) {
      memory added = Wrap(dst_, residual, "residual");
      if (residual_in_) {
        residual_in_.execute(Stream(), added, dst);
      } else if (added.get_data_handle() != dst.get_data_handle()) {
        std::memcpy(dst.get_data_handle(), added.get_data_handle(), dst_.get_size());
      }
    }
    args[DNNL_ARG_DST] = dst;
    primitive_.execute(Stream(), args);
    if (dst_out_) dst_out_.execute(Stream(), dst, out);
    Stream().wait();
  }

  // The weights in the layout this CPU's primitive reads them in: its descriptor, then the data.
  std::string Pack(DLTensor* weights) const {
    memory plain = Wrap(plain_weights_, weights, "conv2d weights");
    memory packed(pd_.weights_desc(), Engine());
    dnnl::reorder(plain, packed).execute(Stream(), plain, packed);
    Stream().wait();
    std::string blob(kDescWords * sizeof(int64_t), '\0');
    dnnl_memory_desc_t desc = pd_.weights_desc().data;
    std::memcpy(&blob[0], &desc, sizeof(desc));
    blob.append(static_cast<const char*>(packed.get_data_handle()), pd_.weights_desc().get_size());
    return blob;
  }

 private:
  static dnnl::reorder Reorder(const memory::desc& from, const memory::desc& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), from, Engine(), to));
  }

  bool has_bias_, has_residual_;
  memory::desc src_, dst_, bias_, plain_weights_, given_weights_;
  dnnl::convolution_forward::primitive_desc pd_;
  dnnl::primitive primitive_;
  dnnl::reorder repack_, src_in_, dst_out_, residual_in_;
};

// matmul with any strides on its operands (transposes absorbed), optional bias, scale, residual, activation.
// Operands float32 or bfloat16 (named in the spec); bias, residual and output float32.
// Spec: operand-type rank src(dims, strides) weights(dims, strides) dst(dims) bias(0 | 1 dims) scale eltwise residual
class Matmul : public Kernel {
 public:
  explicit Matmul(SpecReader& spec) {
    memory::data_type operand_type = OperandDataType(spec.Int());
    int64_t rank = spec.Int();
    memory::dims src_dims = spec.Dims(rank), src_strides = spec.Dims(rank);
    memory::dims weights_dims = spec.Dims(rank), weights_strides = spec.Dims(rank);
    memory::dims dst_dims = spec.Dims(rank);
    has_bias_ = spec.Int() != 0;
    if (has_bias_) bias_ = Plain(spec.Dims(rank));
    double scale = spec.Float();
    int64_t eltwise = spec.Int();
    has_residual_ = spec.Int() != 0;
    spec.ExpectEnd();
    src_ = memory::desc(src_dims, operand_type, src_strides);
    weights_ = memory::desc(weights_dims, operand_type, weights_strides);
    dst_ = Plain(dst_dims);
    dnnl::primitive_attr attr;
    attr.set_post_ops(PostOps(has_residual_, dst_, eltwise, scale));
    dnnl::matmul::desc desc(src_, weights_, bias_, dst_);
    pd_ = dnnl::matmul::primitive_desc(desc, attr, Engine());
    primitive_ = dnnl::matmul(pd_);
  }

  size_t Arity() const override { return 3 + has_bias_ + has_residual_; }
  std::string Implementation() const override { return pd_.impl_info_str(); }

  void Run(DLTensor** tensors) override {
    size_t at = 0;
    std::unordered_map<int, memory> args;
    args[DNNL_ARG_SRC] = Wrap(src_, tensors[at++], "matmul lhs");
    args[DNNL_ARG_WEIGHTS] = Wrap(weights_, tensors[at++], "matmul rhs");
    if (has_bias_) args[DNNL_ARG_BIAS] = Wrap(bias_, tensors[at++], "matmul bias");
    if (has_residual_) args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = Wrap(dst_, tensors[at++], "residual");
    args[DNNL_ARG_DST] = Wrap(dst_, tensors[at++], "matmul output");
    primitive_.execute(Stream(), args);
    Stream().wait();
  }

 private:
  bool has_bias_, has_residual_;
  memory::desc src_, weights_, bias_, dst_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::primitive primitive_;
};

// Spec: algorithm N C H W OH OW KH KW stride(2) dilation(2) padding(t l b r)
class Pool2d : public Kernel {
 public:
  explicit Pool2d(SpecReader& spec) {
    int64_t kind = spec.Int();
    memory::dims src_dims = spec.Dims(4);
    int64_t oh = spec.Int(), ow = spec.Int();
    memory::dims kernel = spec.Dims(2), strides = spec.Dims(2), dilation = spec.Dims(2), padding = spec.Dims(4);
    spec.ExpectEnd();
    algorithm alg = kind == kMax ? algorithm::pooling_max
                    : kind == kAvgIncludePad ? algorithm::pooling_avg_include_padding
                                             : algorithm::pooling_avg_exclude_padding;
    src_ = Plain(src_dims);
    dst_ = Plain({src_dims[0], src_dims[1], oh, ow});
    dnnl::pooling_v2_forward::desc desc(prop_kind::forward_inference, alg, src_, dst_, strides, kernel,
                                        {dilation[0] - 1, dilation[1] - 1}, {padding[0], padding[1]}, {padding[2], padding[3]});
    pd_ = dnnl::pooling_v2_forward::primitive_desc(desc, Engine());
    primitive_ = dnnl::pooling_v2_forward(pd_);
  }
  size_t Arity() const override { return 2; }
  std::string Implementation() const override { return pd_.impl_info_str(); }
  void Run(DLTensor** tensors) override {
    primitive_.execute(Stream(), {{DNNL_ARG_SRC, Wrap(src_, tensors[0], "pooling data")},
                                  {DNNL_ARG_DST, Wrap(dst_, tensors[1], "pooling output")}});
    Stream().wait();
  }

 private:
  memory::desc src_, dst_;
  dnnl::pooling_v2_forward::primitive_desc pd_;
  dnnl::primitive primitive_;
};

// Spec: rank dims axis
class Softmax : public Kernel {
 public:
  explicit Softmax(SpecReader& spec) {
    int64_t rank = spec.Int();
    data_ = Plain(spec.Dims(rank));
    int axis = static_cast<int>(spec.Int());
    spec.ExpectEnd();
    dnnl::softmax_forward::desc desc(prop_kind::forward_inference, data_, axis);
    pd_ = dnnl::softmax_forward::primitive_desc(desc, Engine());
    primitive_ = dnnl::softmax_forward(pd_);
  }
  size_t Arity() const override { return 2; }
  std::string Implementation() const override { return pd_.impl_info_str(); }
  void Run(DLTensor** tensors) override {
    primitive_.execute(Stream(), {{DNNL_ARG_SRC, Wrap(data_, tensors[0], "softmax data")},
                                  {DNNL_ARG_DST, Wrap(data_, tensors[1], "softmax output")}});
    Stream().wait();
  }

 private:
  memory::desc data_;
  dnnl::softmax_forward::primitive_desc pd_;
  dnnl::primitive primitive_;
};

// Layer normalization over the last axis with scale and shift. Spec: rank dims epsilon
class LayerNorm : public Kernel {
 public:
  explicit LayerNorm(SpecReader& spec) {
    int64_t rank = spec.Int();
    memory::dims dims = spec.Dims(rank);
    float epsilon = static_cast<float>(spec.Float());
    spec.ExpectEnd();
    data_ = Plain(dims);
    affine_ = Plain({dims.back()});
    dnnl::layer_normalization_forward::desc desc(prop_kind::forward_inference, data_, epsilon,
                                                 dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
    pd_ = dnnl::layer_normalization_forward::primitive_desc(desc, Engine());
    primitive_ = dnnl::layer_normalization_forward(pd_);
  }
  size_t Arity() const override { return 4; }
  std::string Implementation() const override { return pd_.impl_info_str(); }
  void Run(DLTensor** tensors) override {
    memory mean(pd_.mean_desc(), Engine()), variance(pd_.variance_desc(), Engine());
    primitive_.execute(Stream(), {{DNNL_ARG_SRC, Wrap(data_, tensors[0], "layer_norm data")},
                                  {DNNL_ARG_SCALE, Wrap(affine_, tensors[1], "layer_norm gamma")},
                                  {DNNL_ARG_SHIFT, Wrap(affine_, tensors[2], "layer_norm beta")},
                                  {DNNL_ARG_MEAN, mean},
                                  {DNNL_ARG_VARIANCE, variance},
                                  {DNNL_ARG_DST, Wrap(data_, tensors[3], "layer_norm output")}});
    Stream().wait();
  }

 private:
  memory::desc data_, affine_;
  dnnl::layer_normalization_forward::primitive_desc pd_;
  dnnl::primitive primitive_;
};

std::string SpecKey(const DLTensor* spec) {
  if (spec->dtype.code != kDLInt || spec->dtype.bits != 64 || spec->ndim != 1) Fail("the spec is not a 1-d int64 tensor");
  return std::string(static_cast<const char*>(spec->data) + spec->byte_offset, ByteSize(spec));
}

std::unique_ptr<Kernel> CreateKernel(const std::string& key) {
  const int64_t* words = reinterpret_cast<const int64_t*>(key.data());
  SpecReader spec(words, words + key.size() / sizeof(int64_t));
  if (spec.Int() != kSpecVersion) Fail("the spec was written for another version of this library");
  try {
    switch (spec.Int()) {
      case kConv2d: return std::make_unique<Conv2d>(spec);
      case kMatmul: return std::make_unique<Matmul>(spec);
      case kPool2d: return std::make_unique<Pool2d>(spec);
      case kSoftmax: return std::make_unique<Softmax>(spec);
      case kLayerNorm: return std::make_unique<LayerNorm>(spec);
      default: Fail("unknown operator in the spec");
    }
  } catch (const dnnl::error& error) {
    Fail(std::string("oneDNN cannot create the primitive: ") + error.what());
  }
}

collage::KernelCache<Kernel>& Kernels() { return collage::ProcessKernels<Kernel>(kMaxKernels); }

void RunPacked(tvm::ffi::PackedArgs args, tvm::ffi::Any* result) {
  if (args.size() < 1) Fail("collage_dnnl.run needs a spec");
  std::vector<DLTensor*> tensors;
  for (int i = 0; i < args.size(); ++i) tensors.push_back(args[i].cast<DLTensor*>());
  std::string key = SpecKey(tensors[0]);
  Kernel* kernel = Kernels().Get(key, [&] { return CreateKernel(key); });
  if (tensors.size() - 1 != kernel->Arity()) {
    Fail("the kernel takes " + std::to_string(kernel->Arity()) + " tensors but was passed " + std::to_string(tensors.size() - 1));
  }
  try {
    kernel->Run(tensors.data() + 1);
  } catch (const dnnl::error& error) {
    Fail(std::string("oneDNN failed: ") + error.what());
  }
}

tvm::ffi::Bytes PackWeights(DLTensor* spec, DLTensor* weights) {
  std::unique_ptr<Kernel> kernel = CreateKernel(SpecKey(spec));
  auto* conv = dynamic_cast<Conv2d*>(kernel.get());
  if (conv == nullptr) Fail("only convolution weights are packed");
  return tvm::ffi::Bytes(conv->Pack(weights));
}

}  // namespace
}  // namespace collage_dnnl

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef()
      .def_packed("collage_dnnl.run", collage_dnnl::RunPacked)
      .def("collage_dnnl.pack_weights", collage_dnnl::PackWeights)
      .def("collage_dnnl.implementation",
           [](DLTensor* spec) { return collage_dnnl::CreateKernel(collage_dnnl::SpecKey(spec))->Implementation(); })
      .def("collage_dnnl.kernel_count", []() { return static_cast<int64_t>(collage_dnnl::Kernels().Size()); })
      .def("collage_dnnl.descriptor_words", []() { return collage_dnnl::kDescWords; })
      .def("collage_dnnl.onednn_version", []() {
        const dnnl_version_t* version = dnnl_version();
        return std::to_string(version->major) + "." + std::to_string(version->minor) + "." + std::to_string(version->patch);
      });
}
