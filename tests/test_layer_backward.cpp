// The layer's backward (cpdrift/layer_backward_math.h, engine/layer_backward.h): RoPE's and the
// head norm's backward and the token sums against plain FP64 with their bounds, the CPU's tiled
// token sums bit for bit the definition's, and every gradient the engine makes — dX, q/k/v_proj,
// their biases, o_proj, q_norm, k_norm — equal to the canonical orders composed serially here, at
// TP 1, 2, 4 × CP 1, 2 × both layouts; the rank_sums control differs at TP 2 (dX) and CP 2 (dW).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "case_digests.h"
#include "comm/transport.h"
#include "cpdrift/layer_backward_math.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/philox.h"
#include "cpdrift/rope.h"
#include "engine/layer_backward.h"
#include "engine/protocol.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/cpu/token_sums.h"
#include "kernels/input_store.h"
#include "kernels/layer_weights.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::philox_normals;
using cpd::testing::same_bits;

constexpr double kU = 1.0 / (1 << 24);  // FP32's unit roundoff

TEST_CASE("RoPE backward: the rotation's transpose, within 2u of each product's magnitude") {
  // dx1 = dy1·c + dy2·s, dx2 = dy2·c − dy1·s: two rounded products and one rounded sum, so
  // |error| ≤ u·(|a| + |b|)·(1 + u) + u·|a ± b| ≤ 2.01·u·(|a| + |b|).
  const int half = 64;
  const std::vector<float> g = philox_normals(11, TensorId::k, 2 * half),
                           angles = philox_normals(12, TensorId::k, half, 3.0f);
  std::vector<float> c(half), s(half), dx = g;
  for (int i = 0; i < half; ++i) sincos_f32(angles[i], s[i], c[i]);
  rope_unrotate_row(dx.data(), c.data(), s.data(), half);
  for (int i = 0; i < half; ++i) {
    const double a1 = double(g[i]) * c[i], b1 = double(g[i + half]) * s[i];
    const double a2 = double(g[i + half]) * c[i], b2 = double(g[i]) * s[i];
    CAPTURE(i);
    CHECK(std::abs(dx[i] - (a1 + b1)) <= 2.01 * kU * (std::abs(a1) + std::abs(b1)));
    CHECK(std::abs(dx[i + half] - (a2 - b2)) <= 2.01 * kU * (std::abs(a2) + std::abs(b2)));
  }
  // The transpose is the inverse of the rotation: back to the start within a few u.
  std::vector<float> round_trip = g;
  rope_rotate_row(round_trip.data(), c.data(), s.data(), half);
  rope_unrotate_row(round_trip.data(), c.data(), s.data(), half);
  for (int i = 0; i < 2 * half; ++i) CHECK(std::abs(round_trip[i] - g[i]) <= 1e-5);
}

TEST_CASE("head norm backward: against FP64's textbook gradient, within (D + 16)·u of its terms") {
  // The oracle differentiates y = w·x·r, r = (Σx²/D + eps)^(-1/2), in FP64 from the FP32 inputs:
  // dx = r·w·dy − x·r³·Σ(w·dy·x)/D. The FP32 definition's error: r within (D/2 + 8)·u, m a chain
  // of D fmas, a handful of roundings per element: (D + 16)·u of the terms' magnitudes bounds it.
  for (const int dim : {64, 128}) {
    const std::vector<float> x = philox_normals(21 + dim, TensorId::k, dim, 2.0f),
                             dy = philox_normals(22 + dim, TensorId::k, dim);
    std::vector<float> w = philox_normals(23 + dim, TensorId::k, dim, 0.125f);
    for (float& v : w) v += 1.0f;
    const float eps = 1e-6f;
    std::vector<float> dx(dim), xhat(dim);
    head_rms_norm_backward(x.data(), w.data(), dy.data(), dim, eps, dx.data(), xhat.data());
    double ss = 0;
    for (int d = 0; d < dim; ++d) ss += double(x[d]) * x[d];
    const double r = 1.0 / std::sqrt(ss / dim + eps);
    double dot = 0, dot_abs = 0;
    for (int d = 0; d < dim; ++d) {
      dot += double(w[d]) * dy[d] * x[d];
      dot_abs += std::abs(double(w[d]) * dy[d] * x[d]);
    }
    for (int d = 0; d < dim; ++d) {
      const double g = double(w[d]) * dy[d];
      const double want = r * g - x[d] * r * r * r * dot / dim;
      const double scale = r * std::abs(g) + std::abs(x[d]) * r * r * r * dot_abs / dim;
      CAPTURE(dim);
      CAPTURE(d);
      CHECK(std::abs(dx[d] - want) <= (dim + 16) * kU * scale);
      CHECK(std::abs(xhat[d] - x[d] * r) <= (dim / 2 + 10) * kU * std::abs(x[d] * r));
    }
  }
}

