// Drift statistics: the quantile definition on hand-computed cases, the exact distributed
// computation against sorting, and invariance to how a tensor is cut into parts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/util/thread_pool.h"
#include "cpdrift/bf16.h"
#include "metrics/diff_stats.h"

using namespace cpd;

namespace {

DiffStats of_diffs(const std::vector<float>& diffs) {
  const DiffPart part{diffs.data(), nullptr, diffs.size()};
  return compute_diff_stats(std::span<const DiffPart>(&part, 1));
}

}  // namespace

TEST_CASE("quantile definition: linear interpolation at q·(n-1), as torch.quantile") {
  const std::vector<float> one{3.5f};
  CHECK(sorted_quantile(one, 0.95) == 3.5);
  const std::vector<float> two{1.0f, 2.0f};
  CHECK(sorted_quantile(two, 0.95) == doctest::Approx(1.95).epsilon(1e-15));
  CHECK(sorted_quantile(two, 0.99) == doctest::Approx(1.99).epsilon(1e-15));
  const std::vector<float> five{1, 2, 3, 4, 5};
  CHECK(sorted_quantile(five, 0.95) == doctest::Approx(4.8).epsilon(1e-15));  // 3.8 → 4 + 0.8
  CHECK(sorted_quantile(five, 0.99) == doctest::Approx(4.96).epsilon(1e-15));
  const std::vector<float> ties{0, 0, 0, 7, 7, 7, 7, 7, 7, 7};
  CHECK(sorted_quantile(ties, 0.95) == 7.0);
  const std::vector<float> step{0, 0, 0, 0, 0, 0, 0, 0, 0, 1};  // 0.95·9 = 8.55 → 0.55
  CHECK(sorted_quantile(step, 0.95) == doctest::Approx(0.55).epsilon(1e-15));
  CHECK(sorted_quantile(std::vector<float>{}, 0.5) == 0.0);
  // FP64 values (the RL metrics' |Δ|) take the same definition, without rounding to FP32.
  const std::vector<double> fine{1.0, 1.0 + 1e-12};
  CHECK(sorted_quantile(fine, 0.5) == 1.0 + 0.5 * ((1.0 + 1e-12) - 1.0));
}

TEST_CASE("stats: hand-computed small cases") {
  const DiffStats s1 = of_diffs({0.25f});
  CHECK(s1.active_count == 1);
  CHECK(s1.max_abs == 0.25);
  CHECK(s1.mean_abs == 0.25);
  CHECK(s1.p95_abs == 0.25);
  CHECK(s1.p99_abs == 0.25);
  const DiffStats s5 = of_diffs({5, 1, 4, 2, 3});
  CHECK(s5.max_abs == 5.0);
  CHECK(s5.mean_abs == 3.0);
  CHECK(s5.p95_abs == doctest::Approx(4.8).epsilon(1e-15));
  CHECK(s5.p99_abs == doctest::Approx(4.96).epsilon(1e-15));
  CHECK(s5.mismatch_count == 5);
  const DiffStats zeros = of_diffs({0, 0, 0});
  CHECK(zeros.bitwise_equal());
  CHECK(zeros.max_abs == 0.0);
}

TEST_CASE("stats: the sum behind mean_abs is exact, rounded once") {
  // 1 + 2^-53 + 2^-54 lies past the midpoint between 1 and the next double: rounded once it is
  // that next double, while adding in FP64 from the largest term (1 + 2^-53 = 1, …) gives 1.
  const std::vector<float> d{1.0f, std::ldexp(1.0f, -53), std::ldexp(1.0f, -54)};
  CHECK(of_diffs(d).mean_abs * 3 == std::nextafter(1.0, 2.0));
  // Tiny and huge together: the denormal bin and the top bin in one sum, neither dropped nor
  // overflowing (the tiny term cannot change the rounded total; losing the huge one would).
  const std::vector<float> e{std::ldexp(1.0f, -149), 3.0e38f};
  CHECK(of_diffs(e).mean_abs == (static_cast<double>(3.0e38f) + std::ldexp(1.0, -149)) / 2);
}

namespace {

// The exact mean of non-negative floats in [2^-90, 2^-1) or 0, the oracle of the next test:
// their sum in units of 2^-113 is an integer below 2^122 for up to 2^10 of them, converted to
// FP64 rounded once (to nearest, ties to even), scaled exactly, then divided by n.
double exact_mean(const std::vector<float>& d) {
  unsigned __int128 units = 0;
  bool in_range = true;
  for (const float x : d) {
    in_range = in_range && (x == 0.0f || (x >= std::ldexp(1.0f, -90) && x < 0.5f));
    units += static_cast<unsigned __int128>(std::ldexp(static_cast<double>(x), 113));
  }
  REQUIRE(in_range);
  return std::ldexp(static_cast<double>(units), -113) / static_cast<double>(d.size());
}

}  // namespace

