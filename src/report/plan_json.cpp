#include "report/plan_json.h"

namespace cpd {

using json::array_of;
using json::Object;
using json::Value;

Value rope_scaling_json(const RopeSpec& r) {
  if (r.scaling == RopeScaling::none) return nullptr;
  Object o{{"rope_type", to_string(r.scaling)}, {"factor", r.factor}};
  if (r.scaling == RopeScaling::llama3) {
    o["low_freq_factor"] = r.low_freq_factor;
    o["high_freq_factor"] = r.high_freq_factor;
    o["original_max_position_embeddings"] = r.original_context;
  }
  return o;
}

namespace {

Value pair(const Range& r) { return json::Array{r.begin, r.end}; }

const char* requested_policy(const CaseSpec& spec) { return spec.split ? "fixed" : "disabled"; }

// The executed blocks of CP owner `owner`, ascending.
std::vector<Range> owner_blocks(const std::vector<ExecutedBlock>& executed, int owner) {
  std::vector<Range> blocks;
  for (const ExecutedBlock& b : executed) {
    if (b.owner_cp_rank == owner) blocks.push_back(b.range);
  }
  return blocks;
}

// The split_kv_backend of the forward's plans.
std::string forward_split_backend(const CaseExecution& e) {
  return "cpdrift_" + e.backend + "_deterministic_block_grid";
}

Value split_plan_json(const Problem& p, const CaseSpec& spec, const std::string& split_kv_backend,
                      const std::vector<ExecutedBlock>& executed, int owner) {
  const std::vector<Range> owned = cp_owner_ranges(spec.layout, spec.cp, owner, p.seq_len);
  const std::vector<Range> blocks = owner_blocks(executed, owner);
  const SplitReading actual = read_split_plan(owned, blocks, spec.split);
  const bool as_requested =
      std::string(actual.policy) == requested_policy(spec) && actual.size == spec.split;
  return Object{
      {"owner_cp_rank", owner},
      {"owner_kv_ranges", ranges_json(owned)},
      {"requested_split_kv_policy", requested_policy(spec)},
      {"requested_split_kv_size", json::nullable(spec.split)},
      {"actual_split_kv_policy", actual.policy},
      {"actual_split_kv_size", json::nullable(actual.size)},
      {"actual_split_kv_count", blocks.size()},
      {"actual_split_boundaries", ranges_json(blocks)},
      {"split_kv_merge_order", "global_block_index"},
      {"split_kv_accum_dtype", "fp32"},
      {"split_kv_downcast_at", "final_write"},
      {"split_kv_backend", split_kv_backend},
      {"split_kv_plan_source", "executed_partial_states"},
      {"split_kv_fallback", !as_requested},
      {"split_kv_fallback_reason",
       as_requested ? Value(nullptr) : Value("the blocks that ran are not the requested plan")}};
}

Value rope_json(const Problem& p) {
  if (!p.rope) return Object{{"rope_state", "not_composed"}, {"fusion_boundary", "attention_only"}};
  // Per sequence, the position of its first query and key row: the generator rotates row s of
  // every sequence at position s (src/kernels/cpu/inputs.cpp), so each offset is 0.
  const Value offsets = json::Array(static_cast<std::size_t>(p.batch), Value(0));
  return Object{{"rope_state", "post_rope"},
                {"rope_theta", p.dims.rope.theta},
                {"rope_scaling", rope_scaling_json(p.dims.rope)},
                {"rotary_dim", p.dims.rotary_dim},
                {"rope_style", "gpt_neox_rotate_half"},
                {"position_ids", "arange(seq_len)"},
                {"cache_position", "same_as_position_ids"},
                {"query_position_offsets", offsets},
                {"key_position_offsets", offsets},
                {"k_cache_rope_state", "post_rope"},
                {"rope_cast_at", "rope_output"},
                {"rope_output_dtype", torch_dtype_name(p.dtype)},
                {"fusion_boundary", "unfused_rope_attention_reference"}};
}

}  // namespace

const char* torch_dtype_name(DType dtype) { return dtype == DType::bf16 ? "bfloat16" : "float32"; }

std::string backward_split_backend(const CaseExecution& e) {
  return "cpdrift_" + e.backend + "_deterministic_cp_backward";
}

Value ranges_json(const std::vector<Range>& ranges) { return array_of(ranges, pair); }

Value owner_plans_json(const Problem& p, const CaseSpec& spec, const std::string& backend,
                       const std::vector<ExecutedBlock>& executed) {
  Value plans = Value::array();
  for (int owner = 0; owner < spec.cp; ++owner)
    plans.push_back(split_plan_json(p, spec, backend, executed, owner));
  return plans;
}

Value plan_set_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e) {
  // A state message carries every sequence of the batch, so each batch index ran the plan of its
  // TP rank's query owners.
  json::Array plans;  // per (TP rank, owner)
  for (const std::vector<ExecutedBlock>& executed : e.merged_blocks) {
    const Value owners = owner_plans_json(p, spec, forward_split_backend(e), executed);
    plans.insert(plans.end(), owners.as_array().begin(), owners.as_array().end());
  }
  Value entries = Value::array();
  for (int b = 0; b < p.batch; ++b) {
    for (int t = 0; t < spec.tp; ++t) {
      for (int r = 0; r < spec.cp; ++r) {
        for (int owner = 0; owner < spec.cp; ++owner) {
          Value entry = plans[static_cast<std::size_t>(t * spec.cp + owner)];
          const std::vector<Range> owned = cp_owner_ranges(spec.layout, spec.cp, owner, p.seq_len);
          entry["batch_index"] = b;
          entry["tp_rank"] = t;
          entry["cp_rank"] = r;
          entry["expected_kv_range"] = owned.size() == 1 ? pair(owned.front()) : Value(nullptr);
          entry["expected_kv_ranges"] = ranges_json(owned);
          entries.push_back(std::move(entry));
        }
      }
    }
  }
  return Object{{"batch_size", p.batch},
                {"tp_world_size", spec.tp},
                {"cp_world_size", spec.cp},
                {"total_kv_tokens", json::Array(static_cast<std::size_t>(p.batch), p.seq_len)},
                {"entries", std::move(entries)},
                {"coverage", "complete_batch_tp_cp_owner_cartesian_product"}};
}

