#include "cpdrift/metrics/digest.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "cpdrift/numerics/bf16.h"
#include "cpdrift/util/sha256.h"

namespace cpd {
namespace {

struct Segment {
  Range tokens;
  const Shard* shard;
};

void hash_rows(Sha256& sha, const float* rows, std::size_t count, DigestFormat format,
               std::vector<std::uint16_t>& staging) {
  if (format == DigestFormat::fp32) {
    sha.update(rows, count * sizeof(float));  // x86-64 and CUDA devices are little-endian
    return;
  }
  staging.resize(count);
  for (std::size_t i = 0; i < count; ++i) staging[i] = bf16_bits_rn(rows[i]);
  sha.update(staging.data(), count * sizeof(std::uint16_t));
}

}  // namespace

std::string global_digest(std::span<const Shard* const> shards, int heads, std::int64_t seq_len,
                          DigestFormat format) {
  if (shards.empty()) throw std::invalid_argument("global_digest: no shards");
  const int batch = shards.front()->shape.batch;
  Sha256 sha;
  std::vector<std::uint16_t> staging;
  for (int b = 0; b < batch; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      std::vector<Segment> segments;
      for (const Shard* s : shards) {
        if (!s->shape.heads.contains(h)) continue;
        for (const Range& t : s->shape.tokens) segments.push_back(Segment{t, s});
      }
      std::sort(segments.begin(), segments.end(),
                [](const Segment& x, const Segment& y) { return x.tokens.begin < y.tokens.begin; });
      std::int64_t next = 0;
      for (const Segment& seg : segments) {
        if (seg.tokens.begin != next) {
          throw std::invalid_argument("global_digest: shards leave a gap or overlap at head " +
                                      std::to_string(h) + ", token " + std::to_string(next));
        }
        const std::int64_t width = seg.shard->shape.width;
        hash_rows(sha, seg.shard->at(b, h, seg.shard->shape.local_row(seg.tokens.begin)),
                  static_cast<std::size_t>(seg.tokens.size() * width), format, staging);
        next = seg.tokens.end;
      }
      if (next != seq_len) {
        throw std::invalid_argument("global_digest: shards end at token " + std::to_string(next) +
                                    " of " + std::to_string(seq_len));
      }
    }
  }
  return Sha256::hex(sha.finish());
}

}  // namespace cpd