TEST_CASE("stats: the exact sum, a block summed whole or value by value") {
  // A block of 32 diffs whose exponents lie at most 35 apart is summed as one 64-bit integer
  // and binned in 24-bit pieces; one spread wider adds each diff to its own bin. Blocks either
  // side of that edge, and many random blocks of both kinds, against the exact mean. Sums
  // where FP64 addition in any order loses bits: 2^-1 - 2^-25 beside 2^-60 and 2^-90.
  const auto block = [](int span) {
    std::vector<float> d(32, 0.0f);
    for (std::size_t i = 0; i < d.size(); ++i)
      d[i] = std::ldexp(1.0f + static_cast<float>(i) * 0x1p-23f, -2 - static_cast<int>(i % 3));
    d[5] = std::ldexp(0x1.fffffep-1f, -1 - span);  // span binades below the others' top
    d[9] = 0x1.fffffep-2f;
    return d;
  };
  for (const int span : {1, 34, 35, 36, 37, 60, 87}) {
    CAPTURE(span);
    const std::vector<float> d = block(span);
    CHECK(of_diffs(d).mean_abs == exact_mean(d));
  }
  std::mt19937_64 rng(23);
  for (const int width : {10, 30, 36, 40, 88}) {  // the exponents' spread within a block
    CAPTURE(width);
    std::vector<float> d(32 * 31);
    for (float& x : d) {
      const int e = -2 - static_cast<int>(rng() % static_cast<std::uint64_t>(width + 1));
      x = rng() % 9 == 0 ? 0.0f
                         : std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f, e);
    }
    CHECK(of_diffs(d).mean_abs == exact_mean(d));
  }
  // Denormals beside the least normals (a denormal weighs as the least normal binade), and the
  // largest floats, whose block sum reaches the bins above FP32's exponents.
  std::vector<float> tiny(32), huge(32);
  for (std::size_t i = 0; i < 32; ++i) {
    const std::uint32_t t =
        (i % 2 == 0 ? 0x00000001u : 0x00800000u) + static_cast<std::uint32_t>(i);
    std::memcpy(&tiny[i], &t, sizeof t);
    const std::uint32_t h = 0x7f7fffffu - static_cast<std::uint32_t>(i);
    std::memcpy(&huge[i], &h, sizeof h);
  }
  long double tiny_sum = 0, huge_sum = 0;  // exact: a few binades of 24-bit values
  for (std::size_t i = 0; i < 32; ++i) {
    tiny_sum += tiny[i];
    huge_sum += huge[i];
  }
  CHECK(of_diffs(tiny).mean_abs == static_cast<double>(tiny_sum) / 32);
  CHECK(of_diffs(huge).mean_abs == static_cast<double>(huge_sum / 32));
  // Infinities and NaNs inside a summed block are counted, not summed.
  std::vector<float> with_inf = block(3);
  with_inf[7] = INFINITY;
  with_inf[8] = NAN;
  CHECK(of_diffs(with_inf).nonfinite_count == 2);
}

TEST_CASE("stats: candidate vs reference semantics") {
  const float inf = INFINITY;
  const std::vector<float> c{1.0f, -inf, 0.0f, 2.0f, -0.0f};
  const std::vector<float> r{1.0f, -inf, -0.0f, 2.5f, 0.0f};
  const DiffPart part{c.data(), r.data(), c.size()};
  const DiffStats s = compute_diff_stats(std::span<const DiffPart>(&part, 1));
  CHECK(s.finite());  // -inf vs -inf is an exact match, diff 0
  CHECK(s.max_abs == 0.5);
  CHECK(s.mismatch_count == 3);  // +0 vs -0 counts as a bit mismatch, not as drift
  CHECK(s.max_ulp == ulp_distance(2.0f, 2.5f));
  CHECK(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)) == 1);
  CHECK(ulp_distance(-0.0f, 0.0f) == 0);
  CHECK(ulp_distance(std::nextafter(0.0f, -1.0f), std::nextafter(0.0f, 1.0f)) == 2);
  CHECK(ulp_distance(-2.0f, 2.0f) == 2 * std::uint64_t{0x40000000});  // 2.0f is 0x40000000
  CHECK(ulp_distance(-inf, inf) == 2 * std::uint64_t{0x7f800000});
  CHECK(ulp_distance(NAN, 1.0f) == std::numeric_limits<std::uint64_t>::max());
  CHECK(ulp_distance(1.0f, NAN) == std::numeric_limits<std::uint64_t>::max());

  const std::vector<float> bad_c{1.0f, NAN, 3.0f}, bad_r{1.0f, 1.0f, inf};
  const DiffPart bad{bad_c.data(), bad_r.data(), bad_c.size()};
  const DiffStats b = compute_diff_stats(std::span<const DiffPart>(&bad, 1));
  CHECK_FALSE(b.finite());
  CHECK(b.nonfinite_count == 2);
  CHECK_FALSE(b.bitwise_equal());
}

