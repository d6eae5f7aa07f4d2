// The lanes one split plan computes on this process (its KV heads), shared by the plan's
// decode and paged-prefill cases.
#pragma once

#include <map>
#include <vector>

#include "cpdrift/engine/case_runner.h"
#include "cpdrift/paged/paged_attention.h"
#include "cpdrift/paged/paged_case.h"

namespace cpd::paged {

/// Candidate vs reference row blocks of one comparison.
struct Pairs {
  std::vector<DiffPart> out, lse;
  /// `rows` rows of query head h: sequence cs from row crow of `c` against sequence rs from
  /// row rrow of `r`.
  void add(const AttnShard& c, int cs, std::int64_t crow, const AttnShard& r, int rs,
           std::int64_t rrow, std::int64_t h, std::int64_t rows) {
    const auto dim = static_cast<std::size_t>(c.out.shape.width);
    out.push_back(DiffPart{c.out.at(cs, h, crow), r.out.at(rs, h, rrow),
                           static_cast<std::size_t>(rows) * dim});
    lse.push_back(
        DiffPart{c.lse.at(cs, h, crow), r.lse.at(rs, h, rrow), static_cast<std::size_t>(rows)});
  }
};

struct PlanLanes {
  Range heads;  // this process's KV heads (empty: it computes nothing)
  PageTable main_table;
  // The case dtype's arithmetic (BF16 inputs and P under --dtype bf16) on the main cache.
  AttnShard decode, paged_prefill, full_prefill;
  AttnShard chunked;  // the same query rows from contiguous K/V, no cache
  // FP32 arithmetic, split disabled, contiguous: on the candidate's inputs, and on FP32 inputs.
  AttnShard reference, reference_fp32;
  // Per mode: the rows again on other layouts, alone, and in FP32.
  std::map<PagedMode, AttnShard> permuted, private_prefix, fp32;
  std::map<PagedMode, std::vector<AttnShard>> alone;  // per sequence

  const AttnShard& mode_rows(PagedMode m) const {
    return m == PagedMode::decode ? decode : paged_prefill;
  }
};

/// KV heads [begin, end) process `rank` of `world` computes: contiguous, as even as can be.
Range kv_heads_of(const Problem& p, int world, int rank);

PlanLanes compute_plan_lanes(const RunContext& ctx, const PagedWorkload& w, const SplitKv& split);

}  // namespace cpd::paged
