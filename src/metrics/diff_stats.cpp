#include "cpdrift/metrics/diff_stats.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpdrift/numerics/bf16.h"
#include "cpdrift/util/thread_pool.h"

namespace cpd {
namespace {

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// abs_diff and ulp_distance, inline for the statistics' loops.
inline float abs_diff_of(float candidate, float reference) {
  if (candidate == reference) return 0.0f;
  return std::fabs(candidate - reference);
}

inline std::uint64_t ulp_distance_of(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<std::uint64_t>::max();
  // Map the float ordering onto the integers: negative values mirror below zero.
  const auto ordinal = [](float x) -> std::int64_t {
    const std::uint32_t u = bits(x);
    return (u & 0x80000000u) ? -static_cast<std::int64_t>(u & 0x7fffffffu)
                             : static_cast<std::int64_t>(u);
  };
  const std::int64_t d = ordinal(a) - ordinal(b);
  return static_cast<std::uint64_t>(d < 0 ? -d : d);
}

// The order statistics come from a three-level radix select over the bit patterns of the
// non-negative diffs: bits [31, 21), then [21, 10), then [10, 0) (11, 11 and 10 bits), one
// histogram pass over the data per level, each merged by addition across parts and processes.
// Small histograms (16 KiB a level) keep a small tensor's statistics cheap: clearing and
// reducing them costs less than the pass over the data that fills them.
constexpr int kLevels = 3;
constexpr int kLevelShift[kLevels] = {21, 10, 0};
constexpr int kLevelBits[kLevels] = {11, 11, 10};
constexpr std::size_t kBins = std::size_t{1} << kLevelBits[0];

constexpr std::size_t level_bins(int level) { return std::size_t{1} << kLevelBits[level]; }

// Exact sum of non-negative finite FP32 values: each value is mantissa · 2^(exponent - 150)
// with a 24-bit integer mantissa, so summing mantissas per exponent in 64-bit integers is
// exact for up to 2^40 values per exponent, and the bins add exactly across parts.
constexpr std::size_t kExponents = 256;

// The bins' total Σ bins[e]·2^(max(e-1, 0)) in units of 2^-149, as a 384-bit integer (the
// largest term is below 2^(253+64)), rounded once to the nearest FP64 (ties to even).
double sum_from_bins(std::span<const std::uint64_t> bins) {
  constexpr int kLimbs = 6;
  std::uint64_t n[kLimbs] = {};
  for (std::size_t e = 0; e < kExponents; ++e) {
    if (bins[e] == 0) continue;
    const int shift = e == 0 ? 0 : static_cast<int>(e) - 1;
    const int limb = shift / 64, bit = shift % 64;
    // bins[e] << shift spans two limbs; add both halves with carries.
    const std::uint64_t lo = bins[e] << bit;
    const std::uint64_t hi = bit == 0 ? 0 : bins[e] >> (64 - bit);
    unsigned __int128 carry = static_cast<unsigned __int128>(n[limb]) + lo;
    n[limb] = static_cast<std::uint64_t>(carry);
    carry = (carry >> 64) + n[limb + 1] + hi;
    n[limb + 1] = static_cast<std::uint64_t>(carry);
    carry >>= 64;
    for (int i = limb + 2; carry != 0 && i < kLimbs; ++i) {
      carry += n[i];
      n[i] = static_cast<std::uint64_t>(carry);
      carry >>= 64;
    }
  }
  const auto bit_at = [&](int k) { return k >= 0 && ((n[k / 64] >> (k % 64)) & 1u) != 0; };
  int top = -1;
  for (int k = kLimbs * 64 - 1; k >= 0; --k) {
    if (bit_at(k)) {
      top = k;
      break;
    }
  }
  if (top < 0) return 0.0;
  // The top 53 bits, the next bit and whether anything below it is set.
  const int low = top - 52;
  std::uint64_t mantissa = 0;
  for (int k = top; k >= std::max(low, 0); --k) mantissa = (mantissa << 1) | (bit_at(k) ? 1u : 0u);
  if (low < 0) return std::ldexp(static_cast<double>(mantissa), -149);  // exact: fits in 53 bits
  const bool round = bit_at(low - 1);
  bool sticky = false;
  for (int k = low - 2; k >= 0 && !sticky; --k) sticky = bit_at(k);
  if (round && (sticky || (mantissa & 1u) != 0)) ++mantissa;
  return std::ldexp(static_cast<double>(mantissa), low - 149);
}

// Counters of the first pass, laid out as one vector so one reduction combines them all.
struct FirstPass {
  // kZeros: the diffs that are +0 (exact matches), kept out of the histograms.
  enum : std::size_t { kCount, kMismatch, kNonfinite, kZeros, kHeader };
  std::vector<std::uint64_t> v = std::vector<std::uint64_t>(kHeader + kExponents + kBins, 0);
  std::uint64_t& operator[](std::size_t i) { return v[i]; }
  std::span<std::uint64_t> sum_bins() { return {v.data() + kHeader, kExponents}; }
  std::span<std::uint64_t> hist() { return {v.data() + kHeader + kExponents, kBins}; }
};

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

}  // namespace

float abs_diff(float candidate, float reference) { return abs_diff_of(candidate, reference); }

std::uint64_t ulp_distance(float a, float b) { return ulp_distance_of(a, b); }

double sorted_quantile(std::span<const float> sorted, double q) {
  if (sorted.empty()) return 0.0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  const double a = sorted[lo], b = sorted[hi];
  return a + (b - a) * frac;
}

namespace {

// The unit of parallel work: consecutive pieces of parts, about `size` elements in all, so
// that many small parts share one set of histograms.
struct Piece {
  const DiffPart* part;
  std::size_t begin, end;
};
using Chunk = std::vector<Piece>;

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

struct LocalFirst {
  FirstPass counters;  // its bins are filled from the two below by close()
  std::uint64_t max_bits = 0, max_ulp = 0;
  // The bins as the first pass fills them, each with one more slot for what it does not count
  // (exact matches in both, non-finite diffs in the sums), so that the loop has no branch.
  std::array<std::uint64_t, kBins + 1> hist{};
  std::array<std::uint64_t, kExponents + 1> sums{};

