// The attention core: the tile kernel against the canonical scalar definition (bitwise),
// both against a naive FP64 attention (stated tolerances), the ordered merge.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpdrift/attention_math.h"
#include "cpdrift/bf16.h"
#include "engine/merge_checks.h"
#include "fp64_attention.h"
#include "kernels/cpu/attention.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::attention_fp64;
using cpd::testing::random_rows;
using cpd::testing::same_bits;

namespace {

constexpr int kDim = 128;
constexpr double kU = 5.9604644775390625e-08;  // FP32 unit roundoff, 2^-24

const float kScale = ModelDims{}.softmax_scale();

}  // namespace

TEST_CASE("tile kernel equals the canonical scalar definition bit for bit") {
  // Calls of 1..64 rows (one to four lane tiles, the last one short) at positions before,
  // across and after the KV block, both roundings: every row must equal partial_state_row over
  // exactly its visible keys.
  const std::vector<float> q = random_rows(64, 1), k = random_rows(300, 2), v = random_rows(300, 3);
  TileScratch scratch;
  for (const ProbRounding rounding : {ProbRounding::none, ProbRounding::bf16}) {
    for (const Range keys : {Range{100, 101}, Range{100, 107}, Range{100, 108}, Range{100, 109},
                             Range{100, 300}, Range{0, 17}}) {
      for (const std::int64_t first : {0LL, 90LL, 100LL, 103LL, 150LL, 290LL, 400LL}) {
        for (const int rows : {1, 3, 4, 5, 15, 16, 17, 33, 48, 63, 64}) {
          std::vector<float> out(rows * kDim), lse(rows);
          const float* kb = k.data() + keys.begin * kDim;
          const float* vb = v.data() + keys.begin * kDim;
          attend_tile(q.data(), first, rows, kb, vb, keys, kDim, kScale, rounding, scratch,
                      out.data(), lse.data());
          for (int r = 0; r < rows; ++r) {
            const std::int64_t visible = std::clamp<std::int64_t>(
                std::min(keys.end, first + r + 1) - keys.begin, 0, keys.size());
            float ref_out[kDim], ref_lse;
            partial_state_row(q.data() + r * kDim, kb, vb, static_cast<int>(visible), kDim, kScale,
                              rounding, ref_out, &ref_lse);
            CHECK(same_bits(out.data() + r * kDim, ref_out, kDim));
            CHECK(bits_of(lse[r]) == bits_of(ref_lse));
          }
        }
      }
    }
  }
}

namespace {

// K or V rows laid out in pages the way a rollout cache holds them: logical page i of `rows`
// in physical page table[i] of a pool whose pages are 2·page_size rows apart (the gaps hold
// NaN, so a read that misses its slot cannot go unnoticed).
struct PagedCopy {
  std::vector<float> pool;
  std::vector<int> table;
  int page_size;
  std::int64_t rows;
  KvRows view() const {
    return KvRows::paged(pool.data(), table.data(), page_size, 2LL * page_size * kDim, rows);
  }
};

PagedCopy page_out(const std::vector<float>& rows, int page_size, std::uint64_t seed) {
  const auto n = static_cast<std::int64_t>(rows.size()) / kDim;
  const auto pages = static_cast<int>((n + page_size - 1) / page_size);
  PagedCopy c{std::vector<float>(static_cast<std::size_t>(pages) * 2 * page_size * kDim, NAN),
              std::vector<int>(static_cast<std::size_t>(pages)), page_size, n};
  for (int i = 0; i < pages; ++i) c.table[i] = i;
  std::shuffle(c.table.begin(), c.table.end(), std::mt19937_64(seed));
  for (std::int64_t j = 0; j < n; ++j) {
    std::copy_n(rows.data() + j * kDim, kDim,
                c.pool.data() + (c.table[j / page_size] * 2LL * page_size + j % page_size) * kDim);
  }
  return c;
}

}  // namespace