TEST_CASE("token sums: the CPU tiles give the definition's bits; the definition within FP64's") {
  // Outputs not a multiple of the tile's four, inputs with a tail past the tile's 32 (4097: the
  // hidden dim and the bias's column), blocks of unequal rows, a continued job.
  for (const int inputs : {4097, 128, 45}) {
    const int outputs = 7, ld_dy = 9;
    const std::vector<std::int64_t> rows = {16, 5, 32};
    std::int64_t total = 0;
    for (const std::int64_t r : rows) total += r;
    const std::vector<float> dy =
        philox_normals(31, TensorId::k, static_cast<std::size_t>(total * ld_dy));
    const std::vector<float> x =
        philox_normals(32, TensorId::k, static_cast<std::size_t>(total * inputs));
    TokenSumJob job;
    std::int64_t t = 0;
    for (const std::int64_t r : rows) {
      job.blocks.push_back(TokenBlock{dy.data() + t * ld_dy + 1, x.data() + t * inputs, r});
      t += r;
    }
    job.ld_dy = ld_dy;
    job.ld_x = job.ld_sum = inputs;
    job.outputs = outputs;
    job.inputs = inputs;
    for (const bool continues : {false, true}) {
      std::vector<float> tiled =
          philox_normals(33, TensorId::k, static_cast<std::size_t>(outputs * inputs));
      std::vector<float> defined = tiled;
      const std::vector<float> start = tiled;
      job.continues = continues;
      job.sum = tiled.data();
      ThreadPool pool(2);
      run_token_sum_jobs(std::span(&job, 1), pool);
      job.sum = defined.data();
      token_sums_reference(job);
      CAPTURE(inputs);
      CHECK(same_bits(tiled, defined));
      // FP64: each block's chain within rows·u·Σ|dy·x|, each fold's add u of its result.
      for (int o = 0; o < outputs; ++o) {
        for (int i = 0; i < inputs; i += 13) {
          double exact = continues ? start[o * inputs + i] : 0, magnitude = std::abs(exact);
          std::int64_t r0 = 0;
          for (const std::int64_t r : rows) {
            for (std::int64_t k = r0; k < r0 + r; ++k) {
              const double term = double(dy[k * ld_dy + 1 + o]) * x[k * inputs + i];
              exact += term;
              magnitude += std::abs(term);
            }
            r0 += r;
          }
          CHECK(std::abs(defined[o * inputs + i] - exact) <= (total + 3) * kU * magnitude);
        }
      }
    }
  }
}

namespace {

// The tests' small layer at S = 64: token blocks of layer_token_block(64) = 4.
Problem small_layer() {
  Problem p = testing::small_layer();
  p.seq_len = 64;
  return p;
}

// Global [B][H][S][D] tensors standing in for the core's gradients and the forward's attention
// output (the engine's arithmetic after the core does not care where they came from): plane 0
// the candidate, plane 1 the reference.
struct CoreTensors {
  std::vector<float> dq[2], dk[2], dv[2], attention[2];
};

CoreTensors core_tensors(const Problem& p) {
  const ModelDims& d = p.dims;
  const auto n = [&](int heads) {
    return static_cast<std::size_t>(p.batch) * heads * p.seq_len * d.head_dim;
  };
  CoreTensors t;
  for (int w = 0; w < 2; ++w) {
    t.dq[w] = philox_normals(100 + w, TensorId::k, n(d.num_q_heads), 0.01f);
    t.dk[w] = philox_normals(110 + w, TensorId::k, n(d.num_kv_heads), 0.01f);
    t.dv[w] = philox_normals(120 + w, TensorId::k, n(d.num_kv_heads), 0.01f);
    t.attention[w] = philox_normals(130 + w, TensorId::k, n(d.num_q_heads));
  }
  return t;
}

Shard shard_of(const Problem& p, const std::vector<float>& global, std::int64_t heads_total,
               const Range& heads, const std::vector<Range>& tokens) {
  const int dim = p.dims.head_dim;
  Shard s(ShardShape{p.batch, heads, tokens, dim});
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t h = heads.begin; h < heads.end; ++h) {
      for (const Range& r : tokens) {
        for (std::int64_t pos = r.begin; pos < r.end; ++pos) {
          std::memcpy(s.at(b, h, s.shape.local_row(pos)),
                      global.data() + ((b * heads_total + h) * p.seq_len + pos) * dim,
                      dim * sizeof(float));
        }
      }
    }
  }
  return s;
}

