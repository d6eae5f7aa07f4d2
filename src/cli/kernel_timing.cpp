#include "cli/kernel_timing.h"

#include <algorithm>

#include "cpdrift/attention_backward_math.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_backward.h"

namespace cpd::kernel_timing {

Inputs make_inputs(const Problem& p, InputPrecision precision, ThreadPool& pool) {
  const Range all{0, p.seq_len};
  const ShardShape qs{p.batch, Range{0, p.dims.num_q_heads}, {all}, p.dims.head_dim};
  const ShardShape kvs{p.batch, Range{0, p.dims.num_kv_heads}, {all}, p.dims.head_dim};
  return Inputs{generate_shard(p, TensorId::q, qs, precision, pool),
                generate_shard(p, TensorId::k, kvs, precision, pool),
                generate_shard(p, TensorId::v, kvs, precision, pool)};
}

std::vector<double> time_forward(const Problem& p, const Inputs& in, ProbRounding rounding,
                                 int repeats, ThreadPool& pool, AttnShard& out,
                                 const PagedKvCache* cache) {
  const int group = p.dims.group_size();
  const std::vector<Range> grid{Range{0, p.seq_len}};
  return times_of(repeats, [&] {
    out = AttnShard{Shard(in.q.shape),
                    Shard(ShardShape{p.batch, in.q.shape.heads, in.q.shape.tokens, 1})};
    std::vector<FoldJob> jobs;
    for (int b = 0; b < p.batch; ++b) {
      for (int h = 0; h < p.dims.num_q_heads; ++h) {
        const auto [k, v] = cache != nullptr ? cache->rows(b, h / group)
                                             : std::pair<KvRows, KvRows>{in.k.at(b, h / group, 0),
                                                                         in.v.at(b, h / group, 0)};
        jobs.push_back(FoldJob{in.q.at(b, h, 0), 0, p.seq_len, k, v, 0, grid, out.out.at(b, h, 0),
                               out.lse.at(b, h, 0)});
      }
    }
    const auto t = Clock::now();
    run_fold_jobs(jobs, p.dims.head_dim, p.dims.softmax_scale(), rounding, pool);
    return seconds_since(t);
  });
}

// dO and Δ are prepared once, outside the times.
std::vector<double> time_backward(const Problem& p, const Inputs& in, const AttnShard& fwd,
                                  int repeats, ThreadPool& pool) {
  const int dim = p.dims.head_dim, group = p.dims.group_size();
  const Range all{0, p.seq_len};
  const Shard d_out = generate_shard(p, TensorId::d_out, in.q.shape, InputPrecision::fp32, pool);
  Shard delta(fwd.lse.shape), dq(in.q.shape);
  for (std::size_t r = 0; r < delta.data.size(); ++r) {
    delta.data[r] = backward_delta(d_out.data.data() + r * dim, fwd.out.data.data() + r * dim, dim);
  }
  std::vector<std::vector<float>> totals;
  std::vector<BackwardUnit> units;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.dims.num_q_heads; ++h) {
      totals.emplace_back(static_cast<std::size_t>(p.seq_len) * dim);
      totals.emplace_back(static_cast<std::size_t>(p.seq_len) * dim);
      BackwardUnit u;
      u.blocks.push_back(QueryBlockRows{all, in.q.at(b, h, 0), d_out.at(b, h, 0),
                                        fwd.lse.at(b, h, 0), delta.at(b, h, 0), dq.at(b, h, 0)});
      u.k = in.k.at(b, h / group, 0);
      u.v = in.v.at(b, h / group, 0);
      u.keys = all;
      u.dk_total = totals[totals.size() - 2].data();
      u.dv_total = totals.back().data();
      units.push_back(std::move(u));
    }
  }
  return times_of(repeats, [&] {
    const auto t = Clock::now();
    run_backward_units(units, dim, p.dims.softmax_scale(), pool);
    return seconds_since(t);
  });
}

double forward_flops(const Problem& p) {
  return 2.0 * 2.0 * p.batch * p.dims.num_q_heads * p.dims.head_dim *
         static_cast<double>(p.seq_len) * static_cast<double>(p.seq_len) / 2.0;
}

}  // namespace cpd::kernel_timing
