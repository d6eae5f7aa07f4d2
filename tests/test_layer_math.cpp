// The layer's canonical arithmetic (cpdrift/layer_math.h, docs/numerics.md §11) against a plain
// FP64 oracle, the CPU's tiled projection kernel against the definition bit for bit at the
// layer's shapes, and the TP invariance of o_proj's group fold with its negative controls.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/attention_jobs.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/philox.h"
#include "kernels/cpu/projection.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::philox_normals;
using cpd::testing::same_bits;

constexpr double kU = 1.0 / (1 << 24);  // FP32's unit roundoff

TEST_CASE("projection: one fma chain per output, within its FP64 bound") {
  // A sequential chain of n fmas from +0 is within γ_n·Σ|x_i w_i| ≈ n·u·Σ|x_i w_i| of the exact
  // sum; the bias add rounds once more (u of the result).
  const int in = 4096, outputs = 24;
  const std::vector<float> x = philox_normals(1, TensorId::q, in),
                           w = philox_normals(2, TensorId::q,
                                              static_cast<std::size_t>(outputs) * in, 0.015625f);
  const std::vector<float> bias = philox_normals(3, TensorId::q, outputs);
  std::vector<float> y(outputs);
  project_row(x.data(), w.data(), in, in, outputs, bias.data(), y.data());
  for (int o = 0; o < outputs; ++o) {
    double exact = 0, magnitude = 0;
    for (int i = 0; i < in; ++i) {
      exact += static_cast<double>(x[i]) * w[static_cast<std::size_t>(o) * in + i];
      magnitude += std::abs(static_cast<double>(x[i]) * w[static_cast<std::size_t>(o) * in + i]);
    }
    exact += bias[o];
    const double bound = in * kU * magnitude + kU * (std::abs(exact) + magnitude * in * kU);
    CAPTURE(o);
    CHECK(std::abs(y[o] - exact) <= bound);
  }
}