TEST_CASE("stats: exact against sorting, and independent of how the data is cut") {
  std::mt19937_64 rng(17);
  std::lognormal_distribution<float> dist(-12.0f, 4.0f);  // spans many binades
  for (const std::size_t n : {2u, 3u, 20u, 1001u, 65536u, 300007u}) {
    std::vector<float> d(n);
    for (float& x : d) x = dist(rng);
    for (std::size_t i = 0; i < n; i += 7) d[i] = d[(i * 13) % n];  // ties
    std::vector<float> sorted = d;
    std::sort(sorted.begin(), sorted.end());
    const DiffStats s = of_diffs(d);
    CHECK(s.active_count == n);
    CHECK(s.max_abs == sorted.back());
    CHECK(s.p95_abs == sorted_quantile(sorted, 0.95));
    CHECK(s.p99_abs == sorted_quantile(sorted, 0.99));
    long double exact = 0;
    for (float x : d) exact += x;
    CHECK(std::fabs(s.mean_abs - static_cast<double>(exact / n)) <= 1e-15 * s.mean_abs);

    // The same values cut into uneven parts, in another order: every field identical.
    std::vector<DiffPart> parts;
    std::size_t at = 0, len = 1;
    while (at < n) {
      const std::size_t take = std::min(len, n - at);
      parts.push_back(DiffPart{d.data() + at, nullptr, take});
      at += take;
      len = len * 3 + 1;
    }
    std::reverse(parts.begin(), parts.end());
    const DiffStats t = compute_diff_stats(parts);
    CHECK(t.max_abs == s.max_abs);
    CHECK(t.mean_abs == s.mean_abs);
    CHECK(t.p95_abs == s.p95_abs);
    CHECK(t.p99_abs == s.p99_abs);
    CHECK(t.mismatch_count == s.mismatch_count);
  }
}

TEST_CASE("stats: order statistics of values that share their top bits, among many zeros") {
  // Every nonzero value lies within 5000 ulp of 1: one bin of the radix select's first level
  // and a few of its second, so the ranks are found by the later levels alone; the zeros
  // (exact matches) come first in the order.
  std::mt19937_64 rng(5);
  for (const unsigned zero_percent : {0u, 50u, 97u}) {
    std::vector<float> d(5000);
    for (float& x : d) {
      const std::uint32_t u = 0x3f800000u + static_cast<std::uint32_t>(rng() % 5000);
      std::memcpy(&x, &u, sizeof x);
      if (rng() % 100 < zero_percent) x = 0.0f;
    }
    std::vector<float> sorted = d;
    std::sort(sorted.begin(), sorted.end());
    const DiffStats s = of_diffs(d);
    CHECK(s.max_abs == sorted.back());
    CHECK(s.p95_abs == sorted_quantile(sorted, 0.95));
    CHECK(s.p99_abs == sorted_quantile(sorted, 0.99));
  }
}

TEST_CASE("stats: whole blocks of exact matches, and NaN against the same NaN inside one") {
  // Runs of equal values are skipped a block at a time; a NaN with the same bits on both sides
  // is still a non-finite diff, and +0 vs -0 still a bit mismatch of diff 0.
  std::vector<float> c(64), r(64);
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = r[i] = static_cast<float>(i) * 0.25f;
  const DiffPart equal{c.data(), r.data(), c.size()};
  const DiffStats e = compute_diff_stats(std::span<const DiffPart>(&equal, 1));
  CHECK(e.bitwise_equal());
  CHECK(e.active_count == 64);
  CHECK(e.max_abs == 0.0);
  c[20] = r[20] = NAN;
  c[40] = 0.0f;
  r[40] = -0.0f;
  c[50] = 3.0f;
  const DiffPart mixed{c.data(), r.data(), c.size()};
  const DiffStats m = compute_diff_stats(std::span<const DiffPart>(&mixed, 1));
  CHECK(m.nonfinite_count == 1);
  CHECK(m.mismatch_count == 2);  // +0 vs -0, and 3 vs 12.5
  const DiffPart bf16{c.data(), r.data(), c.size(), true};
  CHECK(compute_diff_stats(std::span<const DiffPart>(&bf16, 1)).nonfinite_count == 1);
}

