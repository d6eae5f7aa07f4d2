#include "metrics/digest.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/util/sha256.h"
#include "cpdrift/bf16.h"

namespace cpd {
namespace {

// Hashes a tensor's segments in the order they are fed, in `format`.
class TensorHasher {
 public:
  explicit TensorHasher(DigestFormat format) : format_(format) {}

  void update(const float* rows, std::size_t n) {
    if (format_ == DigestFormat::fp32) {
      sha_.update(rows, n * sizeof(float));
      return;
    }
    // Each value's BF16 pattern (rounded to nearest even: the values are BF16-exact), a piece
    // at a time in a buffer that stays in cache.
    for (std::size_t done = 0; done < n;) {
      const std::size_t m = std::min(staging_.size(), n - done);
      for (std::size_t j = 0; j < m; ++j)
        staging_[j] = static_cast<std::uint16_t>(bf16_bits_rn_select(bits_of(rows[done + j])));
      sha_.update(staging_.data(), m * sizeof(std::uint16_t));
      done += m;
    }
  }
  std::string finish() { return Sha256::hex(sha_.finish()); }

 private:
  DigestFormat format_;
  Sha256 sha_;
  std::array<std::uint16_t, 16384> staging_{};  // 32 KiB of patterns
};

}  // namespace

std::string stream_digest(const Collectives& coll, const GlobalTensor& tensor, DigestFormat format,
                          const PieceSink& also) {
  TensorHasher hasher(format);
  coll.stream_to_root(tensor.segments, [&](std::size_t i, const float* rows) {
    hasher.update(rows, tensor.segments[i].floats);
    if (also) also(tensor.pieces[i], rows);
  });
  return coll.root() ? hasher.finish() : std::string();
}

bool held_by_root(const GlobalTensor& tensor) {
  return std::all_of(tensor.segments.begin(), tensor.segments.end(),
                     [](const StreamSegment& s) { return s.owner == 0; });
}

std::string local_digest(const GlobalTensor& tensor, DigestFormat format) {
  TensorHasher hasher(format);
  for (const StreamSegment& s : tensor.segments) hasher.update(s.data, s.floats);
  return hasher.finish();
}

std::string values_digest(std::span<const float> values, DigestFormat format) {
  TensorHasher hasher(format);
  hasher.update(values.data(), values.size());
  return hasher.finish();
}

}  // namespace cpd
