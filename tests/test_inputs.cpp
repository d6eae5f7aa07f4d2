// The counter-based inputs: Philox known answers, slice independence, the normal transform,
// and RoPE against an FP64 closed form.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpdrift/bf16.h"
#include "cpdrift/philox.h"
#include "cpdrift/rope.h"
#include "kernels/cpu/inputs.h"
#include "kernels/cpu/normals.h"

using namespace cpd;

TEST_CASE("philox4x32-10 matches Random123's known-answer vectors") {
  const Philox4x32 zero = philox4x32_10(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  const Philox4x32 ones = philox4x32_10(
      Philox4x32{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  const Philox4x32 pi = philox4x32_10(
      Philox4x32{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[1] == 0x94fdccebu);
  CHECK(pi.v[2] == 0x5001e420u);
  CHECK(pi.v[3] == 0x24126ea1u);
}

TEST_CASE("uniforms are strictly inside (0, 1) and exact") {
  CHECK(uniform_open01(0u) == std::ldexp(1.0f, -24));
  CHECK(uniform_open01(0xffffffffu) == 1.0f - std::ldexp(1.0f, -24));
  CHECK(uniform_open01(0x80000000u) == 0.5f + std::ldexp(1.0f, -24));
}

TEST_CASE("normals: moments of a million draws") {
  // Mean and variance of n standard normals: the sample mean has sd 1/sqrt(n) = 1e-3 and the
  // sample variance sd sqrt(2/n) ≈ 1.4e-3; 5 sd bounds fail only for a broken transform.
  constexpr std::uint64_t n = 1000000;
  double sum = 0, sum2 = 0, sum4 = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const double z = normal_at(2355, TensorId::q, i);
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
  }
  CHECK(std::fabs(sum / n) < 5e-3);
  CHECK(std::fabs(sum2 / n - 1.0) < 7e-3);
  CHECK(std::fabs(sum4 / n - 3.0) < 0.05);  // kurtosis 3: the tails are Gaussian, not uniform
}

namespace {

// Index of the first element whose bits differ, or -1.
std::int64_t first_mismatch(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<std::int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(a.size());
}

}  // namespace

TEST_CASE("normal_blocks (vectorised) gives normal4's bits, block by block") {
  // Runs that end inside a SIMD vector and inside normal_blocks' batch of 64, starting where the
  // block index carries into its high word, for every tensor and two seeds.
  for (const std::uint64_t seed : {std::uint64_t{2355}, std::uint64_t{0x123456789abcdefULL}}) {
    for (const TensorId t :
         {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out, TensorId::lm_head}) {
      for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{0xfffffff0ULL}}) {
        for (const std::int64_t blocks : {1, 15, 17, 64, 65, 200}) {
          CAPTURE(seed);
          CAPTURE(first);
          CAPTURE(blocks);
          std::vector<float> fast(static_cast<std::size_t>(4 * blocks)), each(fast.size());
          normal_blocks(seed, t, first, blocks, fast.data());
          for (std::int64_t i = 0; i < blocks; ++i)
            normal4(seed, t, first + static_cast<std::uint64_t>(i), each.data() + 4 * i);
          CHECK(first_mismatch(fast, each) == -1);
        }
      }
    }
  }
  // Negative control: the comparison sees one bit of one element.
  std::vector<float> a(64), b;
  normal_blocks(2355, TensorId::q, 0, 16, a.data());
  b = a;
  std::uint32_t bits;
  std::memcpy(&bits, &b[37], sizeof bits);
  bits ^= 1u;
  std::memcpy(&b[37], &bits, sizeof bits);
  CHECK(first_mismatch(a, b) == 37);
}

TEST_CASE("box_muller_pairs (vectorised) gives box_muller's bits for every radius and angle") {
  // A Philox word reaches box_muller through uniform_open01, which keeps its top 23 bits: 2^23
  // radii and 2^23 angles. Pair i takes radius i and angle (i * 0x2545f5) mod 2^23, an odd
  // multiplier, so a permutation: every radius and every angle once.
  constexpr std::int64_t kValues = std::int64_t{1} << 23, kChunk = std::int64_t{1} << 18;
  std::vector<std::uint32_t> words(static_cast<std::size_t>(2 * kChunk));
  std::vector<float> fast(words.size()), each(words.size());
  std::int64_t mismatches = 0;
  for (std::int64_t c0 = 0; c0 < kValues; c0 += kChunk) {
    for (std::int64_t i = 0; i < kChunk; ++i) {
      const auto k = static_cast<std::uint32_t>(c0 + i);
      words[static_cast<std::size_t>(2 * i)] = k << 9;
      words[static_cast<std::size_t>(2 * i + 1)] = ((k * 0x2545f5u) & 0x7fffffu) << 9;
    }
    box_muller_pairs(words.data(), kChunk, fast.data());
    for (std::int64_t i = 0; i < kChunk; ++i) {
      const auto w = static_cast<std::size_t>(2 * i);
      box_muller(words[w], words[w + 1], each[w], each[w + 1]);
    }
    if (first_mismatch(fast, each) != -1) ++mismatches;
  }
  CHECK(mismatches == 0);
}

namespace {

struct InputKind {
  TensorId tensor;
  InputPrecision precision;
  InputDistribution distribution;
};

// q, k, v in both precisions, under every input distribution.
std::vector<InputKind> all_input_kinds() {
  std::vector<InputKind> kinds;
  for (const auto& [dist, name] : kInputDistributionNames) {
    for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
      for (const InputPrecision prec : {InputPrecision::fp32, InputPrecision::bf16})
        kinds.push_back(InputKind{t, prec, dist});
    }
  }
  return kinds;
}

}  // namespace