TEST_CASE("tile kernel with a fresh scratch: no row group reads past the last lane tile") {
  // 31 and 32 rows end in a group at lanes 14 and 15 of the last tile, which a four-row block
  // would read past; the scratch is fresh and sized exactly, so the sanitized build sees it.
  const std::vector<float> q = random_rows(32, 21), k = random_rows(8, 22), v = random_rows(8, 23);
  for (const int rows : {31, 32}) {
    TileScratch scratch;
    std::vector<float> out(rows * kDim), lse(rows);
    attend_tile(q.data(), 100, rows, k.data(), v.data(), Range{0, 8}, kDim, kScale,
                ProbRounding::none, scratch, out.data(), lse.data());
    for (int r = 0; r < rows; ++r) {
      float ref_out[kDim], ref_lse;
      partial_state_row(q.data() + r * kDim, k.data(), v.data(), 8, kDim, kScale,
                        ProbRounding::none, ref_out, &ref_lse);
      CHECK(same_bits(out.data() + r * kDim, ref_out, kDim));
    }
  }
}

TEST_CASE("tile kernel across key chunks: rows whose last key falls on either side of a chunk") {
  // P·V runs over chunks of kAttendKeyChunk keys for all four lane tiles; rows of one row group
  // stopping in different chunks, exactly at a boundary, one past it, and in the third and sixth
  // chunk, and lane tiles that stop in different chunks.
  constexpr std::int64_t c = kAttendKeyChunk;
  const Range keys{0, 5 * c + 60};
  const std::vector<float> q = random_rows(64, 11), k = random_rows(keys.end, 12),
                           v = random_rows(keys.end, 13);
  TileScratch scratch;
  for (const std::int64_t first :
       {c - 14, c - 3, c - 2, c - 1, 2 * c - 6, 2 * c - 1, 3 * c - 4, 5 * c - 20}) {
    std::vector<float> out(64 * kDim), lse(64);
    attend_tile(q.data(), first, 64, k.data(), v.data(), keys, kDim, kScale, ProbRounding::none,
                scratch, out.data(), lse.data());
    for (int r = 0; r < 64; ++r) {
      const int visible = static_cast<int>(std::min(keys.end, first + r + 1));
      float ref_out[kDim], ref_lse;
      partial_state_row(q.data() + r * kDim, k.data(), v.data(), visible, kDim, kScale,
                        ProbRounding::none, ref_out, &ref_lse);
      CAPTURE(first);
      CAPTURE(r);
      CHECK(same_bits(out.data() + r * kDim, ref_out, kDim));
      CHECK(bits_of(lse[r]) == bits_of(ref_lse));
    }
  }
}

TEST_CASE("tile kernel reads paged K/V in place: the bits of contiguous rows, wherever pages lie") {
  // Page sizes that divide the block, cut through it, and are one row; key blocks starting on
  // and off a page boundary; both roundings. The negative control swaps two entries of the
  // block table without moving the pages: the kernel must then see different keys.
  const std::vector<float> q = random_rows(16, 21), k = random_rows(300, 22),
                           v = random_rows(300, 23);
  TileScratch scratch;
  for (const int page_size : {1, 3, 4, 16}) {
    const PagedCopy pk = page_out(k, page_size, 7 + page_size),
                    pv = page_out(v, page_size, 7 + page_size);
    for (const ProbRounding rounding : {ProbRounding::none, ProbRounding::bf16}) {
      for (const Range keys : {Range{96, 300}, Range{101, 170}, Range{0, 17}}) {
        for (const std::int64_t first : {100LL, 160LL, 299LL}) {
          CAPTURE(page_size);
          CAPTURE(keys.begin);
          std::vector<float> a(16 * kDim), a_lse(16), b(16 * kDim), b_lse(16);
          attend_tile(q.data(), first, 16, k.data() + keys.begin * kDim,
                      v.data() + keys.begin * kDim, keys, kDim, kScale, rounding, scratch, a.data(),
                      a_lse.data());
          attend_tile(q.data(), first, 16, pk.view().from(keys.begin), pv.view().from(keys.begin),
                      keys, kDim, kScale, rounding, scratch, b.data(), b_lse.data());
          CHECK(same_bits(a, b));
          CHECK(same_bits(a_lse, b_lse));
        }
      }
    }
    PagedCopy wrong = pk;
    std::swap(wrong.table[0], wrong.table[1]);
    std::vector<float> a(16 * kDim), a_lse(16), b(16 * kDim), b_lse(16);
    attend_tile(q.data(), 299, 16, pk.view(), pv.view(), Range{0, 300}, kDim, kScale,
                ProbRounding::none, scratch, a.data(), a_lse.data());
    attend_tile(q.data(), 299, 16, wrong.view(), pv.view(), Range{0, 300}, kDim, kScale,
                ProbRounding::none, scratch, b.data(), b_lse.data());
    CHECK_FALSE(same_bits(a, b));  // the scores meet the wrong values
  }
}