// Every gradient the engine made, each gathered whole in its layout's order, by name.
std::map<std::string, std::vector<float>> engine_gradients(const Problem& p, const CaseSpec& spec,
                                                           const CoreTensors& core, int plane) {
  ThreadPool pool(2);
  InputStore store(p, pool);
  InProcessTransport transport;
  const LocalCollectives collectives;
  const CaseGrid grid(store.problem(), spec);
  const std::vector<LogicalRank> hosted = hosted_ranks(grid, transport);
  std::vector<std::array<Shard, 8>> held;  // dq, dk, dv, attention × 2 planes
  held.reserve(hosted.size());
  std::vector<LayerBackwardInputs> inputs;
  const ModelDims& d = p.dims;
  for (const LogicalRank& r : hosted) {
    std::array<Shard, 8>& h = held.emplace_back();
    for (int w = 0; w < 2; ++w) {
      h[w] = shard_of(p, core.dq[w], d.num_q_heads, r.q_heads, r.tokens);
      h[2 + w] = shard_of(p, core.dk[w], d.num_kv_heads, r.kv_heads, r.tokens);
      h[4 + w] = shard_of(p, core.dv[w], d.num_kv_heads, r.kv_heads, r.tokens);
      h[6 + w] = shard_of(p, core.attention[w], d.num_q_heads, r.q_heads, r.tokens);
    }
    inputs.push_back(
        LayerBackwardInputs{{&h[0], &h[1]}, {&h[2], &h[3]}, {&h[4], &h[5]}, {&h[6], &h[7]}});
  }
  std::map<std::string, std::vector<float>> out;
  for (const LayerGradient& g : run_layer_backward(grid, inputs, transport, collectives, store)) {
    std::vector<float>& all = out[g.name];
    for (const LayerGradient::Hosted& h : g.hosted) {
      const float* piece = plane == 0 ? h.candidate : h.reference;
      all.insert(all.end(), piece, piece + h.count);
    }
    // dX's pieces are (b, token range) in position order: whole [B][S][hidden] rows already.
  }
  return out;
}

