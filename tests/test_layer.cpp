// The layer around the core (--scope layer): q, k and v as the composition of layer_math.h's
// projection, head RMSNorm and RoPE, bit for bit, against an FP64 oracle, and the same for any
// slice; o_proj through the engine's TP chain equals the canonical group fold at TP 1, 2 and 4
// and every CP, and the rank_sums order (the control) does not; the logprobs through the layer's
// output, the lm_head sharded by vocabulary over the TP ranks, are TP = 1's.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "case_digests.h"
#include "cpdrift/layer_math.h"
#include "cpdrift/logprob_math.h"
#include "cpdrift/rope.h"
#include "engine/layer_logprobs.h"
#include "engine/o_proj.h"
#include "kernels/attention_backend.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/layer_inputs.h"
#include "kernels/cpu/logprob_rows.h"
#include "kernels/layer_weights.h"

using namespace cpd;
using testing::kFp32;
using testing::small_layer;

namespace {

ShardShape whole(const Problem& p, TensorId t) {
  return ShardShape{p.batch, Range{0, heads_of(p.dims, t)}, {Range{0, p.seq_len}}, p.dims.head_dim};
}

// Row (b, h, pos) of q, k or v by its definition (layer_inputs.h), from layer_math.h's pieces.
std::vector<float> defined_row(const Problem& p, const LayerWeights& w, TensorId t, int b,
                               std::int64_t h, std::int64_t pos) {
  const ModelDims& d = p.dims;
  std::vector<float> x(static_cast<std::size_t>(d.hidden_size)), y(d.head_dim);
  layer_hidden_row(p, b, pos, x.data());
  project_row(x.data(), w.projection(t, h), d.hidden_size, d.hidden_size, d.head_dim, w.bias(t, h),
              y.data());
  if (const float* norm = w.norm(t))
    head_rms_norm(y.data(), norm, d.head_dim, static_cast<float>(d.rms_norm_eps), y.data());
  if (t != TensorId::v) {
    const std::vector<float> inv_freq = rope_inv_freq(d);
    std::vector<float> c(inv_freq.size()), s(inv_freq.size());
    for (std::size_t f = 0; f < inv_freq.size(); ++f) rope_cos_sin(pos, inv_freq[f], c[f], s[f]);
    rope_rotate_row(y.data(), c.data(), s.data(), d.rotary_dim / 2);
  }
  return y;
}

}  // namespace

TEST_CASE("layer inputs: each q, k, v row is the projection, bias, norm and RoPE, bit for bit") {
  ThreadPool pool(2);
  const Problem p = small_layer();
  const Problem made = with_layer_weights(p);
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const Shard s = generate_shard(p, t, whole(p, t), InputPrecision::fp32, pool);
    int differ = 0;
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < heads_of(p.dims, t); ++h) {
        for (std::int64_t pos = 0; pos < p.seq_len; ++pos) {
          const std::vector<float> want = defined_row(p, *made.weights, t, b, h, pos);
          differ += std::memcmp(s.at(b, h, pos), want.data(), want.size() * sizeof(float)) != 0;
        }
      }
    }
    CAPTURE(static_cast<int>(t));
    CHECK(differ == 0);
  }
}

