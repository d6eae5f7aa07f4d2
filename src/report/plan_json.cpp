#include "report/plan_json.h"

namespace cpd {

using json::Value;

namespace {

Value pair(std::int64_t a, std::int64_t b) {
  Value v = Value::array();
  v.push_back(a);
  v.push_back(b);
  return v;
}

const char* requested_policy(const CaseSpec& spec) { return spec.split ? "fixed" : "disabled"; }

Value optional_size(std::optional<std::int64_t> size) {
  return size ? Value(*size) : Value(nullptr);
}

// The executed blocks of CP owner `owner`, ascending.
std::vector<Range> owner_blocks(const std::vector<ExecutedBlock>& executed, int owner) {
  std::vector<Range> blocks;
  for (const ExecutedBlock& b : executed) {
    if (b.owner_cp_rank == owner) blocks.push_back(b.range);
  }
  return blocks;
}

Value rope_json(const Problem& p) {
  Value v = Value::object();
  if (!p.rope) {
    v["rope_state"] = "not_composed";
    v["fusion_boundary"] = "attention_only";
    return v;
  }
  v["rope_state"] = "post_rope";
  v["rope_theta"] = p.dims.rope_theta;
  v["rope_scaling"] = nullptr;
  v["rotary_dim"] = p.dims.rotary_dim;
  v["rope_style"] = "gpt_neox_rotate_half";
  v["position_ids"] = "arange(seq_len)";
  v["cache_position"] = "same_as_position_ids";
  // Per sequence, the position of its first query and key row: the generator rotates row s of
  // every sequence at position s (src/kernels/cpu/inputs.cpp), so each offset is 0.
  Value offsets = Value::array();
  for (int b = 0; b < p.batch; ++b) offsets.push_back(0);
  v["query_position_offsets"] = offsets;
  v["key_position_offsets"] = std::move(offsets);
  v["k_cache_rope_state"] = "post_rope";
  v["rope_cast_at"] = "rope_output";
  v["rope_output_dtype"] = torch_dtype_name(p.dtype);
  v["fusion_boundary"] = "unfused_rope_attention_reference";
  return v;
}

}  // namespace

const char* torch_dtype_name(DType dtype) { return dtype == DType::bf16 ? "bfloat16" : "float32"; }

std::string forward_split_backend(const CaseExecution& e) {
  return "cpdrift_" + e.backend + "_deterministic_block_grid";
}

std::string backward_split_backend(const CaseExecution& e) {
  return "cpdrift_" + e.backend + "_deterministic_cp_backward";
}

Value ranges_json(const std::vector<Range>& ranges) {
  Value v = Value::array();
  for (const Range& r : ranges) v.push_back(pair(r.begin, r.end));
  return v;
}

Value split_plan_json(const Problem& p, const CaseSpec& spec, const std::string& split_kv_backend,
                      const std::vector<ExecutedBlock>& executed, int owner) {
  const std::vector<Range> owned = cp_owner_ranges(spec.layout, spec.cp, owner, p.seq_len);
  const std::vector<Range> blocks = owner_blocks(executed, owner);
  const SplitReading actual = read_split_plan(owned, blocks, spec.split);
  const bool as_requested =
      std::string(actual.policy) == requested_policy(spec) && actual.size == spec.split;
  Value v = Value::object();
  v["owner_cp_rank"] = owner;
  v["owner_kv_ranges"] = ranges_json(owned);
  v["requested_split_kv_policy"] = requested_policy(spec);
  v["requested_split_kv_size"] = optional_size(spec.split);
  v["actual_split_kv_policy"] = actual.policy;
  v["actual_split_kv_size"] = optional_size(actual.size);
  v["actual_split_kv_count"] = blocks.size();
  v["actual_split_boundaries"] = ranges_json(blocks);
  v["split_kv_merge_order"] = "global_block_index";
  v["split_kv_accum_dtype"] = "fp32";
  v["split_kv_downcast_at"] = "final_write";
  v["split_kv_backend"] = split_kv_backend;
  v["split_kv_plan_source"] = "executed_partial_states";
  v["split_kv_fallback"] = !as_requested;
  v["split_kv_fallback_reason"] =
      as_requested ? Value(nullptr) : Value("the blocks that ran are not the requested plan");
  return v;
}

Value plan_set_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e) {
  Value v = Value::object();
  v["batch_size"] = p.batch;
  v["tp_world_size"] = spec.tp;
  v["cp_world_size"] = spec.cp;
  Value totals = Value::array();
  for (int b = 0; b < p.batch; ++b) totals.push_back(p.seq_len);
  v["total_kv_tokens"] = std::move(totals);
  Value entries = Value::array();
  // A state message carries every sequence of the batch, so each batch index ran the plan of its
  // TP rank's query owners.
  std::vector<Value> plans;  // per (TP rank, owner)
  for (const std::vector<ExecutedBlock>& executed : e.merged_blocks) {
    for (int owner = 0; owner < spec.cp; ++owner)
      plans.push_back(split_plan_json(p, spec, forward_split_backend(e), executed, owner));
  }
  for (int b = 0; b < p.batch; ++b) {
    for (int t = 0; t < spec.tp; ++t) {
      for (int r = 0; r < spec.cp; ++r) {
        for (int owner = 0; owner < spec.cp; ++owner) {
          Value entry = plans[static_cast<std::size_t>(t * spec.cp + owner)];
          const std::vector<Range> owned = cp_owner_ranges(spec.layout, spec.cp, owner, p.seq_len);
          entry["batch_index"] = b;
          entry["tp_rank"] = t;
          entry["cp_rank"] = r;
          entry["expected_kv_range"] =
              owned.size() == 1 ? pair(owned.front().begin, owned.front().end) : Value(nullptr);
          entry["expected_kv_ranges"] = ranges_json(owned);
          entries.push_back(std::move(entry));
        }
      }
    }
  }
  v["entries"] = std::move(entries);
  v["coverage"] = "complete_batch_tp_cp_owner_cartesian_product";
  return v;
}