// The same gradients composed serially from layer_backward_math.h's definitions.
std::map<std::string, std::vector<float>> defined_gradients(const Problem& p,
                                                            const CoreTensors& core, int plane) {
  const ModelDims& d = p.dims;
  const int dim = d.head_dim, hidden = d.hidden_size, gs = d.group_size(), half = dim / 2;
  const LayerWeights weights(d, p.seed);
  const std::int64_t bt = layer_token_block(p.seq_len), seq = p.seq_len;
  const auto eps = static_cast<float>(d.rms_norm_eps);
  const std::vector<float> inv_freq = rope_inv_freq(d);
  // dP for q and k heads ([B][H][S][D]), and each (block, group)'s norm partial, block-major.
  const auto dp_of = [&](TensorId t, const std::vector<float>& grad, std::vector<float>& norm_dw) {
    const std::int64_t heads = heads_of(d, t), per_group = t == TensorId::q ? gs : 1;
    std::vector<float> dp = grad;
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<float>> partials;
    std::vector<float> x(hidden), pre(dim), xhat(dim), c(half), s(half);
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t pos = 0; pos < seq; ++pos) {
        for (int f = 0; f < half; ++f) rope_cos_sin(pos, inv_freq[f], c[f], s[f]);
        layer_hidden_row(p, b, pos, x.data());
        for (std::int64_t h = 0; h < heads; ++h) {
          float* g = dp.data() + ((b * heads + h) * seq + pos) * dim;
          rope_unrotate_row(g, c.data(), s.data(), half);
          project_row(x.data(), weights.projection(t, h), hidden, hidden, dim, weights.bias(t, h),
                      pre.data());
          const std::vector<float> dnormed(g, g + dim);
          head_rms_norm_backward(pre.data(), weights.norm(t), dnormed.data(), dim, eps, g,
                                 xhat.data());
          std::vector<float>& part = partials[{b * (seq / bt) + pos / bt, h / per_group}];
          if (part.empty()) part.assign(dim, 0.0f);
          norm_weight_accumulate(dnormed.data(), xhat.data(), 1, dim, part.data());
        }
      }
    }
    norm_dw.assign(dim, 0.0f);
    bool first = true;
    for (const auto& [key, part] : partials) {
      fold_token_block(part.data(), dim, first, norm_dw.data());
      first = false;
    }
    return dp;
  };
  std::map<std::string, std::vector<float>> out;
  const std::vector<float> dpq = dp_of(TensorId::q, core.dq[plane], out["q_norm"]);
  const std::vector<float> dpk = dp_of(TensorId::k, core.dk[plane], out["k_norm"]);
  const std::vector<float>& dpv = core.dv[plane];
  // Token sums over the global token blocks, batch-major: rows (b, pos) of dy and x.
  const auto token_sum = [&](const auto& dy_at, const auto& x_at, int outputs, int inputs) {
    std::vector<float> sum(static_cast<std::size_t>(outputs) * inputs), p_block(sum.size());
    std::vector<float> dy(static_cast<std::size_t>(bt) * outputs), xs(bt * inputs);
    bool first = true;
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t t0 = 0; t0 < seq; t0 += bt) {
        for (std::int64_t t = 0; t < bt; ++t) {
          dy_at(b, t0 + t, dy.data() + t * outputs);
          x_at(b, t0 + t, xs.data() + t * inputs);
        }
        token_block_partial(dy.data(), outputs, xs.data(), inputs, bt, outputs, inputs,
                            p_block.data());
        fold_token_block(p_block.data(), static_cast<std::int64_t>(sum.size()), first, sum.data());
        first = false;
      }
    }
    return sum;
  };
  const auto hidden_at = [&](int b, std::int64_t pos, float* row) {
    layer_hidden_row(p, b, pos, row);
    row[hidden] = 1.0f;  // the bias's column
  };
  const char* names[3] = {"q", "k", "v"};
  const std::vector<float>* dps[3] = {&dpq, &dpk, &dpv};
  for (int t = 0; t < 3; ++t) {
    const std::int64_t heads = t == 0 ? d.num_q_heads : d.num_kv_heads;
    const std::vector<float>& dp = *dps[t];
    // [H·D][hidden + 1] then split into the weight and its bias.
    const std::vector<float> all = token_sum(
        [&](int b, std::int64_t pos, float* row) {
          for (std::int64_t h = 0; h < heads; ++h)
            std::memcpy(row + h * dim, dp.data() + ((b * heads + h) * seq + pos) * dim,
                        dim * sizeof(float));
        },
        hidden_at, static_cast<int>(heads * dim), hidden + 1);
    std::vector<float>& w = out[std::string(names[t]) + "_proj"];
    std::vector<float>& bias = out[std::string(names[t]) + "_bias"];
    for (std::int64_t f = 0; f < heads * dim; ++f) {
      w.insert(w.end(), all.begin() + f * (hidden + 1), all.begin() + f * (hidden + 1) + hidden);
      bias.push_back(all[f * (hidden + 1) + hidden]);
    }
  }
  // o_proj: [hidden][Hq·D], then by head: [Hq][hidden][D].
  const int columns = d.num_q_heads * dim;
  const std::vector<float> o = token_sum(
      [&](int b, std::int64_t pos, float* row) { layer_grad_row(p, b, pos, row); },
      [&](int b, std::int64_t pos, float* row) {
        for (int h = 0; h < d.num_q_heads; ++h)
          std::memcpy(row + h * dim,
                      core.attention[plane].data() + ((b * d.num_q_heads + h) * seq + pos) * dim,
                      dim * sizeof(float));
      },
      hidden, columns);
  std::vector<float>& oh = out["o_proj"];
  for (int h = 0; h < d.num_q_heads; ++h) {
    for (int r = 0; r < hidden; ++r)
      oh.insert(oh.end(), o.begin() + r * columns + h * dim,
                o.begin() + r * columns + h * dim + dim);
  }
  // dX: o_proj_groups' fold over the groups of [Hkv][(gs + 2)·D] features per token.
  const int features = (gs + 2) * dim;
  std::vector<float> w_cat(static_cast<std::size_t>(hidden) * d.num_kv_heads * features);
  for (int g = 0; g < d.num_kv_heads; ++g) {
    const float* t = weights.qkv_group_transposed(g);
    for (int i = 0; i < hidden; ++i)
      std::memcpy(w_cat.data() + (i * d.num_kv_heads + g) * features, t + i * features,
                  features * sizeof(float));
  }
  std::vector<float>& dx = out["dx"];
  std::vector<float> a(static_cast<std::size_t>(d.num_kv_heads) * features), y(hidden);
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t pos = 0; pos < seq; ++pos) {
      for (int g = 0; g < d.num_kv_heads; ++g) {
        for (int j = 0; j < gs + 2; ++j) {
          const float* src = j < gs
                                 ? dpq.data() + ((b * d.num_q_heads + g * gs + j) * seq + pos) * dim
                             : j == gs ? dpk.data() + ((b * d.num_kv_heads + g) * seq + pos) * dim
                                       : dpv.data() + ((b * d.num_kv_heads + g) * seq + pos) * dim;
          std::memcpy(a.data() + g * features + j * dim, src, dim * sizeof(float));
        }
      }
      o_proj_groups(a.data(), w_cat.data(), d.num_kv_heads * features, features, 0, d.num_kv_heads,
                    hidden, true, y.data());
      dx.insert(dx.end(), y.begin(), y.end());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("layer backward: every gradient is the canonical orders' at TP 1, 2, 4 and CP 1, 2") {
  const Problem p = small_layer();
  const CoreTensors core = core_tensors(p);
  for (int plane = 0; plane < 2; ++plane) {
    const std::map<std::string, std::vector<float>> want = defined_gradients(p, core, plane);
    for (const int tp : {1, 2, 4}) {
      for (const int cp : {1, 2}) {
        for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
          const std::map<std::string, std::vector<float>> got =
              engine_gradients(p, CaseSpec{tp, cp, 16, layout, Protocol::ag_rs}, core, plane);
          CHECK(got.size() == want.size());
          for (const auto& [name, values] : want) {
            CAPTURE(plane);
            CAPTURE(tp);
            CAPTURE(cp);
            CAPTURE(static_cast<int>(layout));
            CAPTURE(name);
            REQUIRE(got.count(name) == 1);
            CHECK(!values.empty());
            CHECK(same_bits(got.at(name), values));
          }
        }
      }
    }
  }
}

