// The production stacks' tensor-parallel reductions (cpdrift/tp_reduction.h): NCCL's ring order
// against an FP64 oracle within the bound of its BF16 roundings, the order itself against an
// independent rotation of the ranks, and the controls (another ring start, an FP32 wire) that
// change bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpdrift/tp_reduction.h"
#include "random_rows.h"

using namespace cpd;
using cpd::testing::random_rows;

namespace {

constexpr double kBf16U = 1.0 / 256;  // BF16's unit roundoff: 8 significant bits

}  // namespace

TEST_CASE("ring chunk sum: chunk c starts at c + 1 and ends at c, every hop on the wire") {
  for (const int ranks : {2, 3, 4, 8}) {
    const std::vector<float> x = random_rows(64, 11 + ranks, ranks);  // 64 elements × ranks
    for (int e = 0; e < 64; ++e) {
      const float* by = x.data() + e * ranks;
      for (int c = 0; c < ranks; ++c) {
        // The ranks in the ring's order for chunk c, by rotation, then a left fold.
        std::vector<float> order(by, by + ranks);
        std::rotate(order.begin(), order.begin() + (c + 1) % ranks, order.end());
        float fold = round_bf16(order[0]);
        for (int k = 1; k < ranks; ++k) fold = round_bf16(fold + round_bf16(order[k]));
        CHECK(bits_of(ring_chunk_sum(by, ranks, c, WireType::bf16)) == bits_of(fold));
      }
    }
  }
  const float one[1] = {1.00390625f};  // 1 + 2^-8: not a BF16 value
  CHECK(ring_chunk_sum(one, 1, 0, WireType::fp32) == one[0]);
  CHECK(ring_chunk_sum(one, 1, 0, WireType::bf16) == round_bf16(one[0]));
}

TEST_CASE("ring chunk sum against FP64: within (n − 1) BF16 roundings of the partial sums") {
  // Each of the n − 1 additions rounds its result once: |error| ≤ u · Σ_k |s_k| over the
  // partial sums, each within (1 + u)^n of the exact partial |x| sums: bound u·(n − 1)·Σ|x|·1.1.
  for (const int ranks : {2, 4, 8}) {
    const std::vector<float> x = random_rows(4096, 5 + ranks, ranks, true);  // BF16 values
    double worst = 0;
    for (int e = 0; e < 4096; ++e) {
      const float* by = x.data() + e * ranks;
      double exact = 0, magnitude = 0;
      for (int r = 0; r < ranks; ++r) {
        exact += by[r];
        magnitude += std::fabs(by[r]);
      }
      const float got = ring_chunk_sum(by, ranks, e % ranks, WireType::bf16);
      worst = std::max(worst, std::fabs(got - exact) / (kBf16U * (ranks - 1) * magnitude * 1.1));
    }
    CAPTURE(ranks);
    CHECK(worst <= 1.0);
    CHECK(worst > 0.0);  // the oracle sees the roundings
  }
}

TEST_CASE("ring chunk sum: another ring start and an FP32 wire change bits (the controls)") {
  const int ranks = 4;
  const std::vector<float> x = random_rows(512, 3, ranks);
  int other_start = 0, fp32_wire = 0, fp32_exact = 0;
  for (int e = 0; e < 512; ++e) {
    const float* by = x.data() + e * ranks;
    const float nccl = ring_chunk_sum(by, ranks, 0, WireType::bf16);
    other_start += bits_of(nccl) != bits_of(ring_chunk_sum(by, ranks, 0, WireType::bf16, 2));
    fp32_wire += bits_of(nccl) != bits_of(ring_chunk_sum(by, ranks, 0, WireType::fp32));
    // Two ranks on an FP32 wire: one addition, commutative: x0 + x1 exactly as FP32 adds them.
    fp32_exact += bits_of(ring_chunk_sum(by, 2, e % 2, WireType::fp32)) != bits_of(by[0] + by[1]);
  }
  CHECK(other_start > 0);
  CHECK(fp32_wire > 0);
  CHECK(fp32_exact == 0);
}