Value topology_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                    const Provenance& pv) {
  const LogicalRank first = logical_rank(spec, p, 0);
  // The CP ranks whose query owners merged states in this case, as the merged blocks say: how
  // many (the reference's count) and which.
  Value cp_ranks = Value::array();
  for (std::size_t r = 0; r < e.merged_block_indices.size(); ++r) {
    if (!e.merged_block_indices[r].empty()) cp_ranks.push_back(r);
  }
  std::vector<Range> q_bounds;
  for (int r = 0; r < spec.cp; ++r) {
    for (const Range& t : cp_owner_ranges(spec.layout, spec.cp, r, p.seq_len))
      q_bounds.push_back(t);
  }
  Value placement = Value::array();
  for (int id = 0; id < spec.num_logical_ranks(); ++id) {
    const LogicalRank lr = logical_rank(spec, p, id);
    placement.push_back(Object{{"logical_rank", id},
                               {"tp_rank", lr.tp_rank},
                               {"cp_rank", lr.cp_rank},
                               {"process", process_of(id, pv.world_size)}});
  }
  return Object{{"tp_world_size", spec.tp},
                {"cp_world_size", spec.cp},
                {"tp_rank", 0},
                {"logical_cp_ranks", cp_ranks.size()},
                {"logical_cp_rank_ids", std::move(cp_ranks)},
                {"local_num_query_heads", first.q_heads.size()},
                {"local_num_kv_heads", first.kv_heads.size()},
                {"local_query_head_range", pair(first.q_heads)},
                {"local_kv_head_range", pair(first.kv_heads)},
                {"head_dim", p.dims.head_dim},
                {"q_sequence_bounds", ranges_json(q_bounds)},
                {"kv_block_bounds", ranges_json(e.block_bounds)},
                {"layout", to_string(spec.layout)},
                {"protocol", to_string(spec.protocol)},
                {"transport", e.transport},
                {"physical_processes", e.processes_used},
                {"placement", std::move(placement)}};
}