TEST_CASE("layer inputs: the projection against FP64, within n·u·Σ|x·w| + u·|y|") {
  // Without norm and RoPE a row is the projection and the bias add alone: each output one fma
  // chain of n = hidden terms (error ≤ n·u·Σ|x_i·w_i|, u = 2^-24) and one add (≤ u·|y|). The
  // norm and RoPE have their own FP64 tests (test_layer_math, test_inputs); the test above
  // shows the row is exactly their composition.
  ThreadPool pool(2);
  Problem p = small_layer();
  p.dims.qk_norm = false;
  p.rope = false;
  const Problem made = with_layer_weights(p);
  const double u = std::ldexp(1.0, -24);
  const int n = p.dims.hidden_size, dim = p.dims.head_dim;
  double worst = 0;  // the largest error as a share of its bound
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const Shard s = generate_shard(p, t, whole(p, t), InputPrecision::fp32, pool);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t pos = 0; pos < p.seq_len; ++pos) {
        layer_hidden_row(p, b, pos, x.data());
        for (std::int64_t h = 0; h < heads_of(p.dims, t); ++h) {
          const float* w = made.weights->projection(t, h);
          const float* bias = made.weights->bias(t, h);
          for (int o = 0; o < dim; ++o) {
            double exact = bias[o], magnitude = 0;
            for (int i = 0; i < n; ++i) {
              const double term = static_cast<double>(x[i]) * w[o * n + i];
              exact += term;
              magnitude += std::fabs(term);
            }
            const double bound = n * u * magnitude + u * std::fabs(exact) + 1e-30;
            worst = std::max(worst, std::fabs(s.at(b, h, pos)[o] - exact) / bound);
          }
        }
      }
    }
  }
  CHECK(worst <= 1.0);
  CHECK(worst > 0.0);  // the oracle sees the FP32 rounding: it is a comparison, not a copy
}

TEST_CASE(
    "layer inputs: a device's projector (the CUDA backend's seam) gives the CPU tiles' bits") {
  // What the CUDA backend does (kernels/cuda/cuda_backend.cu): layer_shard with its projections
  // handed to a backend's project_heads, tasks of 512 rows one at a time. Here the CPU backend's
  // project_heads stands in for the device's; the GPU suite checks the device's (test_gpu.cpp).
  ThreadPool pool(2);
  Problem p = small_layer();
  p.seq_len = 1200;  // tasks of 512, 512 and 176 rows in the first range
  const std::unique_ptr<AttentionBackend> cpu = make_cpu_backend(pool);
  int calls = 0;
  const LayerProjector projector = [&](std::span<const ProjectionJob> jobs, int dim, int out) {
    ++calls;
    cpu->project_heads(jobs, dim, out);
  };
  const ShardShape part{p.batch, Range{2, 6}, {Range{0, 1100}, Range{1150, 1200}}, p.dims.head_dim};
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out}) {
    for (const InputPrecision precision : {InputPrecision::fp32, InputPrecision::bf16}) {
      CAPTURE(static_cast<int>(t));
      const ShardShape shape = testing::layer_tensor_shape(t, part);
      calls = 0;
      const Shard via = layer_shard(p, t, shape, precision, pool, projector);
      CHECK(calls == p.batch * 4);  // (3 + 1 tasks) per sequence, every head in one call
      CHECK(std::memcmp(via.data.data(), generate_shard(p, t, shape, precision, pool).data.data(),
                        via.data.size() * sizeof(float)) == 0);
    }
  }
  // The control: a split-K projector (two half sums added, what a shape-dependent GEMM may do).
  const LayerProjector split_k = [](std::span<const ProjectionJob> jobs, int dim, int out) {
    const int half = dim / 2;
    for (const ProjectionJob& j : jobs) {
      for (std::int64_t r = 0; r < j.rows; ++r) {
        for (int v = 0; v < out; ++v) {
          const float* x = j.hidden + r * dim;
          const float* w = j.w + v * j.ldw;
          j.z[r * out + v] = dot_seq(x, w, half) + dot_seq(x + half, w + half, dim - half);
        }
      }
    }
  };
  CHECK(std::memcmp(
            layer_shard(p, TensorId::q, part, InputPrecision::fp32, pool, split_k).data.data(),
            generate_shard(p, TensorId::q, part, InputPrecision::fp32, pool).data.data(),
            static_cast<std::size_t>(part.batch * part.heads.size() * 1150 * p.dims.head_dim) *
                sizeof(float)) != 0);
}