TEST_CASE("ring chunks: loops of ranks · chunk_elems elements, chunk c at its c-th run") {
  std::vector<int> chunks;
  for (std::int64_t i = 0; i < 14; ++i) chunks.push_back(ring_chunk_of(i, 2, 3));
  CHECK(chunks == std::vector<int>{0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0});
  CHECK(ring_chunk_of(4095, 4, 1024) == 3);
  CHECK(ring_chunk_of(4096, 4, 1024) == 0);
}

TEST_CASE(
    "vLLM's custom all-reduce: FP32 sums in rank order (one stage) or from the part's "
    "owner (two stages), one rounding; which it takes") {
  // One rounding of an FP32 sum of n terms: |error| ≤ (n − 1)·2^-24·Σ|x|·1.01 + 2^-8·|sum|.
  for (const int ranks : {2, 4, 8}) {
    const std::vector<float> x = random_rows(2048, 21 + ranks, ranks, true);
    double worst = 0;
    int order_differs = 0;
    for (int e = 0; e < 2048; ++e) {
      const float* by = x.data() + e * ranks;
      double exact = 0, magnitude = 0;
      float in_order = 0.0f;
      for (int r = 0; r < ranks; ++r) {
        exact += by[r];
        magnitude += std::fabs(by[r]);
        in_order = r == 0 ? by[0] : in_order + by[r];
      }
      const float one = vllm_one_stage_sum(by, ranks, WireType::bf16);
      CHECK(bits_of(one) == bits_of(round_bf16(in_order)));
      const double bound =
          (ranks - 1) * std::ldexp(1.0, -24) * magnitude * 1.01 + kBf16U * std::fabs(exact);
      worst = std::max(worst, std::fabs(one - exact) / bound);
      // Two stages from owner 1: the rotation by one, the same single rounding.
      std::vector<float> rotated(by, by + ranks);
      std::rotate(rotated.begin(), rotated.begin() + 1, rotated.end());
      CHECK(bits_of(vllm_two_stage_sum(by, ranks, 1, WireType::bf16)) ==
            bits_of(vllm_one_stage_sum(rotated.data(), ranks, WireType::bf16)));
      // The control: BF16 values 2^0 … 2^-20 apart, whose FP32 sums round, so the start
      // shows (normals of one scale sum exactly in FP32 and no order could).
      std::vector<float> spread(by, by + ranks);
      for (int r = 0; r < ranks; ++r) spread[r] = std::ldexp(spread[r], -((e * 7 + r * 5) % 21));
      order_differs += bits_of(vllm_two_stage_sum(spread.data(), ranks, 1, WireType::fp32)) !=
                       bits_of(vllm_one_stage_sum(spread.data(), ranks, WireType::fp32));
    }
    CAPTURE(ranks);
    CHECK(worst <= 1.0);
    CHECK(worst > 0.0);
    if (ranks > 2) CHECK(order_differs > 0);  // two ranks: one addition, commutative
  }
  // The parts of 4 ranks over 100 elements: 12 packs of 8 (and 4 left over) → 3 packs a part,
  // the last part taking the rest.
  CHECK(vllm_two_stage_owner(0, 100, 4) == 0);
  CHECK(vllm_two_stage_owner(23, 100, 4) == 0);
  CHECK(vllm_two_stage_owner(24, 100, 4) == 1);
  CHECK(vllm_two_stage_owner(72, 100, 4) == 3);
  CHECK(vllm_two_stage_owner(99, 100, 4) == 3);
  CHECK(vllm_custom_allreduce_stages(2, 1 << 30) == 1);
  CHECK(vllm_custom_allreduce_stages(4, 256 * 1024) == 1);
  CHECK(vllm_custom_allreduce_stages(4, 512 * 1024) == 2);
  CHECK(vllm_custom_allreduce_stages(8, 256 * 1024) == 2);
}