TEST_CASE("stats: a wanted bin holding more diffs than are kept, found by passes over the data") {
  // Three million diffs within one top-level bin (a quarter binade at 1): more than the 2^21
  // the radix select keeps, so its later levels pass over the data; the ranks are the sort's.
  std::mt19937_64 rng(9);
  std::vector<float> d(3'000'000);
  for (float& x : d) {
    const std::uint32_t u = 0x3f800000u + static_cast<std::uint32_t>(rng() % 0x1fffffu);
    std::memcpy(&x, &u, sizeof x);
  }
  std::vector<float> sorted = d;
  std::sort(sorted.begin(), sorted.end());
  const DiffStats s = of_diffs(d);
  CHECK(s.max_abs == sorted.back());
  CHECK(s.p95_abs == sorted_quantile(sorted, 0.95));
  CHECK(s.p99_abs == sorted_quantile(sorted, 0.99));
}

TEST_CASE("stats: BF16 candidates read rounded are the statistics of the rounded values") {
  // bf16_candidate rounds each candidate once (round_bf16) inside the branch-free blocks: over
  // many blocks of values that round to even, overflow to inf, NaNs of both signs and payloads,
  // zeros of both signs and denormals, every figure equals the one of candidates rounded first.
  std::mt19937_64 rng(11);
  const auto random_float = [&] {
    switch (rng() % 8) {
      case 0:
        return NAN;
      case 1: {  // a NaN with another payload and sign
        const std::uint32_t u = 0xff800001u | static_cast<std::uint32_t>(rng() & 0x3fffffu);
        float x;
        std::memcpy(&x, &u, sizeof x);
        return x;
      }
      case 2:
        return std::numeric_limits<float>::max();  // rounds past the largest BF16
      case 3:
        return (rng() & 1) != 0 ? 0.0f : -0.0f;
      case 4:
        return std::ldexp(1.0f, -140);  // denormal
      case 5:
        return 1.0f + std::ldexp(1.0f, -8);  // a tie
      default: {
        const std::uint32_t u = static_cast<std::uint32_t>(rng());
        float x;
        std::memcpy(&x, &u, sizeof x);
        return x;
      }
    }
  };
  std::vector<float> c(5000), r(5000), rounded(5000);
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i] = random_float();
    r[i] = (rng() % 3) == 0 ? round_bf16(c[i]) : random_float();
    rounded[i] = round_bf16(c[i]);
  }
  const DiffPart as_bf16{c.data(), r.data(), c.size(), true};
  const DiffPart pre{rounded.data(), r.data(), c.size(), false};
  const DiffStats a = compute_diff_stats(std::span<const DiffPart>(&as_bf16, 1));
  const DiffStats b = compute_diff_stats(std::span<const DiffPart>(&pre, 1));
  CHECK(a.active_count == b.active_count);
  CHECK(a.mismatch_count == b.mismatch_count);
  CHECK(a.nonfinite_count == b.nonfinite_count);
  CHECK(a.max_ulp == b.max_ulp);
  CHECK(a.max_ulp == std::numeric_limits<std::uint64_t>::max());  // a NaN was in a block
  CHECK(std::memcmp(&a.max_abs, &b.max_abs, sizeof a.max_abs) == 0);
  CHECK(std::memcmp(&a.mean_abs, &b.mean_abs, sizeof a.mean_abs) == 0);
  CHECK(std::memcmp(&a.p95_abs, &b.p95_abs, sizeof a.p95_abs) == 0);
  CHECK(std::memcmp(&a.p99_abs, &b.p99_abs, sizeof a.p99_abs) == 0);
  CHECK(a.nonfinite_count > 0);
}