TEST_CASE("layer inputs: a shard of heads and tokens is the same slice of the whole") {
  ThreadPool pool(2);
  const Problem p = small_layer();
  const Shard all =
      generate_shard(p, TensorId::q, whole(p, TensorId::q), InputPrecision::fp32, pool);
  const ShardShape part{p.batch, Range{1, 3}, {Range{4, 12}, Range{20, 28}}, p.dims.head_dim};
  for (const InputPrecision precision : {InputPrecision::fp32, InputPrecision::bf16}) {
    const Shard s = generate_shard(p, TensorId::q, part, precision, pool);
    int differ = 0;
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 1; h < 3; ++h) {
        for (const Range& r : part.tokens) {
          for (std::int64_t pos = r.begin; pos < r.end; ++pos) {
            for (int e = 0; e < p.dims.head_dim; ++e) {
              const float want = all.at(b, h, pos)[e];
              const float got = s.at(b, h, part.local_row(pos))[e];
              differ += precision == InputPrecision::bf16 ? got != round_bf16(want) : got != want;
            }
          }
        }
      }
    }
    CHECK(differ == 0);
  }
}

namespace {

// A case's layer run in one process: the FP32 forward, then o_proj on its output (as candidate
// and reference both), and, with `vocab`, the layer's logprobs.
struct LayerRun {
  std::vector<float> out;      // [B][S][hidden], the candidate
  std::vector<float> logprob;  // [B][S], the candidate
};

LayerRun run_layer(const Problem& p, const CaseSpec& spec, int vocab = 0) {
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(inputs.problem(), spec);
  const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
  std::vector<const AttnShard*> outs;
  for (const RankOutput& r : fwd) outs.push_back(&r.merged);
  const std::vector<LayerOutputs> layer = run_o_proj(grid, outs, outs, transport, inputs);
  const int hidden = p.dims.hidden_size;
  LayerRun run{std::vector<float>(static_cast<std::size_t>(p.batch * p.seq_len * hidden)),
               std::vector<float>(static_cast<std::size_t>(p.batch * p.seq_len))};
  // Every token of an owner's shard `of`, `width` floats each, into its place in `into`.
  const auto gather = [&](const Shard& of, int width, std::vector<float>& into) {
    for (int b = 0; b < p.batch; ++b) {
      for (const Range& r : of.shape.tokens) {
        for (std::int64_t s = r.begin; s < r.end; ++s)
          std::memcpy(into.data() + (b * p.seq_len + s) * width, of.at(b, 0, of.shape.local_row(s)),
                      width * sizeof(float));
      }
    }
  };
  for (const LayerOutputs& o : layer) gather(o.candidate, hidden, run.out);
  if (vocab > 0) {
    for (const TokenLogprobs& t : run_layer_dlogp(grid, layer, vocab, transport, inputs))
      gather(t.candidate, 1, run.logprob);
  }
  return run;
}

std::vector<float> layer_output(const Problem& p, const CaseSpec& spec) {
  return run_layer(p, spec).out;
}

}  // namespace

