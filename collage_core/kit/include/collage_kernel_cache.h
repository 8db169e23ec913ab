// One kernel per key, made on its first call and kept for the process: the cache DNNL's, cuBLAS's and
// cuDNN's kernels share. A plugin's NativeLibrary names it in `headers` (collage_core.kit.KERNEL_CACHE_HEADER),
// which puts its folder on the include path and its text in the library's digest.
#ifndef COLLAGE_KERNEL_CACHE_H_
#define COLLAGE_KERNEL_CACHE_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace collage {

// Kernels by key. `Get` makes the kernel of a new key with `make()` under the lock, so two threads never make
// one kernel twice; with a capacity, a full cache is emptied before a new kernel is added.
template <typename Kernel>
class KernelCache {
 public:
  explicit KernelCache(size_t capacity = 0) : capacity_(capacity) {}

  template <typename Make>
  Kernel* Get(const std::string& key, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = kernels_.find(key);
    if (found != kernels_.end()) return found->second.get();
    if (capacity_ > 0 && kernels_.size() >= capacity_) kernels_.clear();
    return kernels_.emplace(key, make()).first->second.get();
  }

  size_t Size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return kernels_.size();
  }

 private:
  size_t capacity_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Kernel>> kernels_;
};

// The process's cache of `Kernel`s, made on first use (with `capacity`) and never destroyed: kernels hold
// library handles and primitives that must outlive the static teardown order.
template <typename Kernel>
KernelCache<Kernel>& ProcessKernels(size_t capacity = 0) {
  static KernelCache<Kernel>* cache = new KernelCache<Kernel>(capacity);
  return *cache;
}

// `key` with the device's ordinal appended: one kernel per spec and device.
inline std::string DeviceKey(const std::string& key, int device) {
  return key + std::string(reinterpret_cast<const char*>(&device), sizeof(device));
}

}  // namespace collage

#endif  // COLLAGE_KERNEL_CACHE_H_
