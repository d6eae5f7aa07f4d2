// The TP-reduction lanes (cpdrift/tp_lanes.h, numerics.md §12): each stack's sum of the TP ranks'
// FP32 partials against an FP64 oracle within the bound of its roundings, its order against an
// independent fold, the canonical value at one rank, NCCL's chunking of a buffer, and the
// controls (another collective, an FP32 wire) that change bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "cpdrift/tp_lanes.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::random_rows;

namespace {

constexpr double kBf16U = 1.0 / 256;  // BF16's unit roundoff: 8 significant bits

// A buffer of 4096 elements (8 KiB in BF16: vLLM's one or two stages by rank count).
constexpr TpBuffer kBuffer{4096, WireType::bf16};

// A left fold of `order`'s values, each rounded to BF16 first, rounding every sum.
float bf16_fold(const std::vector<float>& order) {
  float sum = round_bf16(order[0]);
  for (std::size_t k = 1; k < order.size(); ++k) sum = round_bf16(sum + round_bf16(order[k]));
  return sum;
}

// The FP64 oracle of `ranks` partials: their exact sum and Σ|x| (the bounds' scale).
std::pair<double, double> exact_sum(const float* p, int ranks) {
  double exact = 0, magnitude = 0;
  for (int r = 0; r < ranks; ++r) {
    exact += p[r];
    magnitude += std::fabs(p[r]);
  }
  return {exact, magnitude};
}

}  // namespace

TEST_CASE("NCCL's ring chunks: the last loop cut in ranks parts of whole 16-byte granules") {
  // 100 BF16 elements over 4 ranks in one loop: ⌈25 / 8⌉ · 8 = 32 a chunk, the last short.
  std::vector<int> got;
  for (const std::int64_t i : {0, 31, 32, 63, 64, 95, 96, 99})
    got.push_back(nccl_ring_chunk(i, 100, 4, 2));
  CHECK(got == std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3});
  // Full loops of 2 · 16 elements first, then the rest (4 elements) cut as a last loop: one
  // granule of 8 a chunk, so all of it in chunk 0.
  CHECK(nccl_ring_chunk(15, 100, 2, 2, 16) == 0);
  CHECK(nccl_ring_chunk(16, 100, 2, 2, 16) == 1);
  CHECK(nccl_ring_chunk(95, 100, 2, 2, 16) == 1);
  CHECK(nccl_ring_chunk(99, 100, 2, 2, 16) == 0);
  // FP32: granules of 4.
  CHECK(nccl_ring_chunk(4, 10, 2, 4) == 0);
  CHECK(nccl_ring_chunk(8, 10, 2, 4) == 1);
}

TEST_CASE("Megatron's all-reduce: NCCL's 2 MiB chunks in loops, not the reduce-scatter's parts") {
  // 16 MiB of BF16 over 2 ranks: 4 loops of 2 chunks of 1 Mi elements; the sequence-parallel
  // reduce-scatter cuts the same buffer in 2 halves.
  const std::int64_t count = 8 << 20, chunk = kNcclSimpleChunkBytes / 2;
  CHECK(chunk == (1 << 20));
  CHECK(nccl_ring_chunk(chunk - 1, count, 2, 2, chunk) == 0);
  CHECK(nccl_ring_chunk(chunk, count, 2, 2, chunk) == 1);
  CHECK(nccl_ring_chunk(2 * chunk, count, 2, 2, chunk) == 0);  // the second loop
  // 32 MiB over 4 ranks: element 1 Mi is in the all-reduce's chunk 1 (its ring starts on rank 2)
  // and the reduce-scatter's part 0 (its ring starts on rank 1).
  const TpBuffer buffer{2 * count, WireType::bf16};
  const std::vector<float> x = random_rows(256, 31, 4);
  int differ = 0;
  for (int e = 0; e < 256; ++e) {
    const float* p = x.data() + e * 4;
    std::vector<float> from2(p, p + 4), from1(p, p + 4);
    std::rotate(from2.begin(), from2.begin() + 2, from2.end());
    std::rotate(from1.begin(), from1.begin() + 1, from1.end());
    const float ar = tp_lane_sum(TpLane::megatron_ar, p, 4, chunk, buffer);
    const float sp = tp_lane_sum(TpLane::megatron_sp, p, 4, chunk, buffer);
    CHECK(bits_of(ar) == bits_of(bf16_fold(from2)));
    CHECK(bits_of(sp) == bits_of(bf16_fold(from1)));
    differ += bits_of(ar) != bits_of(sp);
  }
  CHECK(differ > 0);
}

