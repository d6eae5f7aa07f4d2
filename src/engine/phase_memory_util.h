// The phase memory functions' shared arithmetic (phase_memory.cpp, layer_phase_memory.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/memory_plan.h"

namespace cpd::phase_memory_util {

inline constexpr std::uint64_t kFloat = sizeof(float);

inline std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(v); }

inline std::int64_t rows_of(const std::vector<Range>& tokens) {
  std::int64_t n = 0;
  for (const Range& t : tokens) n += t.size();
  return n;
}

// A rank's query-side (q, out, dq: [B][Hq][T][D]), lse-side and KV-side (k, v, dk, dv) shards.
struct RankSizes {
  std::uint64_t q = 0, lse = 0, kv = 0;
  std::uint64_t attention() const { return q + lse; }  // out + lse
};

inline RankSizes sizes_of(const Problem& p, const LogicalRank& r) {
  const std::int64_t t = rows_of(r.tokens), d = p.dims.head_dim;
  return RankSizes{tensor_bytes(p.batch, r.q_heads.size(), t, d),
                   tensor_bytes(p.batch, r.q_heads.size(), t, 1),
                   tensor_bytes(p.batch, r.kv_heads.size(), t, d)};
}

// `fn(rank, sizes)` summed over the ranks process `proc` hosts.
template <class Fn>
std::uint64_t each(CaseMemory& m, std::size_t proc, Fn&& fn) {
  std::uint64_t n = 0;
  for (const LogicalRank* r : m.hosted(proc)) n += fn(*r, sizes_of(m.problem(), *r));
  return n;
}

}  // namespace cpd::phase_memory_util