TEST_CASE("layer backward: rank_sums changes dX at TP 2 and the weight gradients at CP 2") {
  Problem p = small_layer();
  const CoreTensors core = core_tensors(p);
  const std::map<std::string, std::vector<float>> want = defined_gradients(p, core, 0);
  p.o_proj_order = OProjOrder::rank_sums;
  // One rank on each axis: the same fold.
  const auto one =
      engine_gradients(p, CaseSpec{1, 1, 16, CpLayout::contiguous, Protocol::ag_rs}, core, 0);
  for (const auto& [name, values] : want) CHECK(same_bits(one.at(name), values));
  const auto tp2 =
      engine_gradients(p, CaseSpec{2, 1, 16, CpLayout::contiguous, Protocol::ag_rs}, core, 0);
  CHECK_FALSE(same_bits(tp2.at("dx"), want.at("dx")));
  const auto cp2 =
      engine_gradients(p, CaseSpec{1, 2, 16, CpLayout::zigzag, Protocol::ag_rs}, core, 0);
  for (const char* name : {"q_proj", "k_proj", "v_proj", "q_bias", "o_proj"}) {
    CAPTURE(name);
    CHECK_FALSE(same_bits(cp2.at(name), want.at(name)));
  }
  CHECK(same_bits(cp2.at("dx"), want.at("dx")));  // dX has no sum over CP
}