TEST_CASE("TP lanes at one rank: the partial written in the wire type, the canonical value") {
  const std::vector<float> x = random_rows(256, 3, 1);
  for (const TpLane lane :
       {TpLane::megatron_ar, TpLane::megatron_sp, TpLane::vllm_ar, TpLane::vllm_bi}) {
    for (std::int64_t i = 0; i < 256; ++i) {
      const float* p = x.data() + i;
      CHECK(bits_of(tp_lane_sum(lane, p, 1, i, kBuffer)) == bits_of(round_bf16(*p)));
      CHECK(bits_of(tp_lane_sum(lane, p, 1, i, TpBuffer{4096, WireType::fp32})) == bits_of(*p));
    }
  }
  // The gradient lanes carry their own wire, whatever the buffer says.
  for (std::int64_t i = 0; i < 256; ++i) {
    const float* p = x.data() + i;
    CHECK(bits_of(tp_lane_sum(TpLane::megatron_grad_fp32, p, 1, i, kBuffer)) == bits_of(*p));
    CHECK(bits_of(tp_lane_sum(TpLane::megatron_grad_bf16, p, 1, i,
                              TpBuffer{4096, WireType::fp32})) == bits_of(round_bf16(*p)));
  }
}

TEST_CASE("TP lanes against FP64: within the partials' writes and the sums' roundings") {
  // Each partial written in BF16: u·|P_r|; then the sums, at most n − 1 BF16 roundings of
  // partial sums each within (1 + u)^n of Σ|P|: u·(n − 1)·1.1·Σ|P|·(1 + u). vLLM's FP32 sums
  // with one rounding lie inside the same bound.
  for (const int ranks : {2, 4, 8}) {
    const std::vector<float> x = random_rows(kBuffer.count, 17 + ranks, ranks);
    for (const TpLane lane : {TpLane::megatron_ar, TpLane::megatron_sp, TpLane::vllm_ar,
                              TpLane::vllm_bi, TpLane::megatron_grad_bf16}) {
      double worst = 0;
      for (std::int64_t i = 0; i < kBuffer.count; ++i) {
        const float* p = x.data() + i * ranks;
        const auto [exact, magnitude] = exact_sum(p, ranks);
        const double bound = kBf16U * magnitude * (1 + 1.1 * (ranks - 1) * (1 + kBf16U));
        worst = std::max(worst, std::fabs(tp_lane_sum(lane, p, ranks, i, kBuffer) - exact) / bound);
      }
      CAPTURE(ranks);
      CAPTURE(to_string(lane));
      CHECK(worst <= 1.0);
      CHECK(worst > 0.0);  // the oracle sees the roundings
    }
  }
}

TEST_CASE(
    "the FP32 gradient reduce-scatter: FP32 hops from part r's rank r + 1, within FP32's bound") {
  // n − 1 FP32 roundings of partial sums: (n − 1)·2^-24·Σ|x|·1.01; the order by rotation.
  for (const int ranks : {2, 4, 8}) {
    const std::vector<float> x = random_rows(kBuffer.count, 41 + ranks, ranks);
    double worst = 0;
    for (std::int64_t i = 0; i < kBuffer.count; ++i) {
      const float* p = x.data() + i * ranks;
      const auto [exact, magnitude] = exact_sum(p, ranks);
      const float got = tp_lane_sum(TpLane::megatron_grad_fp32, p, ranks, i, kBuffer);
      const double bound = (ranks - 1) * std::ldexp(1.0, -24) * magnitude * 1.01;
      worst = std::max(worst, std::fabs(got - exact) / bound);
      const int part = static_cast<int>(i / (kBuffer.count / ranks));
      std::vector<float> order(p, p + ranks);
      std::rotate(order.begin(), order.begin() + (part + 1) % ranks, order.end());
      float fold = order[0];
      for (int k = 1; k < ranks; ++k) fold += order[k];
      CHECK(bits_of(got) == bits_of(fold));
    }
    CAPTURE(ranks);
    CHECK(worst <= 1.0);
    CHECK(worst > 0.0);
  }
}