TEST_CASE("tile kernel: key rows are adjacent only within a page, whatever their ends say") {
  // Pages of 4 rows packed tightly, the view starting at row 2: keys 0 … 7 lie on logical pages
  // 0, 1, 2, placed in physical pages 0, 3, 2. Key 7 then sits exactly 7 rows after key 0, as
  // if the eight were adjacent, while keys 2 … 5 are elsewhere (physical page 1 holds logical
  // page 3). A kernel that judged adjacency by a group's first and last rows would read page
  // 3's keys; the bits must be those of the contiguous rows.
  constexpr int kPage = 4;
  const std::vector<float> q = random_rows(16, 31), k = random_rows(16, 32),
                           v = random_rows(16, 33);
  const std::vector<int> table{0, 3, 2, 1};
  const auto pooled = [&](const std::vector<float>& rows) {
    std::vector<float> pool(rows.size());
    for (int j = 0; j < 16; ++j)
      std::copy_n(rows.data() + j * kDim, kDim,
                  pool.data() + (table[j / kPage] * kPage + j % kPage) * kDim);
    return pool;
  };
  const std::vector<float> pk = pooled(k), pv = pooled(v);
  const KvRows kp = KvRows::paged(pk.data(), table.data(), kPage, kPage * kDim, 16).from(2),
               vp = KvRows::paged(pv.data(), table.data(), kPage, kPage * kDim, 16).from(2);
  REQUIRE(kp.row(7, kDim) == kp.row(0, kDim) + 7 * kDim);  // the ends line up
  REQUIRE(kp.row(2, kDim) != kp.row(0, kDim) + 2 * kDim);  // the middle does not
  TileScratch scratch;
  const Range keys{2, 14};
  std::vector<float> a(16 * kDim), a_lse(16), b(16 * kDim), b_lse(16);
  attend_tile(q.data(), 20, 16, k.data() + 2 * kDim, v.data() + 2 * kDim, keys, kDim, kScale,
              ProbRounding::none, scratch, a.data(), a_lse.data());
  attend_tile(q.data(), 20, 16, kp, vp, keys, kDim, kScale, ProbRounding::none, scratch, b.data(),
              b_lse.data());
  CHECK(same_bits(a, b));
  CHECK(same_bits(a_lse, b_lse));
}

