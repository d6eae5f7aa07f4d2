// The lm_head projection on the CPU: the SIMD tile against the canonical head_partial_logits
// (bitwise), both against an FP64 dot product (a stated bound), and a negative control.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "cpdrift/cpu/projection.h"
#include "cpdrift/numerics/logprob_math.h"
#include "random_rows.h"

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
  // 96-row blocks, the head's columns inside a wider lm_head, two head dims.
  for (const int dim : {64, 128}) {
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
