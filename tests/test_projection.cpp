// The lm_head projection on the CPU: the SIMD tile against the canonical head_partial_logits
// (bitwise), both against an FP64 dot product (a stated bound), and a negative control; the
// heads' fold inside the projection, the 16-lane log-softmax and its maximum against their
// definitions (bitwise), each with a negative control.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpdrift/bf16.h"
#include "cpdrift/logprob_math.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/logprob_rows.h"
#include "kernels/cpu/projection.h"
#include "kernels/projection_gemm.h"
#include "random_rows.h"
#include "split_mix.h"

using namespace cpd;
using cpd::testing::random_rows;
using cpd::testing::same_bits;

namespace {

// A head's columns inside a wider lm_head: rows of `ldw` floats, the head's `dim` from `offset`.
struct Head {
  std::vector<float> w;
  std::int64_t ldw;
  int offset;
  const float* columns() const { return w.data() + offset; }
};

Head lm_head(int vocab, std::int64_t ldw, int offset, std::uint64_t seed) {
  return Head{random_rows(vocab, seed, static_cast<int>(ldw)), ldw, offset};
}

std::vector<float> canonical(const std::vector<float>& hidden, std::int64_t rows, const Head& h,
                             int dim, int vocab) {
  std::vector<float> z(static_cast<std::size_t>(rows * vocab));
  for (std::int64_t r = 0; r < rows; ++r)
    head_partial_logits(hidden.data() + r * dim, h.columns(), h.ldw, dim, vocab, &z[r * vocab]);
  return z;
}

}  // namespace

TEST_CASE("projection tile equals head_partial_logits bit for bit") {
  // Row counts around the 16-lane tile, vocabularies around the 6- or 8-row step and across the
  // 96-row blocks, the head's columns inside a wider lm_head, three head dims (40: the transpose's
  // rest past its 16-column blocks).
  for (const int dim : {40, 64, 128}) {
    for (const std::int64_t rows : {1, 15, 16, 17, 40}) {
      for (const int vocab : {1, 3, 5, 6, 7, 8, 9, 37, 96, 97, 200}) {
        const std::vector<float> hidden = random_rows(rows, 7 + rows, dim);
        const Head h = lm_head(vocab, 3 * dim, dim, 11 + vocab);
        std::vector<float> z(static_cast<std::size_t>(rows * vocab), NAN);
        project_rows(ProjectionJob{hidden.data(), rows, h.columns(), h.ldw, z.data()}, dim, vocab);
        const std::vector<float> want = canonical(hidden, rows, h, dim, vocab);
        CAPTURE(dim);
        CAPTURE(rows);
        CAPTURE(vocab);
        CHECK(same_bits(z.data(), want.data(), z.size()));
      }
    }
  }
}

TEST_CASE("projection jobs over a pool: the same bits for any thread count") {
  const int dim = 128, vocab = 29;
  const Head h = lm_head(vocab, 4 * dim, 2 * dim, 5);
  std::vector<std::vector<float>> hidden, z;
  std::vector<ProjectionJob> jobs;
  for (const std::int64_t rows : {3, 16, 33, 70}) {
    hidden.push_back(random_rows(rows, 100 + rows, dim));
    z.emplace_back(static_cast<std::size_t>(rows * vocab));
  }
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    jobs.push_back(ProjectionJob{hidden[i].data(),
                                 static_cast<std::int64_t>(hidden[i].size()) / dim, h.columns(),
                                 h.ldw, z[i].data()});
  }
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (auto& zi : z) std::fill(zi.begin(), zi.end(), NAN);
    run_projection_jobs(jobs, dim, vocab, pool);
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const std::vector<float> want = canonical(hidden[i], jobs[i].rows, h, dim, vocab);
      CHECK(same_bits(z[i].data(), want.data(), want.size()));
    }
  }
}

