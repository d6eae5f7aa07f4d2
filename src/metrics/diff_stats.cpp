#include "cpdrift/metrics/diff_stats.h"

#include <algorithm>
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

constexpr std::size_t kBins = 1u << 16;

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
  enum : std::size_t { kCount, kMismatch, kNonfinite, kMaxBits, kMaxUlp, kHeader };
  std::vector<std::uint64_t> v = std::vector<std::uint64_t>(kHeader + kExponents + kBins, 0);
  std::uint64_t& operator[](std::size_t i) { return v[i]; }
  std::span<std::uint64_t> sum_bins() { return {v.data() + kHeader, kExponents}; }
  std::span<std::uint64_t> hist() { return {v.data() + kHeader + kExponents, kBins}; }
};

// Finds, for each wanted rank k (0-based, ascending order of values), the 16-bit bin
// holding it and the rank within that bin.
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

std::vector<Chunk> chunks_of(std::span<const DiffPart> parts, int workers) {
  std::size_t total = 0;
  for (const DiffPart& p : parts) total += p.count;
  const std::size_t size = std::max<std::size_t>(
      std::size_t{1} << 18, total / (4 * static_cast<std::size_t>(workers)) + 1);
  std::vector<Chunk> chunks;
  std::size_t filled = size;  // the first piece opens a chunk
  for (const DiffPart& p : parts) {
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
  return chunks;
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
  FirstPass counters;
  std::uint64_t max_bits = 0, max_ulp = 0;
};

// The loop specialised on what the part holds, so the hot loop reads each value once and
// carries no per-element test of the part's kind (the same operations, so the same counts).
template <bool kReference, bool kBf16>
void first_pass_of(const Piece& c, LocalFirst& acc) {
  const DiffPart& p = *c.part;
  const std::span<std::uint64_t> hist = acc.counters.hist(), sum_bins = acc.counters.sum_bins();
  std::uint64_t mismatches = 0, nonfinite = 0, zeros = 0, max_bits = acc.max_bits,
                max_ulp = acc.max_ulp;
  for (std::size_t i = c.begin; i < c.end; ++i) {
    const float candidate = kBf16 ? round_bf16(p.candidate[i]) : p.candidate[i];
    float d;
    if constexpr (kReference) {
      const float reference = p.reference[i];
      d = abs_diff_of(candidate, reference);
      mismatches += bits(candidate) != bits(reference) ? 1 : 0;
      max_ulp = std::max(max_ulp, ulp_distance_of(candidate, reference));
    } else {
      d = candidate;
      mismatches += candidate != 0.0f ? 1 : 0;
    }
    const std::uint32_t u = bits(d);
    if (u == 0) {
      // +0, the common case of the invariance checks: counted in a register, as a run of
      // increments of one bin would serialise on memory.
      ++zeros;
      continue;
    }
    ++hist[u >> 16];
    if (u >= 0x7f800000u) {
      ++nonfinite;
    } else {
      const std::uint32_t e = u >> 23;
      sum_bins[e] += (u & 0x7fffffu) | (e == 0 ? 0u : 0x800000u);
    }
    max_bits = std::max<std::uint64_t>(max_bits, u);
  }
  hist[0] += zeros;
  acc.counters[FirstPass::kMismatch] += mismatches;
  acc.counters[FirstPass::kNonfinite] += nonfinite;
  acc.counters[FirstPass::kCount] += c.end - c.begin;
  acc.max_bits = max_bits;
  acc.max_ulp = max_ulp;
}

// The second pass over a piece: per distinct high bin, a histogram of the low 16 bits.
template <bool kReference, bool kBf16>
void low_bits_of(const Piece& c, std::span<const std::uint32_t> bins, std::uint64_t* h) {
  const DiffPart& p = *c.part;
  for (std::size_t i = c.begin; i < c.end; ++i) {
    const float candidate = kBf16 ? round_bf16(p.candidate[i]) : p.candidate[i];
    const std::uint32_t u = bits(kReference ? abs_diff_of(candidate, p.reference[i]) : candidate);
    for (std::size_t b = 0; b < bins.size(); ++b) {
      if ((u >> 16) == bins[b]) ++h[b * kBins + (u & 0xffffu)];
    }
  }
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

void low_bits_pass(const Piece& c, std::span<const std::uint32_t> bins, std::uint64_t* h) {
  by_kind(c, [&](auto reference, auto bf16) {
    low_bits_of<decltype(reference)::value, decltype(bf16)::value>(c, bins, h);
  });
}

void first_pass(const Piece& c, LocalFirst& acc) {
  by_kind(c, [&](auto reference, auto bf16) {
    first_pass_of<decltype(reference)::value, decltype(bf16)::value>(c, acc);
  });
}

}  // namespace

DiffStats compute_diff_stats(std::span<const DiffPart> parts, const CounterReducer& reduce,
                             ThreadPool* pool) {
  const std::vector<Chunk> chunks = chunks_of(parts, pool != nullptr ? pool->size() : 1);
  std::vector<LocalFirst> locals(chunks.size());
  for_each_chunk(chunks.size(), pool, [&](std::size_t i) {
    for (const Piece& piece : chunks[i]) first_pass(piece, locals[i]);
  });
  FirstPass first;
  std::uint64_t max_bits = 0, max_ulp = 0;
  for (const LocalFirst& l : locals) {
    for (std::size_t i = 0; i < first.v.size(); ++i) first.v[i] += l.counters.v[i];
    max_bits = std::max(max_bits, l.max_bits);
    max_ulp = std::max(max_ulp, l.max_ulp);
  }
  locals.clear();
  reduce.sum(first.v);
  std::uint64_t maxima[2] = {max_bits, max_ulp};
  reduce.max(maxima);
  max_bits = maxima[0];
  max_ulp = maxima[1];

  DiffStats s;
  s.active_count = first[FirstPass::kCount];
  s.mismatch_count = first[FirstPass::kMismatch];
  s.nonfinite_count = first[FirstPass::kNonfinite];
  s.max_ulp = max_ulp;
  const std::uint64_t n = s.active_count;
  if (n == 0) return s;
  s.max_abs = from_bits(static_cast<std::uint32_t>(max_bits));
  s.mean_abs = sum_from_bins(first.sum_bins()) / static_cast<double>(n);

  // Order statistics needed by p95 and p99: floor(q·(n-1)) and the next one.
  const double qs[2] = {0.95, 0.99};
  std::uint64_t wanted[4];
  for (int i = 0; i < 2; ++i) {
    const double pos = qs[i] * static_cast<double>(n - 1);
    wanted[2 * i] = static_cast<std::uint64_t>(std::floor(pos));
    wanted[2 * i + 1] = std::min(wanted[2 * i] + 1, n - 1);
  }
  Located where[4];
  for (int i = 0; i < 4; ++i) where[i] = locate(first.hist(), wanted[i]);

  // Second pass: the low 16 bits of the values in each located high bin (the four wanted ranks
  // often share bins: each distinct bin is histogrammed once).
  std::vector<std::uint32_t> bins;
  int slot_of[4];
  for (int w = 0; w < 4; ++w) {
    const auto at = std::find(bins.begin(), bins.end(), where[w].bin);
    slot_of[w] = static_cast<int>(at - bins.begin());
    if (at == bins.end()) bins.push_back(where[w].bin);
  }
  std::vector<std::vector<std::uint64_t>> partial(chunks.size());
  for_each_chunk(chunks.size(), pool, [&](std::size_t c) {
    std::vector<std::uint64_t>& h = partial[c];
    h.assign(bins.size() * kBins, 0);
    for (const Piece& piece : chunks[c]) low_bits_pass(piece, bins, h.data());
  });
  std::vector<std::uint64_t> second(bins.size() * kBins, 0);
  for (const auto& h : partial) {
    for (std::size_t i = 0; i < second.size(); ++i) second[i] += h[i];
  }
  reduce.sum(second);
  float value[4];
  for (int w = 0; w < 4; ++w) {
    const Located low =
        locate(std::span<const std::uint64_t>(
                   second.data() + static_cast<std::size_t>(slot_of[w]) * kBins, kBins),
               where[w].rank_in_bin);
    value[w] = from_bits((where[w].bin << 16) | low.bin);
  }
  for (int i = 0; i < 2; ++i) {
    const double pos = qs[i] * static_cast<double>(n - 1);
    const double frac = pos - std::floor(pos);
    const double a = value[2 * i], b = value[2 * i + 1];
    (i == 0 ? s.p95_abs : s.p99_abs) = a + (b - a) * frac;
  }
  return s;
}

}  // namespace cpd
