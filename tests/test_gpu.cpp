// The CUDA backend against the CPU backend: bitwise where the contract says bitwise (inputs,
// the FP32 forward, fold, merge, backward, projection, the layer), a stated tolerance for the
// tensor-core and cuBLAS paths, topology invariance on the GPU with a negative control, and the
// paged (rollout) lanes and their invariances.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "case_digests.h"
#include "cpdrift/bf16.h"
#include "engine/backward.h"
#include "engine/case_runner.h"
#include "engine/paged/paged_case.h"
#include "fp64_attention.h"
#include "kernels/attention_backend.h"
#include "kernels/layer_weights.h"
#include "random_rows.h"
#include "recorded_run.h"
#include "report/run_report.h"

using namespace cpd;
using cpd::testing::random_rows;
using cpd::testing::same_bits;

namespace {

constexpr int kDim = 128;

struct Backends {
  ThreadPool pool{2};
  std::unique_ptr<AttentionBackend> cpu = make_cpu_backend(pool);
  std::unique_ptr<AttentionBackend> gpu = make_cuda_backend(0);
};

Backends& backends() {
  static Backends b;
  return b;
}

const float kScale = ModelDims{}.softmax_scale();

}  // namespace

TEST_CASE("inputs: generated on the GPU, bit for bit the CPU's") {
  Problem p;
  p.seq_len = 96;
  p.batch = 2;
  for (const auto& [dist, name] : kInputDistributionNames) {
    p.distribution = dist;
    for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out}) {
      for (const InputPrecision prec : {InputPrecision::fp32, InputPrecision::bf16}) {
        CAPTURE(std::string(name));
        const int heads = t == TensorId::k || t == TensorId::v ? 8 : 32;
        // Position 0 included: the sink key's row.
        const ShardShape shape{2, Range{1, heads}, {Range{0, 40}, Range{70, 96}}, kDim};
        CHECK(same_bits(backends().gpu->generate_shard(p, t, shape, prec).data,
                        backends().cpu->generate_shard(p, t, shape, prec).data));
      }
    }
  }
}

TEST_CASE("FP32 partial states and folds: bit for bit the CPU's") {
  const std::vector<float> q = random_rows(45, 1), k = random_rows(200, 2), v = random_rows(200, 3);
  for (const int dim : {128, 64}) {
    std::vector<BlockJob> jobs;
    std::vector<std::vector<float>> outs[2];
    for (int side = 0; side < 2; ++side) outs[side].assign(12, std::vector<float>(45 * (dim + 1)));
    for (int side = 0; side < 2; ++side) {
      jobs.clear();
      std::size_t o = 0;
      for (const Range keys : {Range{100, 101}, Range{100, 164}, Range{0, 37}, Range{120, 200}}) {
        for (const std::int64_t first : {90LL, 130LL, 180LL}) {
          float* out = outs[side][o++].data();
          jobs.push_back(BlockJob{q.data(), first, 45, k.data() + keys.begin * dim,
                                  v.data() + keys.begin * dim, keys, out, out + 45 * dim});
        }
      }
      (side == 0 ? backends().cpu : backends().gpu)
          ->run_block_jobs(jobs, dim, kScale, ProbRounding::none);
    }
    for (std::size_t i = 0; i < outs[0].size(); ++i) CHECK(same_bits(outs[0][i], outs[1][i]));
    // A fold over three blocks.
    const std::vector<Range> grid{Range{0, 50}, Range{50, 51}, Range{51, 200}};
    std::vector<float> fold[2] = {std::vector<float>(45 * (dim + 1)),
                                  std::vector<float>(45 * (dim + 1))};
    for (int side = 0; side < 2; ++side) {
      const FoldJob job{q.data(),
                        140,
                        45,
                        k.data(),
                        v.data(),
                        0,
                        grid,
                        fold[side].data(),
                        fold[side].data() + 45 * dim};
      (side == 0 ? backends().cpu : backends().gpu)
          ->run_fold_jobs(std::span<const FoldJob>(&job, 1), dim, kScale, ProbRounding::none);
    }
    CHECK(same_bits(fold[0], fold[1]));
  }
}

TEST_CASE("the ordered merge on the GPU: bit for bit, in any given order") {
  const int rows = 7, n = 9;
  std::vector<std::vector<float>> outs, lses;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  for (int s = 0; s < n; ++s) {
    outs.push_back(random_rows(rows, 10 + s));
    lses.emplace_back(rows);
    for (float& x : lses.back()) x = 4 * normal(rng);
  }
  lses[3][2] = -INFINITY;
  std::vector<float> result[2] = {std::vector<float>(rows * kDim), std::vector<float>(rows * kDim)};
  std::vector<float> lse[2] = {std::vector<float>(rows), std::vector<float>(rows)};
  for (int side = 0; side < 2; ++side) {
    MergeJob job;
    for (int s = n - 1; s >= 0; --s)
      job.states.push_back(StateRef{s, outs[s].data(), lses[s].data()});
    job.rows = rows;
    job.out = result[side].data();
    job.lse = lse[side].data();
    (side == 0 ? backends().cpu : backends().gpu)
        ->merge_states(std::span<const MergeJob>(&job, 1), kDim);
  }
  CHECK(same_bits(result[0], result[1]));
  CHECK(same_bits(lse[0], lse[1]));
}