TEST_CASE("a slice generated alone equals the same slice cut from the whole tensor") {
  Problem p;
  p.seq_len = 40;
  p.batch = 2;
  ThreadPool pool(2);
  for (const auto& [t, prec, dist] : all_input_kinds()) {
    CAPTURE(std::string(to_string(dist)));
    p.distribution = dist;
    const int heads = t == TensorId::q ? p.dims.num_q_heads : p.dims.num_kv_heads;
    const ShardShape whole{p.batch, Range{0, heads}, {Range{0, p.seq_len}}, p.dims.head_dim};
    const ShardShape slice{p.batch, Range{1, 3}, {Range{0, 9}, Range{30, 37}}, p.dims.head_dim};
    const Shard all = generate_shard(p, t, whole, prec, pool);
    const Shard part = generate_shard(p, t, slice, prec, pool);
    bool equal = true;
    for (int b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 1; h < 3; ++h) {
        for (std::int64_t pos : {0, 3, 5, 8, 30, 36}) {
          const float* x = all.at(b, h, whole.local_row(pos));
          const float* y = part.at(b, h, slice.local_row(pos));
          for (int d = 0; d < p.dims.head_dim; ++d) equal = equal && bits_of(x[d]) == bits_of(y[d]);
        }
      }
    }
    CHECK(equal);
  }
}

TEST_CASE(
    "sequences share the prompt: q, k, v rows before shared_prompt_len are sequence 0's; dO and "
    "the rows after it are their own") {
  Problem p;
  p.seq_len = 64;
  p.batch = 3;
  ThreadPool pool(2);
  // shortest = 64 - 2 * (64 / 12 + 1) = 52: a prompt of max(52 / 4, min(16, 52 / 3)) = 16
  // tokens; one sequence has none.
  REQUIRE(shared_prompt_len(p) == 16);
  Problem one = p;
  one.batch = 1;
  CHECK(shared_prompt_len(one) == 0);
  const auto same_row = [](const Shard& s, int b, std::int64_t pos) {
    return std::memcmp(s.at(b, 1, pos), s.at(0, 1, pos), s.shape.width * sizeof(float)) == 0;
  };
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out}) {
    CAPTURE(static_cast<int>(t));
    const ShardShape shape{p.batch, Range{0, 2}, {Range{0, p.seq_len}}, p.dims.head_dim};
    const Shard s = generate_shard(p, t, shape, InputPrecision::fp32, pool);
    const bool shared = t != TensorId::d_out;
    for (int b = 1; b < p.batch; ++b) {
      CHECK(same_row(s, b, 0) == shared);
      CHECK(same_row(s, b, 15) == shared);
      CHECK_FALSE(same_row(s, b, 16));  // the first token after the prompt: its own
      CHECK_FALSE(same_row(s, b, 63));
    }
  }
}

TEST_CASE("BF16 inputs are the BF16 rounding of the FP32 inputs (RoPE output cast)") {
  Problem p;
  p.seq_len = 16;
  ThreadPool pool(1);
  const ShardShape shape{1, Range{0, 8}, {Range{0, 16}}, p.dims.head_dim};
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const Shard f = generate_shard(p, t, shape, InputPrecision::fp32, pool);
    const Shard b = generate_shard(p, t, shape, InputPrecision::bf16, pool);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < f.data.size(); ++i) {
      if (bits_of(round_bf16(f.data[i])) != bits_of(b.data[i])) ++mismatches;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("RoPE: rotate-half against the FP64 closed form") {
  // FP64 closed form: angle = pos · theta^(-2i/D) exactly, y = x·cos - x'·sin. Our FP32 path
  // rounds inv_freq (≤ 2^-24 relative), the angle product (≤ 2^-24·|a|), sin/cos (≤ 1 ulp),
  // two products and one sum: |y - y64| ≤ (|x1| + |x2|)·((2|a| + 4)·2^-24).
  ModelDims dims;
  const std::vector<float> inv = rope_inv_freq(dims);
  REQUIRE(inv.size() == 64);
  CHECK(inv[0] == 1.0f);
  const int half = 64;
  std::vector<float> row(128), cs(half), sn(half);
  double worst_ratio = 0;
  for (std::int64_t pos : {0LL, 1LL, 2LL, 15LL, 100LL, 4095LL, 16383LL, 131071LL}) {
    for (int f = 0; f < half; ++f) rope_cos_sin(pos, inv[f], cs[f], sn[f]);
    for (int d = 0; d < 128; ++d) row[d] = normal_at(7, TensorId::q, pos * 128 + d);
    const std::vector<float> x = row;
    rope_rotate_row(row.data(), cs.data(), sn.data(), half);
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * std::pow(dims.rope.theta, -2.0 * i / 128.0);
      const double y1 = x[i] * std::cos(a) - x[i + half] * std::sin(a);
      const double y2 = x[i + half] * std::cos(a) + x[i] * std::sin(a);
      const double tol =
          (std::fabs(x[i]) + std::fabs(x[i + half])) * (2 * a + 4) * std::ldexp(1.0, -24);
      CHECK(std::fabs(row[i] - y1) <= tol);
      CHECK(std::fabs(row[i + half] - y2) <= tol);
      worst_ratio = std::max(worst_ratio, std::fabs(row[i] - y1) / tol);
    }
  }
  MESSAGE("RoPE worst error / bound: " << worst_ratio);
  // Position 0 is the identity rotation, exactly.
  for (int f = 0; f < half; ++f) rope_cos_sin(0, inv[f], cs[f], sn[f]);
  for (int f = 0; f < half; ++f) {
    CHECK(cs[f] == 1.0f);
    CHECK(sn[f] == 0.0f);
  }
}
