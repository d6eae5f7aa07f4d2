// --input-distribution: each distribution changes exactly the elements docs/input-distributions.md
// names, by exactly the documented amounts (restated here from the document, not read from
// input_shape.h), and does to attention what it is for (FP64 in the test).
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "cpdrift/bf16.h"
#include "kernels/cpu/inputs.h"

using namespace cpd;

namespace {

constexpr int kDim = 128;

// The documented sets, written out for D = 128.
bool sink_channel(int c) { return (c >= 56 && c < 64) || c >= 120; }
std::set<int> outlier_channels(int kv_head) {
  std::set<int> s;
  for (int j = 0; j < 4; ++j) s.insert((7 * kv_head + 32 * j + 3) % kDim);
  return s;
}

Shard make(const Problem& p, TensorId t, std::int64_t seq, ThreadPool& pool) {
  const ShardShape shape{p.batch, Range{0, heads_of(p.dims, t)}, {Range{0, seq}}, kDim};
  return generate_shard(p, t, shape, InputPrecision::fp32, pool);
}

}  // namespace

TEST_CASE("each distribution changes exactly the documented elements by the documented amount") {
  Problem base;
  base.seq_len = 24;
  base.batch = 2;
  base.rope = false;  // the shaping alone: RoPE is the same rotation for every distribution
  ThreadPool pool(2);
  for (const auto& [dist, name] : kInputDistributionNames) {
    CAPTURE(std::string(name));
    Problem p = base;
    p.distribution = dist;
    const bool sink = dist == InputDistribution::sink || dist == InputDistribution::mix;
    const bool outliers =
        dist == InputDistribution::outlier_channels || dist == InputDistribution::mix;
    for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v, TensorId::d_out}) {
      CAPTURE(static_cast<int>(t));
      const Shard g = make(base, t, base.seq_len, pool), s = make(p, t, base.seq_len, pool);
      std::size_t wrong = 0, changed = 0, expected_changes = 0;
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < heads_of(p.dims, t); ++h) {
          const int kv_head = t == TensorId::q ? h / 4 : h;
          for (std::int64_t pos = 0; pos < base.seq_len; ++pos) {
            const float* x = g.at(b, h, pos);
            const float* y = s.at(b, h, pos);
            for (int c = 0; c < kDim; ++c) {
              float want = x[c];
              if (outliers && t == TensorId::k && outlier_channels(kv_head).count(c)) want *= 8.0f;
              if (sink && sink_channel(c) && t == TensorId::q) want += 2.0f;
              if (sink && sink_channel(c) && t == TensorId::k && pos == 0) want += 4.25f;
              wrong += bits_of(want) != bits_of(y[c]);
              changed += bits_of(x[c]) != bits_of(y[c]);
              expected_changes += bits_of(x[c]) != bits_of(want);
            }
          }
        }
      }
      CHECK(wrong == 0);
      CHECK(changed == expected_changes);
      // Negative control of the comparison: shaped q and k do differ from the Gaussian ones.
      if (dist != InputDistribution::gaussian && (t == TensorId::q ? sink : t == TensorId::k))
        CHECK(changed > 0);
    }
  }
}

TEST_CASE("sink: the first key takes most of the attention; Gaussian keys share it evenly") {
  // FP64 softmax over the FP32 inputs with RoPE, every query head, queries at three positions.
  // The sink key scores ≈ 12 above the rest (the document's figure); the other n keys' scores
  // have variance ≈ 1.5, so its share is ≈ e^12 / (e^12 + n·e^0.75) ≥ 0.95 for n < 1024 (the
  // sink pairs turn by < 0.006 rad here); its own score has sd ≈ 1.9, so even the least of 96
  // shares stays above 0.5. mix: the outlier keys compete (their scores' variance is ≈ 3.5, the
  // sink's sd ≈ 2.4): a mean share ≈ 0.9, some queries look elsewhere. Gaussian keys: ≈ 1/n.
  constexpr std::int64_t kSeq = 1024;
  ThreadPool pool(2);
  const float scale = ModelDims{}.softmax_scale();
  for (const InputDistribution dist :
       {InputDistribution::sink, InputDistribution::mix, InputDistribution::gaussian}) {
    CAPTURE(std::string(to_string(dist)));
    Problem p;
    p.seq_len = kSeq;
    p.distribution = dist;
    const Shard q = make(p, TensorId::q, kSeq, pool), k = make(p, TensorId::k, kSeq, pool);
    double share_sum = 0, share_min = 1;
    int n = 0;
    for (int h = 0; h < p.dims.num_q_heads; ++h) {
      for (const std::int64_t pos : {std::int64_t{63}, std::int64_t{511}, kSeq - 1}) {
        std::vector<double> s(static_cast<std::size_t>(pos + 1));
        double top = -1e300;
        for (std::int64_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int c = 0; c < kDim; ++c) dot += double{q.at(0, h, pos)[c]} * k.at(0, h / 4, j)[c];
          s[static_cast<std::size_t>(j)] = dot * scale;
          top = std::max(top, s[static_cast<std::size_t>(j)]);
        }
        double total = 0;
        for (double& v : s) total += v = std::exp(v - top);
        const double share = s[0] / total;
        share_sum += share;
        share_min = std::min(share_min, share);
        ++n;
      }
    }
    const double mean = share_sum / n;
    MESSAGE(std::string(to_string(dist)), ": first key's mean share ", mean, ", least ", share_min);
    if (dist == InputDistribution::gaussian) {
      CHECK(mean < 0.05);
    } else if (dist == InputDistribution::sink) {
      CHECK(mean > 0.9);
      CHECK(share_min > 0.5);
    } else {
      CHECK(mean > 0.75);
    }
  }
}

TEST_CASE("outlier_channels: four key channels per KV head 8x larger, RoPE keeps them apart") {
  // Each outlier channel's RoPE partner (c ± 64) is an outlier channel too, so the rotation
  // keeps their RMS at 8 and the others' at 1. Over 2048 values (512 rows, 4 channels) an RMS
  // estimate has relative sd ≈ 1/sqrt(2·2048) ≈ 1.6%: 10% bounds fail only for a wrong channel
  // or factor.
  Problem p;
  p.seq_len = 512;
  p.batch = 1;
  p.distribution = InputDistribution::outlier_channels;
  ThreadPool pool(2);
  const Shard k = make(p, TensorId::k, p.seq_len, pool);
  for (int g = 0; g < p.dims.num_kv_heads; ++g) {
    CAPTURE(g);
    const std::set<int> outliers = outlier_channels(g);
    REQUIRE(outliers.size() == 4);
    double big = 0, small = 0;
    for (std::int64_t pos = 0; pos < p.seq_len; ++pos) {
      for (int c = 0; c < kDim; ++c) {
        const double x = k.at(0, g, pos)[c];
        (outliers.count(c) ? big : small) += x * x;
      }
    }
    const double rms_big = std::sqrt(big / (4.0 * p.seq_len));
    const double rms_small = std::sqrt(small / (124.0 * p.seq_len));
    CHECK(rms_big == doctest::Approx(8.0).epsilon(0.1));
    CHECK(rms_small == doctest::Approx(1.0).epsilon(0.1));
  }
}