TEST_CASE("projection against FP64, and a summation order that differs") {
  // The sequential FP32 chain of D = 128 fmas is within D·u·Σ|h_d·w_d| of the exact dot product
  // (one rounding per fma); a chain taken in descending d is not bitwise the canonical one,
  // which shows the bitwise test above can fail.
  const int dim = 128, vocab = 64;
  const std::int64_t rows = 20;
  const std::vector<float> hidden = random_rows(rows, 3, dim);
  const Head h = lm_head(vocab, dim, 0, 4);
  std::vector<float> z(static_cast<std::size_t>(rows * vocab));
  project_rows(ProjectionJob{hidden.data(), rows, h.columns(), h.ldw, z.data()}, dim, vocab);
  const double u = std::ldexp(1.0, -24);
  int reversed_differs = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int v = 0; v < vocab; ++v) {
      double exact = 0, magnitude = 0;
      float reversed = 0.0f;
      for (int d = dim - 1; d >= 0; --d) {
        const double term = double{hidden[r * dim + d]} * h.w[v * dim + d];
        exact += term;
        magnitude += std::fabs(term);
        reversed = std::fma(hidden[r * dim + d], h.w[v * dim + d], reversed);
      }
      CHECK(std::fabs(z[r * vocab + v] - exact) <= dim * u * magnitude);
      reversed_differs += bits_of(reversed) != bits_of(z[r * vocab + v]) ? 1 : 0;
    }
  }
  CHECK(reversed_differs > 0);
}

namespace {

// Folded logits by the definition: each head's canonical partials, then fold_head_logits in
// the given head order.
std::vector<float> folded_by_definition(const std::vector<std::vector<float>>& hidden,
                                        const std::vector<Head>& heads,
                                        const std::vector<int>& order, std::int64_t rows, int dim,
                                        int vocab) {
  std::vector<std::vector<float>> z;
  for (const int h : order) z.push_back(canonical(hidden[h], rows, heads[h], dim, vocab));
  std::vector<float> logits(static_cast<std::size_t>(rows * vocab));
  std::vector<const float*> terms(z.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::size_t h = 0; h < z.size(); ++h) terms[h] = z[h].data() + r * vocab;
    fold_head_logits(terms.data(), static_cast<int>(terms.size()), vocab, &logits[r * vocab]);
  }
  return logits;
}

}  // namespace

TEST_CASE("folded projection equals per-head partials folded in ascending head order") {
  // Head counts below, at and past the fold's four-head step; row counts around the tiles;
  // vocabularies across the 96-row blocks; 1 to 3 threads; the backend's default (project_heads
  // then fold_head_logits on the host) too; a fold continued by a second job. Folding the heads in
  // descending order is not the same bits: the negative control that shows the comparison can fail.
  const int dim = 128;
  for (const int n_heads : {1, 2, 5, 16}) {
    for (const std::int64_t rows : {1, 17, 40}) {
      for (const int vocab : {7, 97, 200}) {
        std::vector<Head> heads;
        std::vector<std::vector<float>> hidden;
        std::vector<int> ascending, descending;
        for (int h = 0; h < n_heads; ++h) {
          heads.push_back(lm_head(vocab, dim, 0, 40 + h));
          hidden.push_back(random_rows(rows, 60 + h, dim));
          ascending.push_back(h);
          descending.insert(descending.begin(), h);
        }
        const std::vector<float> want =
            folded_by_definition(hidden, heads, ascending, rows, dim, vocab);
        FoldedProjectionJob job;
        for (int h = 0; h < n_heads; ++h) {
          job.heads.push_back(
              ProjectionJob{hidden[h].data(), rows, heads[h].columns(), heads[h].ldw, nullptr});
        }
        CAPTURE(n_heads);
        CAPTURE(rows);
        CAPTURE(vocab);
        std::vector<float> logits(want.size());
        job.logits = logits.data();
        for (const int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::fill(logits.begin(), logits.end(), NAN);
          run_folded_projection_jobs(std::span(&job, 1), dim, vocab, pool);
          CHECK(same_bits(logits.data(), want.data(), want.size()));
        }
        ThreadPool pool(2);
        const std::unique_ptr<AttentionBackend> cpu = make_cpu_backend(pool);
        std::fill(logits.begin(), logits.end(), NAN);
        cpu->AttentionBackend::project_folded(std::span(&job, 1), dim, vocab);
        CHECK(same_bits(logits.data(), want.data(), want.size()));
        // A chain of two: the first heads fold into the plane, a second job `continues` it with
        // the rest (dlogp's TP ranks), on the tile and on the backend's default. Control: a second
        // job that starts its own fold instead overwrites the first heads' sum.
        if (n_heads >= 2) {
          const auto split = job.heads.begin() + n_heads / 2;
          FoldedProjectionJob head{{job.heads.begin(), split}, logits.data(), false},
              tail{{split, job.heads.end()}, logits.data(), true};
          for (const bool tile : {true, false}) {
            CAPTURE(tile);
            std::fill(logits.begin(), logits.end(), NAN);
            for (const FoldedProjectionJob* j : {&head, &tail}) {
              tile ? run_folded_projection_jobs(std::span(j, 1), dim, vocab, pool)
                   : cpu->AttentionBackend::project_folded(std::span(j, 1), dim, vocab);
            }
            CHECK(same_bits(logits.data(), want.data(), want.size()));
            tail.continues = false;
            for (const FoldedProjectionJob* j : {&head, &tail}) {
              tile ? run_folded_projection_jobs(std::span(j, 1), dim, vocab, pool)
                   : cpu->AttentionBackend::project_folded(std::span(j, 1), dim, vocab);
            }
            CHECK_FALSE(same_bits(logits.data(), want.data(), want.size()));
            tail.continues = true;
          }
        }
        if (n_heads >= 5) {
          const std::vector<float> reversed =
              folded_by_definition(hidden, heads, descending, rows, dim, vocab);
          CHECK_FALSE(same_bits(reversed.data(), want.data(), want.size()));
        }
      }
    }
  }
}

