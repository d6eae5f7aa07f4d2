#include "metrics/diff_passes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "cpdrift/bf16.h"

namespace cpd::diff_passes {
namespace {

// The passes run over blocks of kBlock values in two steps: a loop without branches that the
// compiler vectorises (each value's diff bits, and the block's mismatches, largest ulp
// distance, largest diff and NaN flag), then per block with a nonzero diff the histogram and
// the exact sum, which need a scattered increment a value (blocks of 32: two AVX-512 vectors).
// Neither scalar step branches per value: bins and flags are computed in the vectorised loop,
// and spare slots take what is not counted.

// round_bf16's bits without branches (the same result: NaN quieted, otherwise to nearest even).
inline std::uint32_t round_bf16_bits(std::uint32_t u) { return bf16_bits_rn_select(u) << 16; }

struct BlockDiffs {
  std::uint32_t diff[kBlock];  // the diff's bits, 0 for an exact match
  std::uint32_t nonzero = 0;   // how many diffs are not 0
  std::uint32_t mismatches = 0, max_ulp = 0, max_bits = 0;
  bool nan = false;  // a NaN among the values: the ulp distance is then UINT64_MAX
};

// The diffs of kBlock values (candidates c, references r or null), branch-free so that it
// vectorises: a diff is |c - r| masked to +0 where c == r, the ulp distance the distance of the
// order keys.
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

template <bool kReference, bool kBf16>
void first_pass_of(const Piece& c, LocalFirst& acc) {
  constexpr std::size_t kWays = LocalFirst::kWays;
  static_assert(kBlock % kWays == 0);
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
    // block is exact matches, so it lands there too). A denormal's exponent bin is 1, whose
    // weight is bin 0's (sum_from_bins). The block's least and largest exponent bins are over
    // its finite nonzero diffs (least is the spare slot when there are none).
    std::uint32_t top[kBlock], exponent[kBlock], mantissa[kBlock], infinite = 0;
    std::uint32_t least = kExponents, largest = 0;
    for (std::size_t k = 0; k < kBlock; ++k) {
      const std::uint32_t u = b.diff[k], e = u >> 23;
      const std::uint32_t finite = static_cast<std::uint32_t>(u < 0x7f800000u);
      const std::uint32_t summed = 0u - (finite & static_cast<std::uint32_t>(u != 0));  // mask
      top[k] = u == 0 ? static_cast<std::uint32_t>(kBins) : u >> kLevelShift[0];
      exponent[k] = (std::max(e, 1u) & summed) | (static_cast<std::uint32_t>(kExponents) & ~summed);
      mantissa[k] = ((u & 0x7fffffu) | (e == 0 ? 0u : 0x800000u)) & summed;
      least = std::min(least, exponent[k]);
      largest = std::max(largest, exponent[k] & summed);
      infinite += 1u - finite;
    }
    nonfinite += infinite;
    for (std::size_t k = 0; k < kBlock; k += kWays) {
      for (std::size_t w = 0; w < kWays; ++w) ++acc.hist[w][top[k + w]];
    }
    // The block's sum as one integer in units of bin `least` where it fits in 64 bits: 32
    // mantissas below 2^24, shifted by at most kSpan, stay below 2^(24 + kSpan + 5). It goes to
    // the bins as three 24-bit pieces. Otherwise each diff goes to its own bin.
    constexpr std::uint32_t kSpan = 35;
    if (least <= largest && largest - least <= kSpan) {
      std::uint64_t total = 0;
      for (std::size_t k = 0; k < kBlock; ++k) {
        const std::uint32_t shift = mantissa[k] == 0 ? 0u : exponent[k] - least;
        total += std::uint64_t{mantissa[k]} << shift;
      }
      acc.sums[0][least] += total & 0xffffffu;
      acc.sums[1][least + 24] += (total >> 24) & 0xffffffu;
      acc.sums[2][least + 48] += total >> 48;
      return;
    }
    for (std::size_t k = 0; k < kBlock; k += kWays) {
      for (std::size_t w = 0; w < kWays; ++w) acc.sums[w][exponent[k + w]] += mantissa[k + w];
    }
  });
  acc.counters[FirstPass::kZeros] += zeros;
  acc.counters[FirstPass::kMismatch] += mismatches;
  acc.counters[FirstPass::kNonfinite] += nonfinite;
  acc.counters[FirstPass::kCount] += c.end - c.begin;
  acc.max_bits = max_bits;
  acc.max_ulp = max_ulp;
}

// collect (`bins`: the wanted bins of the whole tensor and of the piece's group, at most kBins).
// A block is first tested as a whole (vectorised, which also flags each diff), as few of its
// diffs are usually kept; a block with some is compacted without branches, each value written
// and the count advanced by its flag, so `out` holds kBlock slots past the last kept diff.
template <bool kReference, bool kBf16, std::size_t kBins>
void collect_of(const Piece& c, std::span<const std::uint32_t> bins, float* out,
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
      out[count] = from_bits(b.diff[k]);
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

// level_pass, used when the wanted bins hold too many diffs to keep. Per block, each diff's
// histogram slot is found without branches (vectorised; `kNone` for a diff that is not counted),
// the counted slots are compacted as in collect_of, then incremented: a share of the diffs is
// counted, at no predictable places.
template <bool kReference, bool kBf16>
void level_pass_of(const Piece& c, int level, std::span<const std::uint32_t> prefixes,
                   std::uint64_t* h) {
  constexpr std::size_t kMaxPrefixes = 4;
  constexpr std::uint32_t kNone = ~0u;
  if (prefixes.size() > kMaxPrefixes) throw std::logic_error("level_pass: more than 4 prefixes");
  const int above = kLevelShift[level - 1], shift = kLevelShift[level];
  const std::uint32_t bins = static_cast<std::uint32_t>(level_bins(level)), mask = bins - 1;
  std::uint32_t wanted[kMaxPrefixes];  // kNone: no prefix (u >> above is below 2^22)
  std::fill(wanted, wanted + kMaxPrefixes, kNone);
  std::copy(prefixes.begin(), prefixes.end(), wanted);
  for_each_block<kReference, kBf16>(c, [&](const BlockDiffs& b, std::size_t n) {
    if (b.nonzero == 0) return;
    std::uint32_t slot[kBlock], counted[kBlock];
    for (std::size_t k = 0; k < kBlock; ++k) {
      const std::uint32_t u = b.diff[k], top = u >> above, bin = (u >> shift) & mask;
      std::uint32_t at = kNone;
      for (std::uint32_t x = 0; x < kMaxPrefixes; ++x) at = top == wanted[x] ? x * bins + bin : at;
      slot[k] = u == 0 ? kNone : at;
    }
    std::size_t count = 0;
    for (std::size_t k = 0; k < n; ++k) {
      counted[count] = slot[k];
      count += slot[k] != kNone;
    }
    for (std::size_t i = 0; i < count; ++i) ++h[counted[i]];
  });
}

}  // namespace

void level_pass(const Piece& c, int level, std::span<const std::uint32_t> prefixes,
                std::uint64_t* h) {
  by_kind(c, [&](auto reference, auto bf16) {
    level_pass_of<decltype(reference)::value, decltype(bf16)::value>(c, level, prefixes, h);
  });
}

void collect(const Piece& c, std::span<const std::uint32_t> bins, float* out, std::size_t& count) {
  // Eight bins only where a group's wanted bins differ from the whole's: testing eight makes
  // every call slower.
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

}  // namespace cpd::diff_passes