Value topology_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                    const Provenance& pv) {
  const LogicalRank first = logical_rank(spec, p, 0);
  Value v = Value::object();
  v["tp_world_size"] = spec.tp;
  v["cp_world_size"] = spec.cp;
  v["tp_rank"] = 0;
  // The CP ranks whose query owners merged states in this case, as the merged blocks say: how
  // many (the reference's count) and which.
  Value cp_ranks = Value::array();
  for (std::size_t r = 0; r < e.merged_block_indices.size(); ++r) {
    if (!e.merged_block_indices[r].empty()) cp_ranks.push_back(r);
  }
  v["logical_cp_ranks"] = cp_ranks.size();
  v["logical_cp_rank_ids"] = std::move(cp_ranks);
  v["local_num_query_heads"] = first.q_heads.size();
  v["local_num_kv_heads"] = first.kv_heads.size();
  v["local_query_head_range"] = pair(first.q_heads.begin, first.q_heads.end);
  v["local_kv_head_range"] = pair(first.kv_heads.begin, first.kv_heads.end);
  v["head_dim"] = p.dims.head_dim;
  std::vector<Range> q_bounds;
  for (int r = 0; r < spec.cp; ++r) {
    for (const Range& t : cp_owner_ranges(spec.layout, spec.cp, r, p.seq_len))
      q_bounds.push_back(t);
  }
  v["q_sequence_bounds"] = ranges_json(q_bounds);
  v["kv_block_bounds"] = ranges_json(e.block_bounds);
  v["layout"] = to_string(spec.layout);
  v["protocol"] = to_string(spec.protocol);
  v["transport"] = e.transport;
  v["physical_processes"] = e.processes_used;
  Value placement = Value::array();
  for (int id = 0; id < spec.num_logical_ranks(); ++id) {
    const LogicalRank lr = logical_rank(spec, p, id);
    Value where = Value::object();
    where["logical_rank"] = id;
    where["tp_rank"] = lr.tp_rank;
    where["cp_rank"] = lr.cp_rank;
    where["process"] = process_of(id, pv.world_size);
    placement.push_back(std::move(where));
  }
  v["placement"] = std::move(placement);
  return v;
}

