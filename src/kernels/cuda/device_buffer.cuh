// An owning device allocation (cudaMalloc), moved not copied.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"

namespace cpd {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    release();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  /// Reallocates (contents lost) when `n` differs from the current size.
  void resize(std::size_t n) {
    if (n == size_) return;
    release();
    if (n > 0) CPD_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T)));
    size_ = n;
  }
  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  std::size_t size() const { return size_; }

  void upload(const T* host, std::size_t n, std::size_t offset = 0) {
    if (n > 0)
      CPD_CUDA_CHECK(cudaMemcpy(ptr_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host, std::size_t n, std::size_t offset = 0) const {
    if (n > 0)
      CPD_CUDA_CHECK(cudaMemcpy(host, ptr_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  static DeviceBuffer from(const std::vector<T>& host) {
    DeviceBuffer b(host.size());
    b.upload(host.data(), host.size());
    return b;
  }

 private:
  void release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cpd