TEST_CASE(
    "o_proj: TP 1, 2, 4 and CP 1, 2 give the canonical group fold's bits; rank_sums does not") {
  Problem p = small_layer();
  p.seq_len = 2 * kLayerChunkRows + 64;  // several chunks: the chain pipelines them
  const CaseSpec one{1, 1, 16, CpLayout::contiguous, Protocol::ag_rs};
  const std::vector<float> ref = layer_output(p, one);
  // The definition: o_proj_groups over every group of the FP32 CP=1 attention output.
  {
    ThreadPool pool(2);
    InputStore inputs(p, pool);
    InProcessTransport transport;
    const CaseGrid grid(inputs.problem(), one);
    const std::vector<RankOutput> fwd = run_protocol(grid, kFp32, transport, inputs, {});
    const ModelDims& d = p.dims;
    const int hidden = d.hidden_size, width = d.num_q_heads * d.head_dim;
    const int group = d.group_size() * d.head_dim;
    std::vector<float> w(static_cast<std::size_t>(hidden * width));  // [hidden][Hq·D]
    for (int g = 0; g < d.num_kv_heads; ++g) {
      const float* cols = inputs.problem().weights->o_proj_group(g);
      for (int o = 0; o < hidden; ++o)
        std::memcpy(w.data() + o * width + g * group, cols + o * group, group * sizeof(float));
    }
    int differ = 0;
    std::vector<float> a(static_cast<std::size_t>(width)), y(hidden);
    const Shard& out = fwd.front().merged.out;
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t s = 0; s < p.seq_len; ++s) {
        for (int h = 0; h < d.num_q_heads; ++h)
          std::memcpy(a.data() + h * d.head_dim, out.at(b, h, s), d.head_dim * sizeof(float));
        o_proj_groups(a.data(), w.data(), width, group, 0, d.num_kv_heads, hidden, true, y.data());
        differ += std::memcmp(y.data(), ref.data() + (b * p.seq_len + s) * hidden,
                              hidden * sizeof(float)) != 0;
      }
    }
    CHECK(differ == 0);
  }
  for (const int tp : {2, 4}) {
    for (const int cp : {1, 2}) {
      for (const CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
        CAPTURE(tp);
        CAPTURE(cp);
        const std::vector<float> got =
            layer_output(p, CaseSpec{tp, cp, 16, layout, Protocol::ag_rs});
        CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);
      }
    }
  }
  // The control: the ranks' own sums added apart. At TP 1 there is one rank: the same fold.
  p.o_proj_order = OProjOrder::rank_sums;
  const std::vector<float> one_rank = layer_output(p, one);
  CHECK(std::memcmp(one_rank.data(), ref.data(), ref.size() * sizeof(float)) == 0);
  const std::vector<float> two =
      layer_output(p, CaseSpec{2, 1, 16, CpLayout::contiguous, Protocol::ag_rs});
  CHECK(std::memcmp(two.data(), ref.data(), ref.size() * sizeof(float)) != 0);
}

TEST_CASE("layer dlogp: vocabulary shards over TP 1, 2, 4 and CP 1, 2 give TP = 1's logprobs") {
  // V = 300: three blocks of 128, the last short; at TP 4 one rank holds none. S = 32 and a
  // split of 8: the block grid every CP and layout shares.
  Problem p = small_layer();
  const int vocab = 300;
  const LayerRun one =
      run_layer(p, CaseSpec{1, 1, 8, CpLayout::contiguous, Protocol::ag_rs}, vocab);
  const std::vector<float>& out = one.out;
  const std::vector<float>& ref = one.logprob;
  // The definition: each token's whole row of logits, one chain over the hidden dim each, and
  // the log-softmax of the row at its target (the core's, log_softmax_at_lanes).
  ThreadPool pool(1);
  const std::vector<float> w = layer_lm_head_rows(p, Range{0, vocab}, pool);
  const int hidden = p.dims.hidden_size;
  int differ = 0, split_differs = 0;
  std::vector<float> logits(vocab), split(vocab);
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t s = 0; s < p.seq_len; ++s) {
      const float* x = out.data() + (b * p.seq_len + s) * hidden;
      for (int v = 0; v < vocab; ++v) {
        logits[v] = dot_seq(x, w.data() + v * hidden, hidden);
        // The control: the same dot split in two halves (a split-K) and added.
        split[v] = dot_seq(x, w.data() + v * hidden, hidden / 2) +
                   dot_seq(x + hidden / 2, w.data() + v * hidden + hidden / 2, hidden / 2);
      }
      const int target = logprob_target(b, s, p.seq_len, vocab);
      const float want = log_softmax_at_lanes(logits.data(), vocab, target);
      differ += std::memcmp(&want, &ref[b * p.seq_len + s], sizeof want) != 0;
      const float off = log_softmax_at_lanes(split.data(), vocab, target);
      split_differs += std::memcmp(&off, &want, sizeof off) != 0;
    }
  }
  CHECK(differ == 0);
  CHECK(split_differs > 0);
  for (const int tp : {2, 4}) {
    for (const int cp : {1, 2}) {
      CAPTURE(tp);
      CAPTURE(cp);
      const std::vector<float> got =
          run_layer(p, CaseSpec{tp, cp, 8, CpLayout::zigzag, Protocol::ag_rs}, vocab).logprob;
      CHECK(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0);
    }
  }
}