TEST_CASE("log_softmax_at_lanes equals log_softmax_at bit for bit") {
  // Vocabularies around the 16 lanes; logits with a NaN, -inf, a zero maximum met as -0 first
  // and as +0 first (the definition keeps the first), large and tiny values. A sum of the
  // exps taken 16 lanes apart (as a reassociating compiler would) is not the same bits: the
  // negative control.
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  int lane_sum_differs = 0;
  for (const int vocab : {1, 2, 15, 16, 17, 33, 100, 4096}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(static_cast<std::size_t>(vocab));
      for (float& v : x) v = normal(rng);
      if (kind == 1 && vocab > 2) {
        x[1] = NAN;
        x[static_cast<std::size_t>(vocab) - 1] = -INFINITY;
      }
      if (kind == 2 || kind == 3) {  // every logit below zero but two zeros of both signs
        for (float& v : x) v = -std::fabs(v) - 1.0f;
        // At 1 and 16 (lanes 1 and 0), so that the lanes meet them in the other order.
        x[std::min<std::size_t>(1, x.size() - 1)] = kind == 2 ? -0.0f : 0.0f;
        x[std::min<std::size_t>(16, x.size() - 1)] = kind == 2 ? 0.0f : -0.0f;
      }
      if (kind == 4) {
        for (float& v : x) v *= 30.0f;
      }
      for (const int target : {0, vocab / 2, vocab - 1}) {
        CAPTURE(vocab);
        CAPTURE(kind);
        CAPTURE(target);
        const float want = log_softmax_at(x.data(), vocab, target);
        CHECK(bits_of(log_softmax_at_lanes(x.data(), vocab, target)) == bits_of(want));
      }
      if (kind == 0 && vocab >= 100) {
        float m = -INFINITY, lanes[16] = {};
        for (const float v : x) m = v > m ? v : m;
        for (int v = 0; v < vocab; ++v) lanes[v % 16] += exp_f32(x[v] - m);
        float sum = 0.0f;
        for (const float l : lanes) sum += l;
        const float lane_summed = x[0] - (m + log_f32(sum));
        if (bits_of(lane_summed) != bits_of(log_softmax_at_lanes(x.data(), vocab, 0)))
          ++lane_sum_differs;
      }
    }
  }
  CHECK(lane_sum_differs > 0);
}

