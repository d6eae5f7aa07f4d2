// The training side (design §3): the FP32 attention backward of a case from its saved
// forward, distributed on the global block grid, and the CP=1 reference it is measured against.
#pragma once

#include <map>
#include <tuple>
#include <vector>

#include "cpdrift/engine/local_cp1.h"
#include "cpdrift/engine/protocol.h"

namespace cpd {

/// Gradients of one logical rank hosted here.
struct RankGradients {
  LogicalRank rank;
  Shard dq;                                // [B][its query heads][its tokens][D]
  Shard dk, dv;                            // [B][its KV heads][its tokens][D]
  std::vector<MessageHeader> dq_partials;  // the partial dq folded into dq, as validated
};

/// The FP32 backward from the saved forward (`forward`: the FP32 path's merged out and lse),
/// dO generated like the inputs. Data moves ag_rs-style whatever the forward protocol: query
/// owners send (q, dO, lse, Δ) of their ranges to the owners of the KV blocks those ranges
/// see; KV owners compute every block pair, fold dK/dV over the query blocks and then the GQA
/// group, and send each partial dq back, where it is folded in block order. Every message is
/// checked against the manifest. Collective over the transport's processes.
std::vector<RankGradients> run_backward(const CaseGrid& grid,
                                        const std::vector<RankOutput>& forward,
                                        Transport& transport, InputStore& inputs);

/// The CP=1 reference backward (`cp1_backward_reference`: one block [0, S), from the CP=1 FP32
/// forward) computed locally, memoised like LocalCp1Results.
class LocalCp1Backward {
 public:
  /// dq of `q_rows` (query heads, tokens) and dk/dv of `kv_rows` (the matching KV heads).
  struct Result {
    Shard dq, dk, dv;
  };
  Result get(InputStore& inputs, LocalCp1Results& forward, const ShardShape& q_rows,
             const ShardShape& kv_rows);

 private:
  // Gradients of a head range for rows [first, S) (dq) and keys [first, S) (dk, dv).
  struct Entry {
    Range q_heads;
    std::int64_t first = 0;
    Shard dq, dk, dv;  // tokens {[first, S)}
  };
  std::vector<Entry> entries_;
};

}  // namespace cpd
