#include "engine/paged/paged_attention.h"

#include <algorithm>
#include <deque>
#include <functional>

namespace cpd {
namespace {

// One call of a lane on one sequence: query rows [first, first + rows) against context [0, ctx).
struct Call {
  std::int64_t first, rows, ctx;
};

// Query chunks of the contiguous chunked prefill: kChunkPages pages, deliberately not a
// multiple of the default fixed split, so chunk ends cut through KV blocks.
constexpr std::int64_t kChunkPages = 3;

std::vector<Call> calls_of(PagedCall call, std::int64_t kv_len, std::int64_t q_len,
                           std::int64_t chunk) {
  const std::int64_t q0 = kv_len - q_len;  // the first query row
  switch (call) {
    case PagedCall::chunked_prefill: {
      // Of each chunk, its query rows: the kernels are row-independent, so the chunk's rows
      // before them would change no bit of these.
      std::vector<Call> chunks;
      for (std::int64_t a = q0 / chunk * chunk; a < kv_len; a += chunk) {
        const std::int64_t first = std::max(a, q0), end = std::min(a + chunk, kv_len);
        chunks.push_back(Call{first, end - first, end});
      }
      return chunks;
    }
    case PagedCall::decode: {
      std::vector<Call> steps;
      for (std::int64_t t = q0; t < kv_len; ++t) steps.push_back(Call{t, 1, t + 1});
      return steps;
    }
    case PagedCall::paged_prefill:
      return {Call{q0, q_len, kv_len}};
    case PagedCall::full_prefill:
      return {Call{0, kv_len, kv_len}};
  }
  return {};
}

// Sequence seq's K and V rows of KV head h, paged (read in place through the block table) or
// contiguous; valid until the lane's jobs have run.
using KvSource = std::function<std::pair<KvRows, KvRows>(int seq, std::int64_t h)>;

AttnShard run_lane(const Lane& lane, std::span<const std::int64_t> kv_lens, std::int64_t q_len,
                   int page_size, const Shard& q, std::span<const int> q_batch, Range kv_heads,
                   int group, float scale, const KvSource& source, AttentionBackend& backend,
                   std::vector<std::vector<Range>>* plans_used = nullptr) {
  const int dim = q.shape.width, seqs = static_cast<int>(kv_lens.size());
  if (plans_used != nullptr) plans_used->assign(static_cast<std::size_t>(seqs), {});
  // Output row 0 of a sequence is its first query row, or position 0 for the full prefill.
  const auto row0 = [&](std::int64_t len) {
    return lane.call == PagedCall::full_prefill ? 0 : len - q_len;
  };
  const std::int64_t chunk = kChunkPages * page_size;
  std::int64_t rows = 0;
  for (const std::int64_t len : kv_lens) rows = std::max(rows, len - row0(len));
  const Range q_heads{kv_heads.begin * group, kv_heads.end * group};
  AttnShard out{Shard(ShardShape{seqs, q_heads, {Range{0, rows}}, dim}),
                Shard(ShardShape{seqs, q_heads, {Range{0, rows}}, 1})};
  std::deque<std::vector<Range>> plans;  // stable addresses for the jobs' spans
  std::vector<FoldJob> jobs;
  for (int s = 0; s < seqs; ++s) {
    const std::int64_t len = kv_lens[static_cast<std::size_t>(s)];
    const std::int64_t first_row = row0(len);
    for (std::int64_t g = kv_heads.begin; g < kv_heads.end; ++g) {
      const auto [k, v] = source(s, g);
      for (const Call& c : calls_of(lane.call, len, q_len, chunk)) {
        plans.push_back(split_blocks(lane.split, c.ctx, seqs, page_size));
        for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
          jobs.push_back(FoldJob{q.at(q_batch[static_cast<std::size_t>(s)], h, c.first), c.first,
                                 c.rows, k, v, 0, plans.back(),
                                 out.out.at(s, h, c.first - first_row),
                                 out.lse.at(s, h, c.first - first_row)});
        }
      }
      if (plans_used != nullptr) (*plans_used)[static_cast<std::size_t>(s)] = plans.back();
    }
  }
  backend.run_fold_jobs(jobs, dim, scale, lane.rounding);
  return out;
}

}  // namespace

AttnShard run_paged_lane(const Lane& lane, const PagedKvCache& cache, std::int64_t q_len,
                         const Shard& q, std::span<const int> q_batch, Range kv_heads, int group,
                         float scale, AttentionBackend& backend,
                         std::vector<std::vector<Range>>* plans_used) {
  // The CPU kernel reads the pages in place (a backend without a paged kernel copies them out).
  const KvSource source = [&](int seq, std::int64_t h) { return cache.rows(seq, h); };
  return run_lane(lane, cache.table().kv_lens, q_len, cache.table().page_size, q, q_batch, kv_heads,
                  group, scale, source, backend, plans_used);
}

AttnShard run_contiguous_lane(const Lane& lane, const PagedWorkload& w, const Shard& k,
                              const Shard& v, const Shard& q, Range kv_heads, int group,
                              float scale, AttentionBackend& backend) {
  std::vector<int> identity(static_cast<std::size_t>(w.sequences()));
  for (int s = 0; s < w.sequences(); ++s) identity[static_cast<std::size_t>(s)] = s;
  const KvSource source = [&](int seq, std::int64_t h) {
    return std::pair<KvRows, KvRows>{k.at(seq, h, 0), v.at(seq, h, 0)};
  };
  return run_lane(lane, w.kv_lens, w.q_len, w.page_size, q, identity, kv_heads, group, scale,
                  source, backend);
}

}  // namespace cpd