  void close() {
    std::copy(hist.begin(), hist.begin() + kBins, counters.hist().begin());
    std::copy(sums.begin(), sums.begin() + kExponents, counters.sum_bins().begin());
  }
};

// The passes run over blocks of kBlock values in two steps: a loop without branches that the
// compiler vectorises (each value's diff bits, and the block's mismatches, largest ulp
// distance, largest diff and NaN flag), then per block with a nonzero diff the histogram and
// the exact sum, which need a scattered increment a value. Blocks of 32 (two AVX-512 vectors)
// with the first step inlined: 3.4 ns a value over both passes against 4.2 for blocks of 16
// and 4.9 for a first step called per block (16 M diffs, one thread). Both scalar steps then
// lost their per-value branches (bins and flags computed in the vectorised loop, spare slots
// for what is not counted): the statistics of 16 M diffs on 2 threads took 26 → 19–22 ms
// (FP32 candidates) and 32 → 25–30 ms (BF16-read ones).
constexpr std::size_t kBlock = 32;

// The FP32 order as unsigned integers, -0 and +0 the same: the distance of two keys is the
// ulp_distance of their floats (below 2^32). Without branches: m + 2^31 for a positive value,
// 2^31 - m for a negative one (m: the magnitude bits).
inline std::uint32_t order_key(std::uint32_t u) {
  const std::uint32_t sign = u >> 31, m = u & 0x7fffffffu;
  return 0x80000000u + ((m ^ (0u - sign)) + sign);
}

// round_bf16's bits without branches (the same result: NaN quieted, otherwise to nearest even).
inline std::uint32_t round_bf16_bits(std::uint32_t u) {
  const std::uint32_t nan = 0u - static_cast<std::uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  const std::uint32_t quiet = (u >> 16) | 0x0040u;
  const std::uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return ((quiet & nan) | (nearest & ~nan)) << 16;
}

struct BlockDiffs {
  std::uint32_t diff[kBlock];  // the diff's bits, 0 for an exact match
  std::uint32_t nonzero = 0;   // how many diffs are not 0
  std::uint32_t mismatches = 0, max_ulp = 0, max_bits = 0;
  bool nan = false;  // a NaN among the values: the ulp distance is then UINT64_MAX
};

// The diffs of kBlock values (candidates c, references r or null), branch-free so that it
// vectorises: abs_diff_of is |c - r| masked to +0 where c == r, the ulp distance the distance
// of the order keys.
template <bool kReference, bool kBf16>
[[gnu::always_inline]] inline void block_diffs(const float* c, const float* r, BlockDiffs& b) {
  std::uint32_t mismatches = 0, max_ulp = 0, max_bits = 0, nan = 0, nonzero = 0;
  for (std::size_t k = 0; k < kBlock; ++k) {
    const std::uint32_t cb = kBf16 ? round_bf16_bits(bits(c[k])) : bits(c[k]);
    std::uint32_t d;
    if constexpr (kReference) {
      const float candidate = from_bits(cb), reference = r[k];
      const std::uint32_t rb = bits(reference);
      const std::uint32_t differ = 0u - static_cast<std::uint32_t>(candidate != reference);
      d = bits(std::fabs(candidate - reference)) & differ;
      mismatches += static_cast<std::uint32_t>(cb != rb);
      const std::uint32_t ka = order_key(cb), kb = order_key(rb);
      max_ulp = std::max(max_ulp, std::max(ka, kb) - std::min(ka, kb));
      nan |= static_cast<std::uint32_t>((cb & 0x7fffffffu) > 0x7f800000u) |
             static_cast<std::uint32_t>((rb & 0x7fffffffu) > 0x7f800000u);
    } else {
      d = cb;
      mismatches += static_cast<std::uint32_t>(from_bits(cb) != 0.0f);
    }
    b.diff[k] = d;
    nonzero += static_cast<std::uint32_t>(d != 0);
    max_bits = std::max(max_bits, d);
  }
  b.nonzero = nonzero;
  b.mismatches = mismatches;
  b.max_ulp = max_ulp;
  b.max_bits = max_bits;
  b.nan = nan != 0;
}

// Calls block(b, n) for every block of the piece (n values; a last, shorter block is padded
// with exact zeros, which the caller leaves out by counting only n values).
template <bool kReference, bool kBf16, class Block>
void for_each_block(const Piece& c, Block&& block) {
  const DiffPart& p = *c.part;
  BlockDiffs b;
  std::size_t i = c.begin;
  for (; i + kBlock <= c.end; i += kBlock) {
    block_diffs<kReference, kBf16>(p.candidate + i, kReference ? p.reference + i : nullptr, b);
    block(b, kBlock);
  }
  if (i == c.end) return;
  float tail_c[kBlock] = {}, tail_r[kBlock] = {};
  const std::size_t n = c.end - i;
  std::copy(p.candidate + i, p.candidate + c.end, tail_c);
  if (kReference) std::copy(p.reference + i, p.reference + c.end, tail_r);
  block_diffs<kReference, kBf16>(tail_c, tail_r, b);
  block(b, n);
}

// The first pass over a piece: counts, maxima, the exact sum's bins and the top-level
// histogram (exact matches, the common case of the invariance checks, are only counted).
template <bool kReference, bool kBf16>
void first_pass_of(const Piece& c, LocalFirst& acc) {
  std::uint64_t* const hist = acc.hist.data();
  std::uint64_t* const sums = acc.sums.data();
  std::uint64_t mismatches = 0, nonfinite = 0, zeros = 0, max_bits = acc.max_bits,
                max_ulp = acc.max_ulp;
  for_each_block<kReference, kBf16>(c, [&](const BlockDiffs& b, std::size_t n) {
    mismatches += b.mismatches;
    max_ulp = std::max<std::uint64_t>(
        max_ulp, b.nan ? std::numeric_limits<std::uint64_t>::max() : b.max_ulp);
    max_bits = std::max<std::uint64_t>(max_bits, b.max_bits);
    zeros += n - b.nonzero;
    if (b.nonzero == 0) return;
    // Each diff's histogram bin and exponent bin with its mantissa, vectorised; an exact match
    // goes to both spare slots, a non-finite diff to the sums' (the padding of a last, short
    // block is exact matches, so it lands there too).
    std::uint32_t top[kBlock], exponent[kBlock], mantissa[kBlock], infinite = 0;
    for (std::size_t k = 0; k < kBlock; ++k) {
      const std::uint32_t u = b.diff[k], e = u >> 23;
      const bool finite = u < 0x7f800000u;
      top[k] = u == 0 ? static_cast<std::uint32_t>(kBins) : u >> kLevelShift[0];
      exponent[k] = u == 0 || !finite ? static_cast<std::uint32_t>(kExponents) : e;
      mantissa[k] = (u & 0x7fffffu) | (e == 0 ? 0u : 0x800000u);
      infinite += static_cast<std::uint32_t>(!finite);
    }
    nonfinite += infinite;
    for (std::size_t k = 0; k < kBlock; ++k) {
      ++hist[top[k]];
      sums[exponent[k]] += mantissa[k];
    }
  });
  acc.counters[FirstPass::kZeros] += zeros;
  acc.counters[FirstPass::kMismatch] += mismatches;
  acc.counters[FirstPass::kNonfinite] += nonfinite;
  acc.counters[FirstPass::kCount] += c.end - c.begin;
  acc.max_bits = max_bits;
  acc.max_ulp = max_ulp;
}

// The second pass over a piece: every nonzero diff whose top-level bin is one of `bins` (the
// bins holding the wanted ranks of the whole tensor and of the piece's group: at most kBins,
// 4 or 8), written at out[count++] as its bit pattern. A block is first tested as a whole
// (vectorised, which also flags each diff), as few of its diffs are usually kept; a block with
// some is compacted without branches, each value written and the count advanced by its flag,
// so `out` holds kBlock slots past the last kept diff.
template <bool kReference, bool kBf16, std::size_t kBins>
void collect_of(const Piece& c, std::span<const std::uint32_t> bins, std::uint32_t* out,
                std::size_t& count) {
  std::uint32_t wanted[kBins];
  std::fill(wanted, wanted + kBins, ~0u);  // ~0u: no top-level bin
  std::copy(bins.begin(), bins.end(), wanted);
  const auto kept = [&](std::uint32_t u) {
    const std::uint32_t top = u >> kLevelShift[0];
    std::uint32_t in = 0;
    for (std::size_t w = 0; w < kBins; ++w) in |= static_cast<std::uint32_t>(top == wanted[w]);
    return static_cast<std::uint32_t>(u != 0) & in;
  };
  for_each_block<kReference, kBf16>(c, [&](const BlockDiffs& b, std::size_t n) {
    std::uint32_t flag[kBlock], any = 0;
    for (std::size_t k = 0; k < kBlock; ++k) {
      flag[k] = kept(b.diff[k]);
      any |= flag[k];
    }
    if (any == 0) return;
    for (std::size_t k = 0; k < n; ++k) {
      out[count] = b.diff[k];
      count += flag[k];
    }
  });
}

// Calls fn(reference, bf16) with each as a std::bool_constant, for the piece's part: one
// specialised loop per kind of part.
template <class Fn>
void by_kind(const Piece& c, Fn&& fn) {
  const bool reference = c.part->reference != nullptr, bf16 = c.part->bf16_candidate;
  if (reference) {
    bf16 ? fn(std::true_type{}, std::true_type{}) : fn(std::true_type{}, std::false_type{});
  } else {
    bf16 ? fn(std::false_type{}, std::true_type{}) : fn(std::false_type{}, std::false_type{});
  }
}

// A later level's histogram filled from the data itself (when the wanted bins hold too many
// diffs to keep): every nonzero diff whose bits above `level` are one of `prefixes`, counted at
// its bin of the level in h ([prefixes][level_bins(level)]).
template <bool kReference, bool kBf16>
void level_pass_of(const Piece& c, int level, std::span<const std::uint32_t> prefixes,
                   std::uint64_t* h) {
  const int above = kLevelShift[level - 1], shift = kLevelShift[level];
  const std::size_t bins = level_bins(level);
  const std::uint32_t mask = static_cast<std::uint32_t>(bins - 1);
  for_each_block<kReference, kBf16>(c, [&](const BlockDiffs& b, std::size_t n) {
    if (b.nonzero == 0) return;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t u = b.diff[k];
      if (u == 0) continue;
      for (std::size_t x = 0; x < prefixes.size(); ++x) {
        if ((u >> above) == prefixes[x]) ++h[x * bins + ((u >> shift) & mask)];
      }
    }
  });
}

void level_pass(const Piece& c, int level, std::span<const std::uint32_t> prefixes,
                std::uint64_t* h) {
  by_kind(c, [&](auto reference, auto bf16) {
    level_pass_of<decltype(reference)::value, decltype(bf16)::value>(c, level, prefixes, h);
  });
}

void collect(const Piece& c, std::span<const std::uint32_t> bins, std::uint32_t* out,
             std::size_t& count) {
  // Eight bins only where a group's wanted bins differ from the whole's: testing eight costs
  // about 15% of a plain call's time.
  by_kind(c, [&](auto reference, auto bf16) {
    constexpr bool r = decltype(reference)::value, b = decltype(bf16)::value;
    bins.size() <= 4 ? collect_of<r, b, 4>(c, bins, out, count)
                     : collect_of<r, b, 8>(c, bins, out, count);
  });
}

void first_pass(const Piece& c, LocalFirst& acc) {
  by_kind(c, [&](auto reference, auto bf16) {
    first_pass_of<decltype(reference)::value, decltype(bf16)::value>(c, acc);
  });
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
  bool keep = false;                    // those bins' diffs are kept (see compute_targets)
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

// The statistics of the whole tensor (targets[0]) and of each group (targets[1 + g]). The data
// is read by one first pass per chunk, which counts toward the whole and the chunk's group;
// by one collecting pass per chunk for both targets' wanted bins; and, where a target's wanted
// bins hold more than kKeepLimit diffs (known alike on every holder from the reduced
// histogram), by one pass per later level over that target's chunks instead, so the memory
// stays what the statistics always took. Every reduction combines all targets at once.
std::vector<DiffStats> compute_targets(std::span<const DiffPart> parts,
                                       std::span<const int> group_of, int groups,
                                       const CounterReducer& reduce, ThreadPool* pool) {
  const std::size_t size = chunk_size(parts, pool != nullptr ? pool->size() : 1);
  std::vector<Target> targets(static_cast<std::size_t>(1 + groups));
  std::vector<Chunk> chunks;
  std::vector<std::size_t> group_target;  // per chunk: its group's target, 0 for none
  const auto in_group = [&](std::size_t i, int g) { return !group_of.empty() && group_of[i] == g; };
  for (int g = 0; g < groups; ++g) {
    Target& t = targets[static_cast<std::size_t>(1 + g)];
    t.begin = chunks.size();
    append_chunks(
        parts, size, [&](std::size_t i) { return in_group(i, g); }, chunks);
    t.end = chunks.size();
    group_target.resize(chunks.size(), static_cast<std::size_t>(1 + g));
  }
  append_chunks(
      parts, size,
      [&](std::size_t i) { return group_of.empty() || group_of[i] < 0 || group_of[i] >= groups; },
      chunks);
  group_target.resize(chunks.size(), 0);
  targets[0].end = chunks.size();

  std::vector<LocalFirst> locals(chunks.size());
  for_each_chunk(chunks.size(), pool, [&](std::size_t i) {
    for (const Piece& piece : chunks[i]) first_pass(piece, locals[i]);
    locals[i].close();
  });
  for (Target& t : targets) {
    for (std::size_t c = t.begin; c < t.end; ++c) {
      for (std::size_t i = 0; i < t.first.v.size(); ++i) t.first.v[i] += locals[c].counters.v[i];
      t.max_bits = std::max(t.max_bits, locals[c].max_bits);
      t.max_ulp = std::max(t.max_ulp, locals[c].max_ulp);
    }
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

  // The diffs in the kept targets' wanted top-level bins, per chunk: the whole's and its
  // group's, usually a small share of the data (a bin spans a quarter of a binade).
  std::vector<std::vector<std::uint32_t>> kept(chunks.size());
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
  locals.clear();

  // The later levels: per target, one histogram per distinct prefix (the four ranks often
  // share bins), reduced, and each rank located within it.
  for (int level = 1; level < kLevels; ++level) {
    const std::size_t bins = level_bins(level);
    const int above = kLevelShift[level - 1], shift = kLevelShift[level];
    const std::uint32_t mask = static_cast<std::uint32_t>(bins - 1);
    for (Target& t : targets) {
      t.prefixes.clear();
      for (int w = 0; w < 4; ++w) {
        if (t.found[w]) continue;
        const auto at = std::find(t.prefixes.begin(), t.prefixes.end(), t.prefix[w]);
        t.slot_of[w] = static_cast<int>(at - t.prefixes.begin());
        if (at == t.prefixes.end()) t.prefixes.push_back(t.prefix[w]);
      }
      t.hist.assign(t.prefixes.size() * bins, 0);
      if (t.prefixes.empty()) continue;
      if (t.keep) {
        for (std::size_t c = t.begin; c < t.end; ++c) {
          for (const std::uint32_t u : kept[c]) {  // other targets' bins too: not a prefix
            for (std::size_t b = 0; b < t.prefixes.size(); ++b) {
              if ((u >> above) == t.prefixes[b]) ++t.hist[b * bins + ((u >> shift) & mask)];
            }
          }
        }
        continue;
      }
      std::vector<std::vector<std::uint64_t>> partial(t.end - t.begin);
      for_each_chunk(t.end - t.begin, pool, [&](std::size_t i) {
        partial[i].assign(t.hist.size(), 0);
        for (const Piece& piece : chunks[t.begin + i])
          level_pass(piece, level, t.prefixes, partial[i].data());
      });
      for (const auto& h : partial) {
        for (std::size_t i = 0; i < t.hist.size(); ++i) t.hist[i] += h[i];
      }
    }
    if (std::all_of(targets.begin(), targets.end(),
                    [](const Target& t) { return t.prefixes.empty(); }))
      break;  // every rank found (alike on every holder): nothing to reduce
    reduce_all(targets, reduce, [](Target& t) { return std::span<std::uint64_t>(t.hist); });
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
  std::vector<DiffStats> result;
  for (Target& t : targets) {
    finish_select(t);
    result.push_back(std::move(t.s));
  }
  return result;
}

}  // namespace

DiffStats compute_diff_stats(std::span<const DiffPart> parts, const CounterReducer& reduce,
                             ThreadPool* pool) {
  return compute_targets(parts, {}, 0, reduce, pool).front();
}

std::vector<DiffStats> compute_grouped_diff_stats(std::span<const DiffPart> parts,
                                                  std::span<const int> group_of, int groups,
                                                  const CounterReducer& reduce, ThreadPool* pool) {
  return compute_targets(parts, group_of, groups, reduce, pool);
}

}  // namespace cpd