Value case_provenance_json(const Problem& p, const CaseSpec& spec, const CaseExecution& e,
                           const Provenance& pv) {
  Value v = Value::object();
  v["backend"] = "cpdrift_" + e.backend;
  v["reference_backend"] = "cp1_fp32_prefill";
  v["candidate_backend"] = "cpdrift_" + e.backend + "_cp" + std::to_string(spec.cp) + "_" +
                           (spec.split ? "chunked" : "prefill") + "_" + to_string(spec.protocol);
  v["dtype"] = to_string(p.dtype);
  v["accum_dtype"] = "fp32";
  v["downcast_at"] = "final_write";
  v["lse_domain"] = "attention";
  v["merge_order"] = "global_block_index";
  v["split_kv_policy"] = requested_policy(spec);
  v["requested_split_kv_policy"] = requested_policy(spec);
  v["requested_split_kv_size"] = optional_size(spec.split);
  Value plans = Value::array();
  for (int owner = 0; owner < spec.cp; ++owner)
    plans.push_back(
        split_plan_json(p, spec, forward_split_backend(e), e.merged_blocks.front(), owner));
  v["actual_split_kv_plans"] = std::move(plans);
  v["actual_split_kv_plan_set"] = plan_set_json(p, spec, e);
  v["kv_chunk_size"] = optional_size(spec.split);
  v["block_metadata_hash"] = block_metadata_hash(e.block_bounds);
  v["scale_placement"] = "scores_after_qk_matmul";
  Value order = Value::array();
  for (const char* s : {"scale", "causal_mask", "key_padding_mask"}) order.push_back(s);
  v["mask_application_order"] = std::move(order);
  v["dropout_policy"] = "disabled";
  Value controls = Value::object();
  controls["fp_contract"] = "off";
  controls["fma"] = "explicit";
  controls["math_library"] = "cpdrift_fmath";
  controls["reduction_order"] = "canonical_sequential (docs/numerics.md)";
  controls["merge_order"] = "global_block_index";
  controls["threads"] = pv.threads;
  controls["num_threads"] = pv.threads;
  controls["reference"] = "strict_fp32_math_inside_cp_attention";
  controls["thread_count_affects_bits"] = false;
  controls["simd"] = pv.simd;
  v["deterministic_controls"] = std::move(controls);
  v["rope"] = rope_json(p);
  return v;
}

Value launch_json(const Provenance& pv) {
  Value v = Value::object();
  v["command"] = pv.command;
  v["rank"] = pv.rank;
  v["world_size"] = pv.world_size;
  v["local_rank"] = pv.local_rank;
  v["launcher"] = pv.launcher;
  v["torchrun"] = pv.torchrun;
  return v;
}

Value runtime_json(const Provenance& pv) {
  Value v = Value::object();
  v["device"] = pv.device;
  v["cuda_available"] = pv.cuda_available;
  Value dist = Value::object();
  dist["initialized"] = pv.world_size > 1;
  dist["backend"] = pv.world_size > 1 ? Value("mpi") : Value(nullptr);
  dist["transport"] = pv.transport;
  v["distributed"] = std::move(dist);
  Value env = Value::object();
  for (const auto& [k, val] : pv.rank_env) env[k] = val;  // the launcher's variables, as set
  // The reference's rank fields, from MPI (the communicator the run used).
  env["rank"] = pv.rank;
  env["world_size"] = pv.world_size;
  env["local_rank"] = pv.local_rank;
  env["torchrun"] = pv.torchrun;
  v["rank_env"] = std::move(env);
  v["platform"] = pv.platform;
  v["compiler"] = pv.compiler;
  v["mpi_version"] = pv.mpi_version;
  v["nccl_version"] = pv.nccl_version.empty() ? Value(nullptr) : Value(pv.nccl_version);
  v["cuda_version"] = pv.cuda_version.empty() ? Value(nullptr) : Value(pv.cuda_version);
  v["hdf5_version"] = pv.hdf5_version.empty() ? Value(nullptr) : Value(pv.hdf5_version);
  v["git_describe"] = pv.git_describe;
  v["threads"] = pv.threads;
  v["simd"] = pv.simd;
  return v;
}

}  // namespace cpd