TEST_CASE("partial state and merged result against a naive FP64 attention") {
  // Error analysis (Higham, sequential sums): a score has |err| ≤ E_s = γ_D·scale·Σ|q_d k_d| +
  // u|s|; the softmax weights then carry relative error ≤ 2E_s + (n + 4)u (exp ≤ 1 ulp, the
  // row sum n roundings, the division), so |out - out64| ≤ 2·(2E_s + (n + 4)u)·max|v| and
  // |lse - lse64| ≤ E_s + (n + 4)u·(1 + |lse|). The bound is per row, from its own data.
  constexpr int n_keys = 200;
  const std::vector<float> q = random_rows(16, 11), k = random_rows(n_keys, 12),
                           v = random_rows(n_keys, 13);
  const double gamma_d = kDim * kU / (1 - kDim * kU);
  for (int r = 0; r < 16; ++r) {
    const float* qr = q.data() + r * kDim;
    double worst_dot = 0, max_v = 0;
    for (int j = 0; j < n_keys; ++j) {
      double a = 0;
      for (int d = 0; d < kDim; ++d) a += std::fabs(qr[d] * k[j * kDim + d]);
      worst_dot = std::max(worst_dot, a);
    }
    for (float x : v) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
    float out[kDim], lse;
    partial_state_row(qr, k.data(), v.data(), n_keys, kDim, kScale, ProbRounding::none, out, &lse);
    std::vector<double> out64;
    double lse64;
    attention_fp64(qr, k.data(), v.data(), n_keys, kDim, kScale, out64, lse64);
    const double e_s = (gamma_d + kU) * kScale * worst_dot;
    const double tol_out = 2 * (2 * e_s + (n_keys + 4) * kU) * max_v;
    const double tol_lse = e_s + (n_keys + 4) * kU * (1 + std::fabs(lse64));
    for (int d = 0; d < kDim; ++d) CHECK(std::fabs(out[d] - out64[d]) <= tol_out);
    CHECK(std::fabs(lse - lse64) <= tol_lse);
  }

  // The same rows split into blocks of 20 and merged in order: the merge adds at most a few
  // roundings per block (logaddexp and two weights ≤ 4 ulp, the weighted sum 2 ulp), so the
  // bound grows by (4 + 2)·u per block on both.
  const int block = 20, blocks = n_keys / block;
  static_assert(n_keys % block == 0);
  for (int r = 0; r < 4; ++r) {
    const float* qr = q.data() + r * kDim;
    float out[kDim] = {}, lse = -INFINITY;
    for (int b = 0; b < blocks; ++b) {
      float bo[kDim], bl;
      partial_state_row(qr, k.data() + b * block * kDim, v.data() + b * block * kDim, block, kDim,
                        kScale, ProbRounding::none, bo, &bl);
      merge_state_row(out, &lse, bo, bl, kDim);
    }
    std::vector<double> out64;
    double lse64;
    attention_fp64(qr, k.data(), v.data(), n_keys, kDim, kScale, out64, lse64);
    double worst_dot = 0;
    for (int j = 0; j < n_keys; ++j) {
      double a = 0;
      for (int d = 0; d < kDim; ++d) a += std::fabs(qr[d] * k[j * kDim + d]);
      worst_dot = std::max(worst_dot, a);
    }
    double max_v = 0;
    for (float x : v) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
    const double e_s = (gamma_d + kU) * kScale * worst_dot;
    const double extra = blocks * 6 * kU;
    for (int d = 0; d < kDim; ++d) {
      CHECK(std::fabs(out[d] - out64[d]) <= 2 * (2 * e_s + (n_keys + 4) * kU + extra) * max_v);
    }
    CHECK(std::fabs(lse - lse64) <= e_s + (n_keys + 4 + blocks * 6) * kU * (1 + std::fabs(lse64)));
  }
}

TEST_CASE("emulated BF16 kernel against FP64 within a BF16 tolerance") {
  // Same BF16-valued inputs for both; the emulation rounds every probability to BF16
  // (relative error ≤ 2^-9) before P·V while the row sum keeps FP32, so
  // |out - out64| ≤ 2^-9·max|v|·(1 + 2^-9) + the FP32 terms, bounded by 2^-8·max|v|.
  const int n_keys = 100;
  std::vector<float> q = random_rows(4, 21), k = random_rows(n_keys, 22),
                     v = random_rows(n_keys, 23);
  for (auto* t : {&q, &k, &v}) {
    for (float& x : *t) x = round_bf16(x);
  }
  double max_v = 0;
  for (float x : v) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
  bool differs_from_fp32 = false;
  for (int r = 0; r < 4; ++r) {
    float out[kDim], lse, out32[kDim], lse32;
    partial_state_row(q.data() + r * kDim, k.data(), v.data(), n_keys, kDim, kScale,
                      ProbRounding::bf16, out, &lse);
    partial_state_row(q.data() + r * kDim, k.data(), v.data(), n_keys, kDim, kScale,
                      ProbRounding::none, out32, &lse32);
    std::vector<double> out64;
    double lse64;
    attention_fp64(q.data() + r * kDim, k.data(), v.data(), n_keys, kDim, kScale, out64, lse64);
    for (int d = 0; d < kDim; ++d) CHECK(std::fabs(out[d] - out64[d]) <= std::ldexp(max_v, -8));
    CHECK(bits_of(lse) == bits_of(lse32));  // the row sum and max never see the rounding
    differs_from_fp32 = differs_from_fp32 || !same_bits(out, out32, kDim);
  }
  CHECK(differs_from_fp32);  // the emulation rounds something, or this test proves nothing
}

