#include "metrics/diff_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/util/thread_pool.h"
#include "metrics/diff_passes.h"

namespace cpd {

using namespace diff_passes;

std::uint64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<std::uint64_t>::max();
  const std::uint32_t ka = order_key(bits(a)), kb = order_key(bits(b));
  return std::max(ka, kb) - std::min(ka, kb);
}

namespace {

// Finds, for a wanted rank k (0-based, ascending order of values), the bin of `hist` holding
// it and the rank within that bin.
struct Located {
  std::uint32_t bin;
  std::uint64_t rank_in_bin;
};

Located locate(std::span<const std::uint64_t> hist, std::uint64_t k) {
  std::uint64_t seen = 0;
  for (std::uint32_t b = 0; b < hist.size(); ++b) {
    if (k < seen + hist[b]) return Located{b, k - seen};
    seen += hist[b];
  }
  return Located{static_cast<std::uint32_t>(hist.size() - 1), 0};
}

// The chunks' size: at least 2^18 elements, and about four chunks a worker.
std::size_t chunk_size(std::span<const DiffPart> parts, int workers) {
  std::size_t total = 0;
  for (const DiffPart& p : parts) total += p.count;
  return std::max<std::size_t>(std::size_t{1} << 18,
                               total / (4 * static_cast<std::size_t>(workers)) + 1);
}

// Appends the chunks of the parts that `take(i)` selects, in part order.
template <class Take>
void append_chunks(std::span<const DiffPart> parts, std::size_t size, Take&& take,
                   std::vector<Chunk>& chunks) {
  std::size_t filled = size;  // the first piece opens a chunk
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (!take(i)) continue;
    const DiffPart& p = parts[i];
    for (std::size_t b = 0; b < p.count;) {
      if (filled == size) {
        chunks.emplace_back();
        filled = 0;
      }
      const std::size_t e = std::min(p.count, b + (size - filled));
      chunks.back().push_back(Piece{&p, b, e});
      filled += e - b;
      b = e;
    }
  }
}

// Runs fn(chunk index) over the chunks, on the pool when there is one.
template <class Fn>
void for_each_chunk(std::size_t n, ThreadPool* pool, Fn&& fn) {
  if (pool == nullptr) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->parallel_for(static_cast<std::int64_t>(n),
                     [&](std::int64_t i) { fn(static_cast<std::size_t>(i)); });
}

// One set of statistics a call computes: the whole tensor's, or one group's, over the chunks
// [begin, end) (a group's chunks are consecutive), with its radix select's state.
struct Target {
  std::size_t begin = 0, end = 0;
  FirstPass first;
  std::uint64_t max_bits = 0, max_ulp = 0;
  DiffStats s;
  // Each wanted rank's bits so far (its bin at the levels passed) and its rank in that bin; a
  // rank among the zeros, which come first, is found.
  std::uint32_t prefix[4] = {};
  std::uint64_t rank[4] = {};
  bool found[4] = {true, true, true, true};
  std::vector<std::uint32_t> top_bins;  // the wanted ranks' distinct top-level bins
  bool keep = false;  // those bins' diffs are kept (see compute_grouped_diff_stats)
  // The current level's histograms: one per distinct prefix, [prefixes][level_bins(level)].
  std::vector<std::uint32_t> prefixes;
  int slot_of[4] = {};
  std::vector<std::uint64_t> hist;
};

// The order statistics needed by p95 and p99: floor(q·(n-1)) and the next one.
constexpr double kQuantiles[2] = {0.95, 0.99};
constexpr std::uint64_t kKeepLimit = std::uint64_t{1} << 21;  // 8 MiB of diffs