Value case_provenance_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                           const Provenance& pv) {
  return Object{{"backend", "cpdrift_" + e.backend},
                {"reference_backend", "cp1_fp32_prefill"},
                {"candidate_backend", "cpdrift_" + e.backend + "_cp" + std::to_string(spec.cp) +
                                          "_" + (spec.split ? "chunked" : "prefill") + "_" +
                                          to_string(spec.protocol)},
                {"dtype", to_string(p.dtype)},
                {"accum_dtype", "fp32"},
                {"downcast_at", "final_write"},
                {"lse_domain", "attention"},
                {"merge_order", "global_block_index"},
                {"split_kv_policy", requested_policy(spec)},
                {"requested_split_kv_policy", requested_policy(spec)},
                {"requested_split_kv_size", json::nullable(spec.split)},
                {"actual_split_kv_plans",
                 owner_plans_json(p, spec, forward_split_backend(e), e.merged_blocks.front())},
                {"actual_split_kv_plan_set", plan_set_json(p, spec, e)},
                {"kv_chunk_size", json::nullable(spec.split)},
                {"block_metadata_hash", block_metadata_hash(e.block_bounds)},
                {"scale_placement", "scores_after_qk_matmul"},
                {"mask_application_order", json::Array{"scale", "causal_mask", "key_padding_mask"}},
                {"dropout_policy", "disabled"},
                {"deterministic_controls",
                 Object{{"fp_contract", "off"},
                        {"fma", "explicit"},
                        {"math_library", "cpdrift_fmath"},
                        {"reduction_order", "canonical_sequential (docs/numerics.md)"},
                        {"merge_order", "global_block_index"},
                        {"threads", pv.threads},
                        {"num_threads", pv.threads},
                        {"reference", "strict_fp32_math_inside_cp_attention"},
                        {"thread_count_affects_bits", false},
                        {"simd", pv.simd}}},
                {"rope", rope_json(p)}};
}

Value launch_json(const Provenance& pv) {
  return Object{{"command", pv.command},       {"rank", pv.rank},
                {"world_size", pv.world_size}, {"local_rank", pv.local_rank},
                {"launcher", pv.launcher},     {"torchrun", pv.torchrun}};
}

Value runtime_json(const Provenance& pv) {
  const auto unless_empty = [](const std::string& s) {
    return s.empty() ? Value(nullptr) : Value(s);
  };
  Object env(pv.rank_env.begin(), pv.rank_env.end());  // the launcher's variables, as set
  // The reference's rank fields, from MPI (the communicator the run used).
  env["rank"] = pv.rank;
  env["world_size"] = pv.world_size;
  env["local_rank"] = pv.local_rank;
  env["torchrun"] = pv.torchrun;
  return Object{
      {"device", pv.device},
      {"cuda_available", pv.cuda_available},
      {"distributed", Object{{"initialized", pv.world_size > 1},
                             {"backend", pv.world_size > 1 ? Value("mpi") : Value(nullptr)},
                             {"transport", pv.transport}}},
      {"rank_env", std::move(env)},
      {"platform", pv.platform},
      {"compiler", pv.compiler},
      {"mpi_version", pv.mpi_version},
      {"nccl_version", unless_empty(pv.nccl_version)},
      {"cuda_version", unless_empty(pv.cuda_version)},
      {"hdf5_version", unless_empty(pv.hdf5_version)},
      {"git_describe", pv.git_describe},
      {"threads", pv.threads},
      {"simd", pv.simd}};
}

}  // namespace cpd
