// Moving the engine's host jobs to the device and back: ranges of host floats are packed into
// one device buffer (identical ranges once), outputs are gathered into one device buffer and
// scattered back to their host places after the kernels ran.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cpdrift/bf16.h"
#include "kernels/cuda/device_buffer.cuh"

namespace cpd::cuda {

/// Host input ranges packed into one device array of T (float, or BF16 bits).
template <class T>
class InputPack {
 public:
  /// Registers [p, p + n); returns its offset in the pack. The same range twice is packed once.
  std::size_t add(const float* p, std::size_t n) {
    const auto key = std::make_pair(p, n);
    if (const auto it = offsets_.find(key); it != offsets_.end()) return it->second;
    const std::size_t at = size_;
    offsets_.emplace(key, at);
    ranges_.push_back({p, n, at});
    size_ += n;
    return at;
  }
  /// Copies everything to the device (one transfer); device pointers are data() + offset.
  void upload() {
    std::vector<T> host(size_);
    for (const Range& r : ranges_) {
      for (std::size_t i = 0; i < r.n; ++i) {
        if constexpr (sizeof(T) == 2) {
          host[r.at + i] = bf16_bits_rn(r.p[i]);  // the values are BF16-exact: no rounding happens
        } else {
          host[r.at + i] = r.p[i];
        }
      }
    }
    device_.resize(size_);
    device_.upload(host.data(), host.size());
  }
  const T* at(std::size_t offset) const { return device_.data() + offset; }

 private:
  struct Range {
    const float* p;
    std::size_t n, at;
  };
  std::map<std::pair<const float*, std::size_t>, std::size_t> offsets_;
  std::vector<Range> ranges_;
  std::size_t size_ = 0;
  DeviceBuffer<T> device_;
};

/// Host output ranges, computed into one device array and scattered back.
class OutputPack {
 public:
  /// `initialized`: the kernels read the range's host values first (they continue a fold).
  std::size_t add(float* p, std::size_t n, bool initialized = false) {
    const std::size_t at = size_;
    ranges_.push_back({p, n, at, initialized});
    size_ += n;
    return at;
  }
  /// The device array, with the initialized ranges' host values in place.
  void allocate() {
    device_.resize(size_);
    for (const Range& r : ranges_) {
      if (r.initialized) device_.upload(r.p, r.n, r.at);
    }
  }
  float* at(std::size_t offset) { return device_.data() + offset; }
  void download() {
    std::vector<float> host(size_);
    device_.download(host.data(), host.size());
    for (const Range& r : ranges_) {
      for (std::size_t i = 0; i < r.n; ++i) r.p[i] = host[r.at + i];
    }
  }

 private:
  struct Range {
    float* p;
    std::size_t n, at;
    bool initialized;
  };
  std::vector<Range> ranges_;
  std::size_t size_ = 0;
  DeviceBuffer<float> device_;
};

/// A host vector of plain structs copied to the device.
template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  return DeviceBuffer<T>::from(host);
}

}  // namespace cpd::cuda