// The figures of the reduced first pass, and where the radix select starts.
void start_select(Target& t) {
  DiffStats& s = t.s;
  s.active_count = t.first[FirstPass::kCount];
  s.mismatch_count = t.first[FirstPass::kMismatch];
  s.nonfinite_count = t.first[FirstPass::kNonfinite];
  s.max_ulp = t.max_ulp;
  const std::uint64_t n = s.active_count;
  if (n == 0) return;
  s.max_abs = from_bits(static_cast<std::uint32_t>(t.max_bits));
  s.mean_abs = sum_from_bins(t.first.sum_bins()) / static_cast<double>(n);
  const std::uint64_t zeros = t.first[FirstPass::kZeros];
  std::uint64_t in_top_bins = 0;
  for (int w = 0; w < 4; ++w) {
    const double pos = kQuantiles[w / 2] * static_cast<double>(n - 1);
    const auto low = static_cast<std::uint64_t>(std::floor(pos));
    const std::uint64_t wanted = w % 2 == 0 ? low : std::min(low + 1, n - 1);
    t.found[w] = wanted < zeros;
    if (t.found[w]) continue;
    const Located at = locate(t.first.hist(), wanted - zeros);
    t.prefix[w] = at.bin;
    t.rank[w] = at.rank_in_bin;
    if (std::find(t.top_bins.begin(), t.top_bins.end(), at.bin) == t.top_bins.end()) {
      t.top_bins.push_back(at.bin);
      in_top_bins += t.first.hist()[at.bin];
    }
  }
  t.keep = in_top_bins <= kKeepLimit;
}

void finish_select(Target& t) {
  if (t.s.active_count == 0) return;
  float value[4];
  for (int w = 0; w < 4; ++w) value[w] = t.found[w] ? 0.0f : from_bits(t.prefix[w]);
  for (int i = 0; i < 2; ++i) {
    const double pos = kQuantiles[i] * static_cast<double>(t.s.active_count - 1);
    const double frac = pos - std::floor(pos);
    const double a = value[2 * i], b = value[2 * i + 1];
    (i == 0 ? t.s.p95_abs : t.s.p99_abs) = a + (b - a) * frac;
  }
}

// Sums every target's `field` (a vector of the same length on every holder) with one reduction.
template <class Field>
void reduce_all(std::vector<Target>& targets, const CounterReducer& reduce, Field&& field) {
  std::vector<std::uint64_t> all;
  for (Target& t : targets) {
    const std::span<std::uint64_t> v = field(t);
    all.insert(all.end(), v.begin(), v.end());
  }
  reduce.sum(all);
  std::size_t at = 0;
  for (Target& t : targets) {
    const std::span<std::uint64_t> v = field(t);
    std::copy(all.begin() + static_cast<std::ptrdiff_t>(at),
              all.begin() + static_cast<std::ptrdiff_t>(at + v.size()), v.begin());
    at += v.size();
  }
}

// Cuts the parts into chunks: each group's, consecutive (targets[1 + g] reads [begin, end)),
// then the ungrouped ones (targets[0] reads them all). group_target: per chunk, its group's
// target, 0 for none.
std::vector<Chunk> cut_chunks(std::span<const DiffPart> parts, std::span<const int> group_of,
                              int groups, std::size_t size, std::vector<Target>& targets,
                              std::vector<std::size_t>& group_target) {
  const auto target_of = [&](std::size_t i) {
    const int g = group_of.empty() ? -1 : group_of[i];
    return g >= 0 && g < groups ? static_cast<std::size_t>(1 + g) : 0;
  };
  std::vector<Chunk> chunks;
  for (std::size_t n = 1; n <= targets.size(); ++n) {
    const std::size_t t = n % targets.size();  // the groups' targets, then the ungrouped parts
    targets[t].begin = t == 0 ? 0 : chunks.size();
    append_chunks(
        parts, size, [&](std::size_t i) { return target_of(i) == t; }, chunks);
    targets[t].end = chunks.size();
    group_target.resize(chunks.size(), t);
  }
  return chunks;
}