TEST_CASE("backward units and the logit projection: bit for bit the CPU's") {
  // A real case's backward on both backends: dq, dk, dv digests must match.
  Problem p = testing::small_problem();
  for (const CaseSpec spec :
       {CaseSpec{2, 2, 8, CpLayout::zigzag, Protocol::ag_rs},
        CaseSpec{1, 1, std::nullopt, CpLayout::contiguous, Protocol::ag_rs}}) {
    std::vector<float> grads[2];
    for (int side = 0; side < 2; ++side) {
      AttentionBackend& b = side == 0 ? *backends().cpu : *backends().gpu;
      InputStore inputs(p, backends().pool, b);
      InProcessTransport transport;
      const CaseGrid grid(p, spec);
      const std::vector<RankOutput> fwd = run_protocol(grid, testing::kFp32, transport, inputs, {});
      for (const RankGradients& g : run_backward(grid, fwd, transport, inputs)) {
        for (const Shard* s : {&g.dq, &g.dk, &g.dv})
          grads[side].insert(grads[side].end(), s->data.begin(), s->data.end());
      }
    }
    CHECK(same_bits(grads[0], grads[1]));
  }
  const std::vector<float> hidden = random_rows(5, 7), w = random_rows(17, 8, 4096);
  std::vector<float> z[2] = {std::vector<float>(5 * 17), std::vector<float>(5 * 17)};
  for (int side = 0; side < 2; ++side) {
    const ProjectionJob job{hidden.data(), 5, w.data() + 256, 4096, z[side].data()};
    (side == 0 ? backends().cpu : backends().gpu)
        ->project_heads(std::span<const ProjectionJob>(&job, 1), kDim, 17);
  }
  CHECK(same_bits(z[0], z[1]));
}

namespace {

// Rows first … first+rows-1 against the keys `keys` on the tensor-core (path 0) and cuBLAS
// (path 1) BF16 paths: rows that see no key are (0, -inf); the others are within the BF16
// bound of an FP64 attention over their visible keys. BF16-exact inputs; both paths round P
// to BF16 (relative error ≤ 2^-9) with FP32 accumulation, so |out - out64| ≤ 2^-8·max|v|, the
// bound the CPU emulation meets too.
void check_bf16_paths(std::int64_t first, int rows, Range keys, std::uint64_t seed) {
  const auto n_keys = static_cast<int>(keys.size());
  const std::vector<float> q = random_rows(rows, seed, kDim, true),
                           k = random_rows(n_keys, seed + 1, kDim, true),
                           v = random_rows(n_keys, seed + 2, kDim, true);
  double max_v = 0;
  for (float x : v) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
  for (int path = 0; path < 2; ++path) {
    std::vector<float> out(rows * kDim, NAN), lse(rows, NAN);
    const BlockJob job{q.data(), first, rows, k.data(), v.data(), keys, out.data(), lse.data()};
    if (path == 0) {
      backends().gpu->run_block_jobs(std::span<const BlockJob>(&job, 1), kDim, kScale,
                                     ProbRounding::bf16);
    } else {
      backends().gpu->run_unfused_jobs(std::span<const BlockJob>(&job, 1), kDim, kScale);
    }
    CAPTURE(path);
    for (int r = 0; r < rows; ++r) {
      CAPTURE(r);
      const auto n =
          static_cast<int>(std::clamp<std::int64_t>(first + r + 1 - keys.begin, 0, keys.size()));
      if (n == 0) {
        CHECK(lse[r] == -INFINITY);
        for (int d = 0; d < kDim; ++d) CHECK(out[r * kDim + d] == 0.0f);
        continue;
      }
      std::vector<double> ref;
      double ref_lse = 0;
      testing::attention_fp64(&q[r * kDim], k.data(), v.data(), n, kDim, kScale, ref, ref_lse);
      for (int d = 0; d < kDim; ++d)
        CHECK(std::fabs(out[r * kDim + d] - ref[d]) <= std::ldexp(max_v, -8));
    }
  }
}

}  // namespace

TEST_CASE("tensor-core bf16 kernel and cuBLAS unfused against FP64, within BF16 tolerance") {
  check_bf16_paths(250, 70, Range{0, 300}, 21);
}

