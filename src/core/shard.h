// Tensor shards: the part of a global [B, H, S, W] tensor one logical rank holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/float_buffer.h"
#include "core/range.h"

namespace cpd {

/// Tag: a Shard whose every element its producer writes (no zeros first).
struct Uninitialized {};

/// Which part of a global [batch, heads, seq, width] tensor a buffer holds: all batches, the
/// heads in `heads`, the sequence positions of `tokens` (ascending, concatenated) and the full
/// width (head_dim for out/q/k/v, 1 for lse). Layout: [b][h - heads.begin][token][w].
struct ShardShape {
  int batch = 1;
  Range heads;
  std::vector<Range> tokens;
  int width = 1;

  std::int64_t rows() const { return total_size(tokens); }
  std::size_t size() const {
    return static_cast<std::size_t>(batch) * heads.size() * rows() * width;
  }
  /// Element offset of (b, global head h, local token row t, w = 0).
  std::size_t offset(int b, std::int64_t h, std::int64_t t) const {
    return ((static_cast<std::size_t>(b) * heads.size() + (h - heads.begin)) * rows() + t) * width;
  }
  /// Local row of global position `pos`, or -1 when the shard does not hold it.
  std::int64_t local_row(std::int64_t pos) const {
    std::int64_t base = 0;
    for (const Range& r : tokens) {
      if (r.contains(pos)) return base + (pos - r.begin);
      base += r.size();
    }
    return -1;
  }
  friend bool operator==(const ShardShape&, const ShardShape&) = default;
};

struct Shard {
  ShardShape shape;
  FloatBuffer data;

  Shard() = default;
  explicit Shard(ShardShape s) : shape(std::move(s)), data(shape.size(), 0.0f) {}
  /// Elements unwritten, for a producer that writes every one (NaN in a sanitized build).
  Shard(ShardShape s, Uninitialized) : shape(std::move(s)), data(unwritten_floats(shape.size())) {}
  float* at(int b, std::int64_t h, std::int64_t t) { return data.data() + shape.offset(b, h, t); }
  const float* at(int b, std::int64_t h, std::int64_t t) const {
    return data.data() + shape.offset(b, h, t);
  }
};

/// The attention output of a set of query rows: out [.., head_dim] and lse [.., 1].
struct AttnShard {
  Shard out;
  Shard lse;

  /// Out of shape `out` and lse of its rows (width 1), elements unwritten, for a producer that
  /// writes every row.
  static AttnShard unwritten(const ShardShape& out) {
    ShardShape lse = out;
    lse.width = 1;
    return AttnShard{Shard(out, Uninitialized{}), Shard(std::move(lse), Uninitialized{})};
  }
};

/// Copies rows `tokens` of heads `heads` from `from` into `to` at the same coordinates (both
/// hold them).
inline void copy_rows(const Shard& from, Shard& to, const Range& heads, const Range& tokens) {
  const std::int64_t from_row = from.shape.local_row(tokens.begin);
  const std::int64_t to_row = to.shape.local_row(tokens.begin);
  const std::size_t n = static_cast<std::size_t>(tokens.size()) * to.shape.width;
  for (int b = 0; b < to.shape.batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h)
      std::memcpy(to.at(b, h, to_row), from.at(b, h, from_row), n * sizeof(float));
  }
}

}  // namespace cpd