// The first pass of every chunk, counted toward the whole and the chunk's group's target,
// reduced, and each target's radix select started. Returns each chunk's own first pass.
std::vector<LocalFirst> first_passes(const std::vector<Chunk>& chunks,
                                     const std::vector<std::size_t>& group_target,
                                     std::vector<Target>& targets, const CounterReducer& reduce,
                                     ThreadPool* pool) {
  std::vector<LocalFirst> locals(chunks.size());
  for_each_chunk(chunks.size(), pool, [&](std::size_t i) {
    for (const Piece& piece : chunks[i]) first_pass(piece, locals[i]);
    locals[i].close();
  });
  const auto add = [](Target& t, const LocalFirst& l) {
    for (std::size_t i = 0; i < t.first.v.size(); ++i) t.first.v[i] += l.counters.v[i];
    t.max_bits = std::max(t.max_bits, l.max_bits);
    t.max_ulp = std::max(t.max_ulp, l.max_ulp);
  };
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    add(targets.front(), locals[c]);
    if (group_target[c] != 0) add(targets[group_target[c]], locals[c]);
  }
  reduce_all(targets, reduce, [](Target& t) { return std::span<std::uint64_t>(t.first.v); });
  std::vector<std::uint64_t> maxima;
  for (const Target& t : targets) maxima.insert(maxima.end(), {t.max_bits, t.max_ulp});
  reduce.max(maxima);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    targets[i].max_bits = maxima[2 * i];
    targets[i].max_ulp = maxima[2 * i + 1];
    start_select(targets[i]);
  }
  return locals;
}

// The diffs in the kept targets' wanted top-level bins, per chunk: the whole's and its
// group's, usually a small share of the data (a bin spans a quarter of a binade).
std::vector<std::vector<float>> collect_kept(const std::vector<Chunk>& chunks,
                                             const std::vector<std::size_t>& group_target,
                                             const std::vector<Target>& targets,
                                             std::vector<LocalFirst>& locals, ThreadPool* pool) {
  std::vector<std::vector<float>> kept(chunks.size());
  for_each_chunk(chunks.size(), pool, [&](std::size_t c) {
    std::vector<std::uint32_t> bins;
    for (const std::size_t t : {std::size_t{0}, group_target[c]}) {
      if (!targets[t].keep) continue;
      for (const std::uint32_t bin : targets[t].top_bins) {
        if (std::find(bins.begin(), bins.end(), bin) == bins.end()) bins.push_back(bin);
      }
    }
    if (bins.empty()) return;
    std::uint64_t here = 0;  // this chunk's diffs in those bins, from its first pass
    for (const std::uint32_t bin : bins) here += locals[c].counters.hist()[bin];
    kept[c].resize(static_cast<std::size_t>(here) + kBlock);
    std::size_t count = 0;
    for (const Piece& piece : chunks[c]) collect(piece, bins, kept[c].data(), count);
    kept[c].resize(count);  // == here: the first pass counted these diffs
  });
  return kept;
}