TEST_CASE("TP lanes' orders: each the fold its collective makes, by an independent rotation") {
  const int ranks = 4;
  const std::vector<float> x = random_rows(kBuffer.count, 5, ranks);
  for (std::int64_t i = 0; i < kBuffer.count; i += 7) {
    const float* p = x.data() + i * ranks;
    const auto rotated = [&](int first) {
      std::vector<float> order(p, p + ranks);
      std::rotate(order.begin(), order.begin() + first % ranks, order.end());
      return order;
    };
    // Megatron's all-reduce: one loop, 1024 elements a chunk; chunk c starts on rank c + 1.
    const int chunk = static_cast<int>(i / 1024);
    CHECK(bits_of(tp_lane_sum(TpLane::megatron_ar, p, ranks, i, kBuffer)) ==
          bits_of(bf16_fold(rotated(chunk + 1))));
    // Sequence parallelism: part r (1024 elements) ends on rank r — the same cut here.
    CHECK(bits_of(tp_lane_sum(TpLane::megatron_sp, p, ranks, i, kBuffer)) ==
          bits_of(bf16_fold(rotated(chunk + 1))));
    // The batch-invariant tree: ranks 3, 2, 1, 0 on every element.
    std::vector<float> down(p, p + ranks);
    std::reverse(down.begin(), down.end());
    CHECK(bits_of(tp_lane_sum(TpLane::vllm_bi, p, ranks, i, kBuffer)) == bits_of(bf16_fold(down)));
    // vLLM under 256 KiB at 4 ranks: one stage, FP32 sums of the BF16 partials in rank order.
    float fp32 = round_bf16(p[0]);
    for (int r = 1; r < ranks; ++r) fp32 += round_bf16(p[r]);
    CHECK(bits_of(tp_lane_sum(TpLane::vllm_ar, p, ranks, i, kBuffer)) == bits_of(round_bf16(fp32)));
  }
  // vLLM at a world size its custom all-reduce does not support (3, 16): NCCL's ring.
  const std::vector<float> many = random_rows(64, 13, 16);
  for (std::int64_t i = 0; i < 64; ++i) {
    for (const int n : {3, 16}) {
      const float* p = many.data() + i * 16;
      CHECK(bits_of(tp_lane_sum(TpLane::vllm_ar, p, n, i, kBuffer)) ==
            bits_of(tp_lane_sum(TpLane::megatron_ar, p, n, i, kBuffer)));
    }
  }
  // vLLM from 8 MiB: NCCL's ring, as Megatron's.
  const TpBuffer big{kVllmCustomAllreduceMaxBytes / 2, WireType::bf16};
  for (std::int64_t i = 0; i < 512; ++i) {
    const float* p = x.data() + i * ranks;
    CHECK(bits_of(tp_lane_sum(TpLane::vllm_ar, p, ranks, i, big)) ==
          bits_of(tp_lane_sum(TpLane::megatron_ar, p, ranks, i, big)));
  }
}

TEST_CASE("TP lanes: another collective, another ring start, an FP32 wire change bits") {
  const int ranks = 4;
  const std::vector<float> x = random_rows(kBuffer.count, 9, ranks);
  int tree_vs_ring = 0, other_start = 0, fp32_wire = 0, two_ranks = 0;
  for (std::int64_t i = 0; i < kBuffer.count; ++i) {
    const float* p = x.data() + i * ranks;
    const float ring = tp_lane_sum(TpLane::megatron_ar, p, ranks, i, kBuffer);
    tree_vs_ring += bits_of(ring) != bits_of(tp_lane_sum(TpLane::vllm_bi, p, ranks, i, kBuffer));
    // The same elements a chunk later: another rank starts their ring.
    const std::int64_t later = (i + 1024) % kBuffer.count;
    other_start +=
        bits_of(ring) != bits_of(tp_lane_sum(TpLane::megatron_ar, p, ranks, later, kBuffer));
    const TpBuffer fp32{kBuffer.count, WireType::fp32};
    fp32_wire += bits_of(ring) != bits_of(tp_lane_sum(TpLane::megatron_ar, p, ranks, i, fp32));
    // Two ranks: one addition of two BF16 values, commutative: every lane the same bits.
    two_ranks += bits_of(tp_lane_sum(TpLane::megatron_ar, p, 2, i, kBuffer)) !=
                 bits_of(tp_lane_sum(TpLane::vllm_bi, p, 2, i, kBuffer));
  }
  CHECK(tree_vs_ring > 0);
  CHECK(other_start > 0);
  CHECK(fp32_wire > 0);
  CHECK(two_ranks == 0);
}