TEST_CASE("merge: FP32 fold against the FP64 oracle") {
  // Each fold step is logaddexp (≤ 3 roundings), two exp weights (≤ 1 ulp each) and
  // fma(w_a, o_a, w_b·o_b) (2 roundings): ≤ 8u relative per step on out and lse, so a
  // fold of N states stays within 8·N·u·(1 + max|o|) and 8·N·u·(1 + |lse|).
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> lse_dist(-30.0f, 30.0f), out_dist(-4.0f, 4.0f);
  for (int n : {1, 2, 3, 8, 33}) {
    std::vector<std::vector<float>> outs(n, std::vector<float>(kDim));
    std::vector<float> lses(n);
    std::vector<const float*> ptrs;
    for (int i = 0; i < n; ++i) {
      for (float& x : outs[i]) x = out_dist(rng);
      lses[i] = lse_dist(rng);
      ptrs.push_back(outs[i].data());
    }
    float out[kDim] = {}, lse = -INFINITY;
    for (int i = 0; i < n; ++i) merge_state_row(out, &lse, outs[i].data(), lses[i], kDim);
    OracleRow oracle;
    merge_oracle_row(ptrs, lses, kDim, oracle);
    for (int d = 0; d < kDim; ++d)
      CHECK(std::fabs(out[d] - oracle.out[d]) <= 8 * n * kU * (1 + 4.0));
    CHECK(std::fabs(lse - oracle.lse) <= 8 * n * kU * (1 + std::fabs(oracle.lse)));
  }
  CHECK(merge_oracle_self_test().empty());
}

TEST_CASE("merge: arrival order never reaches the result") {
  std::mt19937_64 rng(9);
  const int n = 12, rows = 5;
  std::vector<std::vector<float>> outs(n, std::vector<float>(rows * kDim));
  std::vector<std::vector<float>> lses(n, std::vector<float>(rows));
  std::normal_distribution<float> normal;
  for (int i = 0; i < n; ++i) {
    for (float& x : outs[i]) x = normal(rng);
    for (float& x : lses[i]) x = 5 * normal(rng);
  }
  lses[4][2] = -INFINITY;  // an empty block for one row
  std::vector<StateRef> canonical;
  for (int i = 0; i < n; ++i) canonical.push_back(StateRef{i, outs[i].data(), lses[i].data()});
  std::vector<float> ref_out(rows * kDim), ref_lse(rows);
  merge_in_block_order(canonical, rows, kDim, ref_out.data(), ref_lse.data());

  std::vector<StateRef> reversed(canonical.rbegin(), canonical.rend());
  std::vector<float> out(rows * kDim), lse(rows);
  merge_in_block_order(reversed, rows, kDim, out.data(), lse.data());
  CHECK(same_bits(out.data(), ref_out.data(), out.size()));
  CHECK(same_bits(lse.data(), ref_lse.data(), lse.size()));
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<StateRef> shuffled = canonical;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    merge_in_block_order(shuffled, rows, kDim, out.data(), lse.data());
    CHECK(same_bits(out.data(), ref_out.data(), out.size()));
    CHECK(same_bits(lse.data(), ref_lse.data(), lse.size()));
  }
  // Negative control: a fold in another order (not sorted) does change bits.
  std::vector<float> other_out(rows * kDim, 0.0f), other_lse(rows, -INFINITY);
  for (auto it = canonical.rbegin(); it != canonical.rend(); ++it) {
    for (int r = 0; r < rows; ++r) {
      merge_state_row(other_out.data() + r * kDim, &other_lse[r], it->out + r * kDim, it->lse[r],
                      kDim);
    }
  }
  CHECK_FALSE(same_bits(other_out.data(), ref_out.data(), other_out.size()));
}