TEST_CASE("projection: the tiled CPU kernel gives the definition's bits at the layer's shapes") {
  // Hidden 2560 (Qwen3-4B) and 4096 (Qwen3-8B) in, a TP shard of the outputs, any row count:
  // every output keeps its one chain over the whole hidden dim (no split-K), so the bits of a
  // row are the same whatever rows share the call and whichever shard holds the output.
  for (const int in : {2560, 4096}) {
    const int outputs = 200;  // not a multiple of the kernel's vocabulary block
    const std::vector<float> w =
        philox_normals(5, TensorId::q, static_cast<std::size_t>(outputs) * in, 0.0156f);
    for (const std::int64_t rows : {1, 17, 40}) {
      CAPTURE(in);
      CAPTURE(rows);
      const std::vector<float> x =
          philox_normals(6 + rows, TensorId::q, static_cast<std::size_t>(rows) * in);
      std::vector<float> tiled(static_cast<std::size_t>(rows) * outputs);
      project_rows(ProjectionJob{x.data(), rows, w.data(), in, tiled.data()}, in, outputs);
      std::vector<float> scalar(tiled.size());
      for (std::int64_t r = 0; r < rows; ++r)
        project_row(x.data() + r * in, w.data(), in, in, outputs, nullptr,
                    scalar.data() + r * outputs);
      CHECK(same_bits(tiled, scalar));
      // A TP shard: outputs [72, 136) alone.
      std::vector<float> shard(static_cast<std::size_t>(rows) * 64);
      project_rows(ProjectionJob{x.data(), rows, w.data() + std::size_t{72} * in, in, shard.data()},
                   in, 64);
      std::size_t differ = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        differ += std::memcmp(shard.data() + r * 64, scalar.data() + r * outputs + 72,
                              64 * sizeof(float)) != 0;
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("head RMSNorm: within its FP64 bound, in place or not") {
  // dot_seq(x, x) over D within D·u relative (its terms are non-negative), then a division, an
  // add, a sqrt, a division and two products, one rounding each: |y - y64| ≤ (D/2 + 8)·u·|y64|.
  const int dim = 128;
  const float eps = 1e-6f;
  const std::vector<float> w = philox_normals(9, TensorId::q, dim, 0.25f);
  for (const float scale : {1.0f, 1e-3f, 30.0f}) {
    const std::vector<float> x = philox_normals(10, TensorId::q, dim, scale);
    std::vector<float> y(dim), in_place = x;
    head_rms_norm(x.data(), w.data(), dim, eps, y.data());
    head_rms_norm(in_place.data(), w.data(), dim, eps, in_place.data());
    CHECK(same_bits(y, in_place));
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double r = 1.0 / std::sqrt(ss / dim + static_cast<double>(eps));
    double worst = 0;
    for (int d = 0; d < dim; ++d) {
      const double exact = static_cast<double>(w[d]) * x[d] * r;
      worst = std::max(worst, std::abs(y[d] - exact) / (std::abs(exact) + 1e-300));
    }
    CAPTURE(scale);
    CHECK(worst <= (dim / 2.0 + 8) * kU);
  }
}

TEST_CASE("o_proj: the group fold is the same bits over every TP split; controls differ") {
  // Qwen3-8B's shape: 32 query heads in 8 groups of 4 (G = 512 columns), 96 outputs of a row.
  const int groups = 8, width = 512, cols = groups * width, outputs = 96;
  const std::vector<float> a = philox_normals(11, TensorId::q, cols),
                           w = philox_normals(12, TensorId::q,
                                              static_cast<std::size_t>(outputs) * cols, 0.0156f);
  std::vector<float> whole(outputs);
  o_proj_groups(a.data(), w.data(), cols, width, 0, groups, outputs, true, whole.data());
  // FP64 oracle: Σ over all columns, within (G + groups)·u·Σ|a w|.
  for (int o = 0; o < outputs; ++o) {
    double exact = 0, magnitude = 0;
    for (int c = 0; c < cols; ++c) {
      const double t = static_cast<double>(a[c]) * w[static_cast<std::size_t>(o) * cols + c];
      exact += t;
      magnitude += std::abs(t);
    }
    CAPTURE(o);
    CHECK(std::abs(whole[o] - exact) <= (width + groups) * kU * magnitude);
  }
  // TP t holds groups [t·8/TP, (t+1)·8/TP); the running sum goes from rank to rank.
  for (const int tp : {2, 4, 8}) {
    std::vector<float> running(outputs);
    for (int t = 0; t < tp; ++t) {
      const int g0 = t * groups / tp, g1 = (t + 1) * groups / tp;
      o_proj_groups(a.data(), w.data(), cols, width, g0, g1, outputs, t == 0, running.data());
    }
    CAPTURE(tp);
    CHECK(same_bits(running, whole));
  }
  // Controls: the groups in descending order, and each rank's partial summed apart then added
  // (what a reduce of per-rank partials does), must each differ somewhere.
  std::vector<float> descending(outputs);
  for (int g = groups - 1; g >= 0; --g)
    o_proj_groups(a.data(), w.data(), cols, width, g, g + 1, outputs, g == groups - 1,
                  descending.data());
  CHECK_FALSE(same_bits(descending, whole));
  std::vector<float> lo(outputs), hi(outputs), reduced(outputs);
  o_proj_groups(a.data(), w.data(), cols, width, 0, 4, outputs, true, lo.data());
  o_proj_groups(a.data(), w.data(), cols, width, 4, 8, outputs, true, hi.data());
  for (int o = 0; o < outputs; ++o) reduced[o] = lo[o] + hi[o];
  CHECK_FALSE(same_bits(reduced, whole));
}

TEST_CASE("token blocks: the size depends on S alone and never straddles a CP rank at CP <= 8") {
  CHECK(layer_token_block(4096) == 256);
  CHECK(layer_token_block(256) == 16);
  CHECK(layer_token_block(32768) == 256);
  CHECK(layer_token_block(48) == 1);  // S/16 = 3
  CHECK(layer_token_block(40) == 0);  // not a multiple of 16: the layer refuses it
  for (std::int64_t s = 16; s <= 4096; s += 16) {
    const std::int64_t b = layer_token_block(s);
    for (std::int64_t cp = 1; cp <= 8; ++cp) {
      // Contiguous: owner chunks of S/cp; zigzag: of S/(2·cp) (where S divides).
      for (const std::int64_t parts : {cp, 2 * cp}) {
        if (s % parts != 0) continue;
        CAPTURE(s);
        CAPTURE(parts);
        CHECK((s / parts) % b == 0);
      }
    }
  }
}

TEST_CASE(
    "token sums: the ascending block fold within its FP64 bound; a local reduce first differs") {
  // dW[o][i] = Σ_t dy[t][o]·x[t][i] over S = 256 tokens: blocks of 16, each rank computing the
  // partials of the blocks it owns and the running sum visiting them in ascending block order.
  const std::int64_t seq = 256, block = layer_token_block(seq);
  const int outputs = 12, inputs = 40;
  const std::vector<float> dy =
      philox_normals(21, TensorId::q, static_cast<std::size_t>(seq) * outputs);
  const std::vector<float> x =
      philox_normals(22, TensorId::q, static_cast<std::size_t>(seq) * inputs);
  const std::size_t n = static_cast<std::size_t>(outputs) * inputs;
  const auto dw_by_blocks = [&](const std::vector<std::int64_t>& order) {
    std::vector<float> running(n), p(n);
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::int64_t t0 = order[k] * block;
      token_block_partial(dy.data() + t0 * outputs, outputs, x.data() + t0 * inputs, inputs, block,
                          outputs, inputs, p.data());
      fold_token_block(p.data(), static_cast<std::int64_t>(n), k == 0, running.data());
    }
    return running;
  };
  std::vector<std::int64_t> ascending(static_cast<std::size_t>(seq / block));
  for (std::size_t b = 0; b < ascending.size(); ++b) ascending[b] = static_cast<std::int64_t>(b);
  const std::vector<float> reference = dw_by_blocks(ascending);
  // The FP64 value: a chain of 16 per block and 16 block adds, within (16 + 16)·u·Σ|terms|.
  for (int o = 0; o < outputs; ++o) {
    for (int i = 0; i < inputs; ++i) {
      double exact = 0, magnitude = 0;
      for (std::int64_t t = 0; t < seq; ++t) {
        const double v = static_cast<double>(dy[t * outputs + o]) * x[t * inputs + i];
        exact += v;
        magnitude += std::abs(v);
      }
      CHECK(std::abs(reference[static_cast<std::size_t>(o) * inputs + i] - exact) <=
            32 * kU * magnitude);
    }
  }
  // Whatever CP and layout own the blocks, the fold visits them in ascending order: each rank
  // contributes its blocks when the running sum reaches them, so the bits cannot change. What
  // would change them is a rank summing its own blocks first (a local reduction, then a reduce
  // across ranks): the control, at CP = 2 zigzag (rank 0 owns the first and last quarters).
  std::vector<float> local0(n), local1(n), p(n), reduced(n);
  const std::int64_t quarter = seq / 4 / block;  // blocks per zigzag chunk at CP = 2
  for (std::int64_t b = 0; b < seq / block; ++b) {
    const bool rank0 = b < quarter || b >= 3 * quarter;
    std::vector<float>& mine = rank0 ? local0 : local1;
    const bool first = rank0 ? b == 0 : b == quarter;
    token_block_partial(dy.data() + b * block * outputs, outputs, x.data() + b * block * inputs,
                        inputs, block, outputs, inputs, p.data());
    fold_token_block(p.data(), static_cast<std::int64_t>(n), first, mine.data());
  }
  for (std::size_t e = 0; e < n; ++e) reduced[e] = local0[e] + local1[e];
  CHECK_FALSE(same_bits(reduced, reference));
}
