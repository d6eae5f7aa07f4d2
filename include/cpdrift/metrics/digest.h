// SHA-256 digests of global tensors held as shards, in global order, so that two runs, two
// topologies or two machines can be compared by digest alone (design §5).
#pragma once

#include <span>
#include <string>

#include "cpdrift/core/shard.h"

namespace cpd {

/// How a tensor's elements are written into the digest.
enum class DigestFormat {
  fp32,  // 4 little-endian bytes per element
  bf16,  // the 2-byte BF16 pattern (the values must be BF16-exact: a BF16 final write)
};

/// SHA-256 (hex) of the global [batch, heads, seq_len, width] tensor whose pieces are
/// `shards`, element by element in (b, h, s, w) order. The shards must tile the tensor
/// exactly; a gap or an overlap throws std::invalid_argument.
std::string global_digest(std::span<const Shard* const> shards, int heads, std::int64_t seq_len,
                          DigestFormat format);

}  // namespace cpd