TEST_CASE("merge: a -inf state is the identity, bit for bit") {
  float a[kDim], empty[kDim];
  for (int d = 0; d < kDim; ++d) {
    a[d] = d % 3 == 0 ? -0.0f : 0.37f * d - 11.0f;
    empty[d] = 0.0f;
  }
  const float la = 3.25f;
  float out[kDim];
  std::copy(a, a + kDim, out);
  float lse = la;
  merge_state_row(out, &lse, empty, -INFINITY, kDim);  // s ⊕ identity
  CHECK(same_bits(out, a, kDim));
  CHECK(bits_of(lse) == bits_of(la));
  std::fill(out, out + kDim, 0.0f);
  lse = -INFINITY;
  merge_state_row(out, &lse, a, la, kDim);  // identity ⊕ s
  CHECK(same_bits(out, a, kDim));
  CHECK(bits_of(lse) == bits_of(la));
  CHECK(logaddexp_f32(2.5f, -INFINITY) == 2.5f);
  CHECK(logaddexp_f32(-INFINITY, -1.5f) == -1.5f);
  CHECK(logaddexp_f32(-INFINITY, -INFINITY) == -INFINITY);
}

TEST_CASE("local fold over blocks equals block states merged in order, bit for bit") {
  // The reference path (fold jobs) and the protocol path (block jobs, then the ordered merge)
  // are different code; on the same grid they must agree exactly. The second shape spans two
  // fold tasks of several tiles, with blocks that start inside their rows: such a block is in
  // the future of a task's first tiles and seen by its later ones.
  struct Shape {
    int rows, n;
    std::int64_t first;
    std::vector<Range> grid;
  };
  const Shape shapes[] = {
      {37, 90, 50, {Range{0, 7}, Range{7, 40}, Range{40, 41}, Range{41, 90}}},
      {300,
       320,
       0,
       {Range{0, 7}, Range{7, 100}, Range{100, 101}, Range{101, 200}, Range{200, 320}}},
  };
  ThreadPool pool(2);
  for (const Shape& s : shapes) {
    CAPTURE(s.rows);
    const int rows = s.rows;
    const std::vector<float> q = random_rows(rows, 31), k = random_rows(s.n, 32),
                             v = random_rows(s.n, 33);
    std::vector<float> fold_out(rows * kDim), fold_lse(rows);
    const FoldJob fold{q.data(), s.first,         rows,           k.data(), v.data(), 0,
                       s.grid,   fold_out.data(), fold_lse.data()};
    run_fold_jobs(std::span<const FoldJob>(&fold, 1), kDim, kScale, ProbRounding::none, pool);

    std::vector<std::vector<float>> bo(s.grid.size(), std::vector<float>(rows * kDim)),
        bl(s.grid.size(), std::vector<float>(rows));
    std::vector<BlockJob> jobs;
    for (std::size_t b = 0; b < s.grid.size(); ++b) {
      jobs.push_back(BlockJob{q.data(), s.first, rows, k.data() + s.grid[b].begin * kDim,
                              v.data() + s.grid[b].begin * kDim, s.grid[b], bo[b].data(),
                              bl[b].data()});
    }
    run_block_jobs(jobs, kDim, kScale, ProbRounding::none, pool);
    std::vector<StateRef> refs;
    for (std::size_t b = 0; b < s.grid.size(); ++b)
      refs.push_back(StateRef{static_cast<int>(b), bo[b].data(), bl[b].data()});
    std::vector<float> out(rows * kDim), lse(rows);
    merge_in_block_order(refs, rows, kDim, out.data(), lse.data());
    CHECK(same_bits(out.data(), fold_out.data(), out.size()));
    CHECK(same_bits(lse.data(), fold_lse.data(), lse.size()));
  }
}