TEST_CASE("max_in_order_by_lanes is log_softmax_at's maximum, bit for bit") {
  // Against `m = -inf; m = z[v] > m ? z[v] : m` on lengths around the 16 lanes, with NaNs
  // (never the maximum, at z[0] too), infinities and zeros of both signs among the values. The
  // lanes' maximum without the ordered scan of a zero maximum is not the same bits: the
  // negative control.
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  cpd::testing::SplitMix64 rng{1};
  int zero_sign_differs = 0;
  for (int n = 1; n <= 70; ++n) {
    for (int round = 0; round < 40; ++round) {
      std::vector<float> z(static_cast<std::size_t>(n));
      for (float& x : z) {
        const std::uint64_t r = rng.next();
        const unsigned kind = static_cast<unsigned>(r >> 60);  // 1 in 16 each
        x = static_cast<float>(rng.uniform(-8.0, 8.0));
        if (kind == 0) x = nan;
        if (kind == 1) x = -inf;
        if (kind == 2 && round % 5 == 0) x = inf;
        if (round % 2 == 1) x = kind < 8 ? -0.0f : (kind < 12 ? 0.0f : -std::fabs(x));
      }
      float m = -inf;
      for (const float x : z) m = x > m ? x : m;
      CAPTURE(n);
      CAPTURE(round);
      CHECK(bits_of(max_in_order_by_lanes(z.data(), n)) == bits_of(m));
      float lanes[16] = {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf,
                         -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf};
      for (int v = 0; v < n; ++v) lanes[v % 16] = z[v] > lanes[v % 16] ? z[v] : lanes[v % 16];
      float lane_max = -inf;
      for (const float l : lanes) lane_max = l > lane_max ? l : lane_max;
      if (bits_of(lane_max) != bits_of(m)) ++zero_sign_differs;
    }
  }
  CHECK(zero_sign_differs > 0);
}

// cuBLAS's column-major C = op(A) · B, in FP64, as its documentation defines it.
std::vector<double> column_major_gemm(const ColumnMajorGemm& g, const std::vector<double>& a,
                                      const std::vector<double>& b) {
  std::vector<double> c(static_cast<std::size_t>(g.ldc) * g.n);
  for (int j = 0; j < g.n; ++j) {
    for (int i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int l = 0; l < g.k; ++l) {
        const double op_a = g.transpose_a ? a[static_cast<std::size_t>(i) * g.lda + l]
                                          : a[static_cast<std::size_t>(l) * g.lda + i];
        sum += op_a * b[static_cast<std::size_t>(j) * g.ldb + l];
      }
      c[static_cast<std::size_t>(j) * g.ldc + i] = sum;
    }
  }
  return c;
}

TEST_CASE("the cuBLAS BF16 projection's GEMM: its column-major C is the job's row-major z") {
  // The GPU runs this shape (kernels/cuda/bf16_projection.cu); here cuBLAS's definition of it
  // over the packed BF16 values must give z[r][o] = Σ_i x[r][i]·w[o][i] exactly (BF16 products
  // are exact in FP64 and both sums run over i in order).
  constexpr int kRows = 5, kDim = 24, kOut = 7, kLdw = 40;
  std::vector<float> x = random_rows(kRows, 3, kDim), w = random_rows(kOut, 4, kLdw);
  std::vector<float> z(kRows * kOut);
  const ProjectionJob job{x.data(), kRows, w.data(), kLdw, z.data()};
  std::vector<std::uint16_t> xb, wb;
  pack_projection_bf16(job, kDim, kOut, xb, wb);
  REQUIRE(xb.size() == std::size_t{kRows * kDim});
  REQUIRE(wb.size() == std::size_t{kOut * kDim});
  const auto widen = [](const std::vector<std::uint16_t>& v) {
    std::vector<double> out;
    for (const std::uint16_t b : v) out.push_back(bf16_to_f32(b));
    return out;
  };
  const ColumnMajorGemm g = projection_gemm(kRows, kDim, kOut);
  const std::vector<double> c = column_major_gemm(g, widen(wb), widen(xb));
  int differ = 0;
  for (int r = 0; r < kRows; ++r) {
    for (int o = 0; o < kOut; ++o) {
      double want = 0;
      for (int i = 0; i < kDim; ++i)
        want += static_cast<double>(round_bf16(x[r * kDim + i])) * round_bf16(w[o * kLdw + i]);
      differ += c[static_cast<std::size_t>(r) * kOut + o] != want;
    }
  }
  CHECK(differ == 0);
  // The control: A not transposed reads the weights across their rows.
  ColumnMajorGemm wrong = g;
  wrong.transpose_a = false;
  wrong.lda = kOut;
  CHECK(column_major_gemm(wrong, widen(wb), widen(xb)) != c);
}