TEST_CASE(
    "tensor-core and cuBLAS paths: rows before a block are (0, -inf), the rest see its keys") {
  // Rows 70..129 against keys [100, 200): rows before 100 see nothing (the masked-row branches
  // of the flash kernel, the unfused softmax and its normalisation), later rows a prefix.
  check_bf16_paths(70, 60, Range{100, 200}, 31);
}

TEST_CASE("topology invariance on the GPU, FP32 and tensor-core paths, with a negative control") {
  const Problem p = testing::small_problem();
  const auto digests = [&](const CaseSpec& spec, const PathSpec& path) {
    InputStore inputs(p, backends().pool, *backends().gpu);
    InProcessTransport transport;
    const CaseGrid grid(p, spec);
    return testing::digests_of(grid, run_protocol(grid, path, transport, inputs, {}),
                               LocalCollectives(), 1, 0);
  };
  for (const PathSpec& path : {testing::kFp32, testing::kBf16Kernel}) {
    const testing::Digests ref =
        digests(CaseSpec{1, 1, 8, CpLayout::contiguous, Protocol::ag_rs}, path);
    for (int cp : {2, 4}) {
      for (CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
        const testing::Digests d = digests(CaseSpec{2, cp, 8, layout, Protocol::ring_kv}, path);
        CHECK(d.out == ref.out);
        CHECK(d.lse == ref.lse);
      }
    }
  }
  CHECK(digests(CaseSpec{1, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs}, testing::kFp32)
            .out !=
        digests(CaseSpec{1, 1, std::nullopt, CpLayout::contiguous, Protocol::ag_rs}, testing::kFp32)
            .out);
}

TEST_CASE("a whole case on the GPU: its FP32 path equals the CPU's, cuBLAS drift is reported") {
  const Problem p = testing::small_problem();
  InputStore gpu_inputs(p, backends().pool, *backends().gpu);
  InputStore cpu_inputs(p, backends().pool, *backends().cpu);
  InProcessTransport transport;
  LocalCp1Results cp1;
  const LocalCollectives one;
  RunContext ctx{p, backends().pool, gpu_inputs, transport, one, cp1};
  ctx.cpu_rerun_inputs = &cpu_inputs;
  const CaseResult r =
      testing::recorded_case(ctx, CaseSpec{2, 2, 8, CpLayout::contiguous, Protocol::ag_rs});
  REQUIRE(r.cuda_vs_cpu_fp32.has_value());
  CHECK(r.cuda_vs_cpu_fp32->out.bitwise_equal());
  CHECK(r.cuda_vs_cpu_fp32->lse.bitwise_equal());
  REQUIRE(r.cublas_unfused.has_value());
  CHECK(r.cublas_unfused->out.finite());
  CHECK(r.cublas_unfused->out.max_abs <= Thresholds{}.bf16_write_max_abs);  // a BF16 write's
}

TEST_CASE(
    "paged cases on the GPU: FP32 lanes bit for bit the CPU's, invariances bitwise on the "
    "tensor-core path") {
  Problem p;
  p.seq_len = 96;
  p.batch = 3;
  std::vector<PagedCaseSpec> specs;
  for (const SplitKv split : {SplitKv{SplitPolicy::disabled, 0}, SplitKv{SplitPolicy::fixed, 16}}) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode})
      specs.push_back(PagedCaseSpec{m, split});
  }
  const auto run = [&](AttentionBackend& backend, DType dtype) {
    Problem q = p;
    q.dtype = dtype;
    InputStore inputs(q, backends().pool, backend);
    InProcessTransport transport;
    LocalCp1Results cp1;
    const LocalCollectives one;
    const RunContext ctx{q, backends().pool, inputs, transport, one, cp1};
    return testing::recorded_paged_cases(ctx, PagedOptions{4, std::nullopt, 17}, specs);
  };
  // --dtype fp32: the candidate is the FP32 path, whose bits the contract fixes on both devices.
  const std::vector<PagedCaseResult> cpu = run(*backends().cpu, DType::fp32);
  const std::vector<PagedCaseResult> gpu = run(*backends().gpu, DType::fp32);
  REQUIRE(cpu.size() == gpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(cpu[i].name);
    CHECK(gpu[i].candidate.out.digest == cpu[i].candidate.out.digest);
    CHECK(gpu[i].candidate.lse.digest == cpu[i].candidate.lse.digest);
  }
  // BF16 on the GPU is the tensor-core kernel: its own bits, but every invariance must hold.
  // The paged thresholds of design §7 (the report's defaults) hold for it too.
  const Thresholds t;
  for (const PagedCaseResult& c : run(*backends().gpu, DType::bf16)) {
    CAPTURE(c.name);
    CHECK(c.candidate.out.max_abs <= t.paged_out_max_abs);
    CHECK(c.candidate.lse.max_abs <= t.paged_lse_max_abs);
    CHECK(c.dlogp.max_abs <= t.paged_dlogp_max_abs);
    for (const Invariance& inv : c.invariances) {
      CAPTURE(inv.name);
      CHECK(inv.bitwise_equal());
    }
  }
}

