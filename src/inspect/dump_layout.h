// What a cpdrift dump holds (docs/inspect.md, written by report/run_recorder.cpp and
// cli/run_command.cpp), as checks over what the reader found: each throws InspectError naming
// the file and the attribute or dataset that is missing or wrong.
#pragma once

#include <cstdint>
#include <string>

#include "inspect/dump_reader.h"

namespace cpd::inspect::layout {

/// The root's attributes: schema_version (this tool's schema), batch, seq_len, num_query_heads,
/// num_kv_heads, head_dim, seed, dtype; producer, created_at_utc, command and hidden_size when
/// present.
DumpProblem read_problem(const DumpAttributes& root, const std::string& file);

/// A prefill case group's attributes: tp_world_size, cp_world_size, split (an integer or
/// "none"), layout, protocol — a case that can run on `problem` (core/plan.h validate_case).
CaseSpec read_case_spec(const DumpAttributes& attributes, const Problem& problem,
                        const std::string& file, const std::string& group);

/// A paged case group's q_len (the query rows of each sequence in its tensors).
std::int64_t paged_q_len(const DumpAttributes& attributes, const std::string& file,
                         const std::string& group);

/// A tensor's attributes (shape, original_dtype, stored_dtype, heads) and extents against the
/// problem: [B, H, S(, D)] with H the query heads, KV heads or 1 as `heads` says, S the
/// sequence (q_len in paged cases); the layer's by their shape attribute ([B, 1, S, hidden],
/// [B, S, hidden], the weight gradients'), against the root's hidden_size. Sets `t.bf16`.
void check_tensor(TensorInfo& t, const Problem& problem, bool paged, std::int64_t q_len,
                  const std::string& file);

/// The bytes a tensor's values take (4 per element); refuses extents whose product overflows.
std::uint64_t tensor_bytes(const TensorInfo& t, const std::string& file);

}  // namespace cpd::inspect::layout