// A later level's histograms, before the reduction: per target, one per distinct prefix (the
// four ranks often share bins), from its chunks of the data, or of the kept diffs for a kept
// target; every (target, chunk) on the pool at once.
void level_histograms(int level, const std::vector<Chunk>& chunks,
                      const std::vector<std::vector<float>>& kept, std::vector<Target>& targets,
                      ThreadPool* pool) {
  const std::size_t bins = level_bins(level);
  std::vector<std::pair<Target*, std::size_t>> work;  // (target, chunk)
  for (Target& t : targets) {
    t.prefixes.clear();
    for (int w = 0; w < 4; ++w) {
      if (t.found[w]) continue;
      const auto at = std::find(t.prefixes.begin(), t.prefixes.end(), t.prefix[w]);
      t.slot_of[w] = static_cast<int>(at - t.prefixes.begin());
      if (at == t.prefixes.end()) t.prefixes.push_back(t.prefix[w]);
    }
    t.hist.assign(t.prefixes.size() * bins, 0);
    for (std::size_t c = t.begin; c < t.end && !t.prefixes.empty(); ++c) work.emplace_back(&t, c);
  }
  std::vector<std::vector<std::uint64_t>> partial(work.size());
  for_each_chunk(work.size(), pool, [&](std::size_t i) {
    const auto [t, c] = work[i];
    partial[i].assign(t->hist.size(), 0);
    if (!t->keep) {
      for (const Piece& piece : chunks[c]) level_pass(piece, level, t->prefixes, partial[i].data());
      return;
    }
    // The kept diffs (other targets' bins too) as a part of their own, nonzero values without a
    // reference: the level pass counts them as it counts the data's diffs, without branches.
    const DiffPart kept_part{kept[c].data(), nullptr, kept[c].size(), false};
    level_pass(Piece{&kept_part, 0, kept_part.count}, level, t->prefixes, partial[i].data());
  });
  for (std::size_t i = 0; i < work.size(); ++i) {
    std::vector<std::uint64_t>& hist = work[i].first->hist;
    for (std::size_t j = 0; j < hist.size(); ++j) hist[j] += partial[i][j];
  }
}

// Each target's ranks not yet found located in the level's reduced histograms.
void locate_level(int level, std::vector<Target>& targets) {
  const std::size_t bins = level_bins(level);
  for (Target& t : targets) {
    for (int w = 0; w < 4; ++w) {
      if (t.found[w]) continue;
      const Located at =
          locate(std::span<const std::uint64_t>(
                     t.hist.data() + static_cast<std::size_t>(t.slot_of[w]) * bins, bins),
                 t.rank[w]);
      t.prefix[w] = (t.prefix[w] << kLevelBits[level]) | at.bin;
      t.rank[w] = at.rank_in_bin;
    }
  }
}

}  // namespace

// The statistics of the whole tensor (targets[0]) and of each group (targets[1 + g]). The data
// is read by one first pass per chunk, which counts toward the whole and the chunk's group;
// by one collecting pass per chunk for both targets' wanted bins; and, where a target's wanted
// bins hold more than kKeepLimit diffs (known alike on every holder from the reduced
// histogram), by one pass per later level over that target's chunks instead, so the memory
// stays what the statistics always took. Every reduction combines all targets at once.
std::vector<DiffStats> compute_grouped_diff_stats(std::span<const DiffPart> parts,
                                                  std::span<const int> group_of, int groups,
                                                  const CounterReducer& reduce, ThreadPool* pool) {
  std::vector<Target> targets(static_cast<std::size_t>(1 + groups));
  std::vector<std::size_t> group_target;
  const std::vector<Chunk> chunks =
      cut_chunks(parts, group_of, groups, chunk_size(parts, pool != nullptr ? pool->size() : 1),
                 targets, group_target);
  std::vector<LocalFirst> locals = first_passes(chunks, group_target, targets, reduce, pool);
  const std::vector<std::vector<float>> kept =
      collect_kept(chunks, group_target, targets, locals, pool);
  locals.clear();
  for (int level = 1; level < kLevels; ++level) {
    level_histograms(level, chunks, kept, targets, pool);
    if (std::all_of(targets.begin(), targets.end(),
                    [](const Target& t) { return t.prefixes.empty(); }))
      break;  // every rank found (alike on every holder): nothing to reduce
    reduce_all(targets, reduce, [](Target& t) { return std::span<std::uint64_t>(t.hist); });
    locate_level(level, targets);
  }
  std::vector<DiffStats> result;
  for (Target& t : targets) {
    finish_select(t);
    result.push_back(std::move(t.s));
  }
  return result;
}

DiffStats compute_diff_stats(std::span<const DiffPart> parts, const CounterReducer& reduce,
                             ThreadPool* pool) {
  return compute_grouped_diff_stats(parts, {}, 0, reduce, pool).front();
}

}  // namespace cpd