TEST_CASE(
    "the layer on the GPU: q, k, v and dO from its projections, the output and every gradient, "
    "bit for bit the CPU's") {
  // --dtype fp32: the candidate is the FP32 path, whose bits the contract fixes on both devices
  // (the BF16 one is the tensor-core kernel's own).
  Problem p = testing::small_layer();
  p.dtype = DType::fp32;
  p.seq_len = 640;  // the device's projection tasks of 512 rows: more than one
  const ShardShape part{p.batch, Range{2, 6}, {Range{0, 600}, Range{620, 640}}, p.dims.head_dim};
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out}) {
    for (const InputPrecision prec : {InputPrecision::fp32, InputPrecision::bf16}) {
      CAPTURE(static_cast<int>(t));
      const ShardShape shape = testing::layer_tensor_shape(t, part);
      CHECK(same_bits(backends().gpu->generate_shard(p, t, shape, prec).data,
                      backends().cpu->generate_shard(p, t, shape, prec).data));
    }
  }
  p.seq_len = 64;
  const auto run = [&](AttentionBackend& backend) {
    InputStore inputs(p, backends().pool, backend);
    InProcessTransport transport;
    LocalCp1Results cp1;
    LocalCp1Backward cp1_backward;
    const LocalCollectives one;
    RunContext ctx{p, backends().pool, inputs, transport, one, cp1};
    ctx.cp1_backward = &cp1_backward;
    return testing::recorded_case(ctx, CaseSpec{2, 2, 16, CpLayout::zigzag, Protocol::ag_rs});
  };
  const CaseResult gpu = run(*backends().gpu), cpu = run(*backends().cpu);
  REQUIRE(gpu.layer.available);
  REQUIRE(cpu.layer.available);
  CHECK(gpu.layer.out.digest == cpu.layer.out.digest);
  REQUIRE(gpu.layer.backward.size() == cpu.layer.backward.size());
  CHECK(gpu.layer.backward.size() >= 8);
  for (std::size_t i = 0; i < gpu.layer.backward.size(); ++i) {
    CAPTURE(gpu.layer.backward[i].first);
    CHECK(gpu.layer.backward[i].second.digest == cpu.layer.backward[i].second.digest);
  }
}

TEST_CASE(
    "the layer's cuBLAS BF16 projection: within FP32 accumulation of the BF16 products, "
    "the same bits run to run") {
  // A q_proj head's shape: rows of the hidden size against D weight rows. The products of BF16
  // values are exact in FP32, so in any order the sum is within (hidden − 1)·u·Σ|x·w| of FP64's.
  constexpr int kHidden = 4096, kOut = 128;
  constexpr std::int64_t kRows = 96;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::vector<float> x(kRows * kHidden), w(kOut * kHidden);
  for (float& v : x) v = normal(gen);
  for (float& v : w) v = normal(gen) / 64;
  std::vector<float> z(kRows * kOut), again(z.size());
  REQUIRE(backends().gpu->has_bf16_gemm_projection());
  CHECK_FALSE(backends().cpu->has_bf16_gemm_projection());
  const ProjectionJob job{x.data(), kRows, w.data(), kHidden, z.data()};
  backends().gpu->project_heads_bf16_gemm({&job, 1}, kHidden, kOut);
  const ProjectionJob job2{x.data(), kRows, w.data(), kHidden, again.data()};
  backends().gpu->project_heads_bf16_gemm({&job2, 1}, kHidden, kOut);
  CHECK(same_bits(z, again));
  const double u = std::ldexp(1.0, -24);
  double worst = 0;
  for (std::int64_t r = 0; r < kRows; ++r) {
    for (int o = 0; o < kOut; ++o) {
      double exact = 0, magnitude = 0;
      for (int i = 0; i < kHidden; ++i) {
        const double t =
            static_cast<double>(round_bf16(x[r * kHidden + i])) * round_bf16(w[o * kHidden + i]);
        exact += t;
        magnitude += std::fabs(t);
      }
      worst = std::max(worst, std::fabs(z[r * kOut + o] - exact) / ((kHidden - 1) * u * magnitude));
    }
  }
  CHECK(worst <= 1.0);
  // The canonical FP32 projection of the unrounded values is another result (the control).
  std::vector<float> canonical(z.size());
  const ProjectionJob fp32{x.data(), kRows, w.data(), kHidden, canonical.data()};
  backends().gpu->project_heads({&fp32, 1}, kHidden, kOut);
  CHECK_FALSE(same_bits(z, canonical));
}