namespace {

// compute_grouped_diff_stats against compute_diff_stats of the whole and of each group alone,
// every field bit for bit; returns the grouped figures.
std::vector<DiffStats> grouped_as_alone(const std::vector<DiffPart>& parts,
                                        const std::vector<int>& group_of, int groups) {
  const auto same = [](const DiffStats& a, const DiffStats& b) {
    CHECK(a.active_count == b.active_count);
    CHECK(a.mismatch_count == b.mismatch_count);
    CHECK(a.nonfinite_count == b.nonfinite_count);
    CHECK(a.max_ulp == b.max_ulp);
    CHECK(std::memcmp(&a.max_abs, &b.max_abs, sizeof a.max_abs) == 0);
    CHECK(std::memcmp(&a.mean_abs, &b.mean_abs, sizeof a.mean_abs) == 0);
    CHECK(std::memcmp(&a.p95_abs, &b.p95_abs, sizeof a.p95_abs) == 0);
    CHECK(std::memcmp(&a.p99_abs, &b.p99_abs, sizeof a.p99_abs) == 0);
  };
  ThreadPool pool(2);
  const std::vector<DiffStats> grouped =
      compute_grouped_diff_stats(parts, group_of, groups, CounterReducer{}, &pool);
  REQUIRE(grouped.size() == static_cast<std::size_t>(groups + 1));
  same(grouped[0], compute_diff_stats(parts));
  for (int g = 0; g < groups; ++g) {
    CAPTURE(g);
    std::vector<DiffPart> alone;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (group_of[i] == g) alone.push_back(parts[i]);
    }
    same(grouped[static_cast<std::size_t>(g + 1)], compute_diff_stats(alone));
  }
  return grouped;
}

}  // namespace

TEST_CASE("stats: grouped statistics equal the whole's and each group's computed alone") {
  // The whole and its groups from one set of passes (what the per-CP-rank figures use) must be
  // bit for bit the separate computations. Groups 0 and 1 hold 1.5 M diffs each in one top-level
  // bin: each group keeps its wanted bin's diffs, while the whole (3 M there) passes over the
  // data per level. Group 2 is BF16-read candidates against references with NaNs and exact
  // matches; group 3 is empty; one part belongs to no group (the whole only).
  std::mt19937_64 rng(23);
  const auto near_one = [&] {
    const std::uint32_t u = 0x3f800000u + static_cast<std::uint32_t>(rng() % 0x1fffffu);
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  std::vector<float> g0(1'500'000), g1(1'500'000), c(70'000), r(70'000), loose(5'000);
  for (float& x : g0) x = near_one();
  for (float& x : g1) x = rng() % 50 == 0 ? 0.0f : near_one();
  std::lognormal_distribution<float> dist(-8.0f, 3.0f);
  for (std::size_t i = 0; i < c.size(); ++i) {
    r[i] = dist(rng);
    c[i] = i % 5 == 0 ? round_bf16(r[i]) : r[i] * (1.0f + dist(rng) * 1e-3f);
    if (i % 9973 == 0) c[i] = NAN;
  }
  for (float& x : loose) x = dist(rng);
  const std::vector<DiffPart> parts = {{g0.data(), nullptr, 700'000},
                                       {c.data(), r.data(), 40'000, true},
                                       {g1.data(), nullptr, g1.size()},
                                       {loose.data(), nullptr, loose.size()},
                                       {g0.data() + 700'000, nullptr, 800'000},
                                       {c.data() + 40'000, r.data() + 40'000, 30'000, true}};
  const std::vector<int> group_of = {0, 2, 1, -1, 0, 2};
  constexpr int kGroups = 4;

  const std::vector<DiffStats> grouped = grouped_as_alone(parts, group_of, kGroups);
  CHECK(grouped[0].active_count == 3'075'000);
  CHECK(grouped[3].nonfinite_count > 0);
  CHECK(grouped[4].active_count == 0);
}

TEST_CASE("stats: grouped statistics whose group and whole want eight different bins") {
  // 101 diffs a binade apart in group 0 (ranks 95, 96, 99 and 100 in four top-level bins) and
  // 101 far larger ones in group 1, which hold the whole's four wanted ranks: group 0's pieces
  // are collected for eight bins at once.
  std::vector<float> small(101), large(101);
  for (int i = 0; i < 101; ++i) {
    small[static_cast<std::size_t>(i)] = std::ldexp(1.0f, i - 100);
    large[static_cast<std::size_t>(i)] = std::ldexp(1.0f, i + 1);
  }
  const std::vector<DiffPart> parts = {{small.data(), nullptr, small.size()},
                                       {large.data(), nullptr, large.size()}};
  const std::vector<DiffStats> grouped = grouped_as_alone(parts, {0, 1}, 2);
  CHECK(grouped[0].p99_abs == large[97] + (large[98] - large[97]) * (0.99 * 201 - 198));
  CHECK(grouped[1].p95_abs == small[95]);
}
