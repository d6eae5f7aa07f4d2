// A paged (rollout-side) case end to end: decode or paged prefill through the paged KV cache
// with a split-KV plan, against the FP32 full-logical-KV reference, plus the bitwise
// invariances that make rollout logprobs equal training logprobs (design §1, §7).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "engine/case_outputs.h"
#include "engine/paged/paged_workload.h"
#include "engine/paged/split_plan.h"

namespace cpd {

struct RunContext;
class CaseSink;

enum class PagedMode { paged_prefill, decode };
const char* to_string(PagedMode);

struct PagedCaseSpec {
  PagedMode mode = PagedMode::decode;
  SplitKv split;
  /// The rollout engine's tensor parallelism: TP rank t owns KV heads [t·Hkv/TP, (t+1)·Hkv/TP)
  /// and their query heads, computed by the processes paged_kv_heads gives it. The paged
  /// kernels and the logit fold work per head, so TP moves work, never a bit.
  int tp = 1;
};

/// {model}_tp{TP}_{paged_prefill|decode}_split_kv_{disabled|fixed{c}|auto}_{dtype}.
std::string paged_case_name(const PagedCaseSpec& spec, const Problem& problem);

/// A case's invariances must hold bitwise, except under the auto policy (a diagnostic).
inline bool invariances_required(const PagedCaseSpec& spec) {
  return spec.split.policy != SplitPolicy::auto_select;
}

/// One bitwise invariance: a lane's FP32-merged rows against the same rows computed another way.
struct InvarianceCheck {
  std::string name;      // batch_composition, page_layout, prefix_cache, decode_vs_prefill, …
  std::string compares;  // the two computations, in words
  bool applicable = true;
  std::string reason;  // why not applicable
  OutLseComparison rows;
};

/// What a paged case is and how it ran: what its outputs and its figures both say.
struct PagedCaseFacts {
  PagedCaseSpec spec;
  std::string name;
  PagedWorkload workload;
  int physical_pages = 0;
  std::string block_tables_digest;
  std::vector<std::vector<Range>> plans;  // per sequence, as the candidate lane ran it
  int vocab_size = 0;
  int processes_used = 1;
};

/// What one paged case computed on this process (the counterpart of CaseOutputs).
struct PagedCaseOutputs : PagedCaseFacts {
  PagedCaseOutputs() = default;
  PagedCaseOutputs(const PagedCaseOutputs&) = delete;
  PagedCaseOutputs& operator=(const PagedCaseOutputs&) = delete;

  std::vector<CaseTensor> tensors;  // in publication order
  OutLseComparison candidate;  // the rollout lane as written vs FP32 arithmetic on the same inputs
  OutLseComparison fp32;       // the FP32 lane vs the FP32 reference: split and merge alone
  Comparison dlogp;            // target-token logprobs of the candidate vs the reference cast alike
  std::vector<TokenPair> dlogp_tokens;  // the same tokens for the RL metrics (rank 0)
  /// --scope layer: the layer's output of the candidate vs of the reference cast alike (rank 0)
  std::optional<Comparison> layer;
  /// --scope layer: the candidate's layer output through the rollout's TP-reduction lanes
  /// (kRolloutTpLanes' order) vs the reference's and vs the canonical one (rank 0)
  std::vector<TpLaneComparisons> layer_tp_lanes;
  std::vector<InvarianceCheck> invariances;
  std::chrono::steady_clock::time_point started;
  HeldTensors held;
};

struct PagedOptions {
  int page_size = 16;
  std::optional<std::int64_t> q_len;
  int vocab_size = 4096;
  bool progress = false;  // rank 0 says on stderr when each plan's lanes start and end
};

/// Runs the paged cases and hands each to `sink.paged_case`; the lanes of one split plan are
/// computed once for all its modes. Work is spread over the processes by KV head. Collective.
void run_paged_cases(const RunContext& ctx, const PagedOptions& options,
                     const std::vector<PagedCaseSpec>& specs, CaseSink& sink);

}  // namespace cpd
