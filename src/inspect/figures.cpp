#include "inspect/figures.h"

#include <algorithm>
#include <cstdint>

#include "cpdrift/production_lanes.h"
#include "cpdrift/tp_lanes.h"
#include "metrics/digest.h"

namespace cpd::inspect {
namespace {

std::string topology_counterpart(const DumpFile& dump, const CaseInfo& c) {
  return case_name(cp1_counterpart(c.spec), dump.problem().problem);
}

// The layer's reduction lanes (numerics.md §12): each lane's tensor against the reference's, with
// the lane's digest; `add` as report_figures' (name, candidate in the case, reference, digest,
// tokens, BF16 candidate).
template <class Add>
void add_lane_figures(const DumpFile& dump, const std::string& base, const Add& add) {
  for (const TpLane lane : {TpLane::megatron_ar, TpLane::megatron_sp, TpLane::megatron_grad_fp32,
                            TpLane::megatron_grad_bf16}) {
    const std::string name = to_string(lane), prefix = "layer.tp_lanes." + name + ".";
    add(prefix + "out", "layer/tp_lanes/" + name, base + "layer/reference/out", true, std::nullopt,
        false);
    for (const std::string g :
         {"dx", "q_proj", "k_proj", "v_proj", "o_proj", "q_bias", "k_bias", "v_bias"}) {
      const std::string at = "layer_backward/tp_lanes/" + name + "/" + g;
      const TensorInfo* t = dump.find(base + at);
      add(prefix + g, at, base + "layer_backward/reference/" + g, true, std::nullopt,
          t != nullptr && t->bf16);
    }
  }
}

}  // namespace

std::vector<FigureSpec> report_figures(const DumpFile& dump, const CaseInfo& c) {
  const Problem& p = dump.problem().problem;
  const std::string base = (c.paged ? "/paged_cases/" : "/cases/") + c.name + "/";
  std::vector<FigureSpec> specs;
  // `name`: this case's `candidate` (a path within it) against the dataset `reference`, when the
  // dump holds both.
  const auto add = [&](const std::string& name, const std::string& candidate,
                       const std::string& reference, bool digest,
                       std::optional<std::vector<Range>> tokens = std::nullopt,
                       bool bf16_candidate = false) {
    if (dump.find(base + candidate) == nullptr || dump.find(reference) == nullptr) return;
    specs.push_back(
        FigureSpec{name, base + candidate, reference, bf16_candidate, std::move(tokens), digest});
  };
  // <prefix>.out and <prefix>.lse: <leg>/{out,lse} against <reference leg>/{out,lse}.
  const auto out_lse = [&](const std::string& prefix, const std::string& leg,
                           const std::string& reference, bool digest = true,
                           const std::optional<std::vector<Range>>& tokens = std::nullopt) {
    for (const std::string t : {"out", "lse"})
      add(prefix + "." + t, leg + "/" + t, base + reference + "/" + t, digest, tokens);
  };
  if (c.paged) {
    // The candidate against the FP32-arithmetic reference before its BF16 write: dumped beside
    // the BF16 one under --dtype bf16; the same tensor under fp32.
    const TensorInfo* reference_out = dump.find(base + "reference/out");
    const bool written_bf16 = reference_out == nullptr || reference_out->bf16;
    add("paged.drift.candidate.out", "candidate/out",
        base + (written_bf16 ? "reference_fp32_arithmetic/out" : "reference/out"), true);
    add("paged.drift.candidate.lse", "candidate/lse", base + "reference/lse", true);
    return specs;
  }
  const std::string dtype_leg = p.dtype == DType::bf16 ? "candidate_bf16" : "candidate_fp32";
  out_lse("drift.cp_merge_fp32", "candidate_fp32", "reference_fp32");
  out_lse("drift.dtype_path_vs_fp32", dtype_leg, "reference_fp32");
  out_lse("drift.bf16_kernel", "bf16_kernel", "reference_fp32");
  out_lse("drift.cublas_unfused", "cublas_unfused", "reference_fp32");
  // vs the CP=1 case with the same split and layout, when the run had it.
  const std::string counterpart = "/cases/" + topology_counterpart(dump, c) + "/candidate_fp32/";
  for (const std::string t : {"out", "lse"})
    add("drift.topology_invariance." + t, "candidate_fp32/" + t, counterpart + t, true);
  for (const ProductionLane lane : kProductionLanes) {
    const std::string name = to_string(lane);
    out_lse("drift.production_lanes." + name + ".vs_fp32_reference", name, "reference_fp32");
    out_lse("drift.production_lanes." + name + ".vs_canonical_bf16_kernel", name, "bf16_kernel");
  }
  out_lse("cuda_vs_cpu_fp32", "cpu_fp32", "candidate_fp32");
  const auto rank_tokens = [&](int r) {
    return cp_owner_ranges(c.spec.layout, c.spec.cp, r, p.seq_len);
  };
  for (int r = 0; r < c.spec.cp; ++r) {
    const std::string row = "per_rank[" + std::to_string(r) + "]";
    out_lse(row, dtype_leg, "reference_fp32", false, rank_tokens(r));
    out_lse(row + ".cp_merge_fp32", "candidate_fp32", "reference_fp32", false, rank_tokens(r));
  }
  // <prefix>{dq,dk,dv}: the case's gradients against the CP=1 reference's.
  const std::string backward = "backward.report.drifts[0].";
  const auto gradients = [&](const std::string& prefix, bool digest,
                             const std::optional<std::vector<Range>>& tokens, bool bf16) {
    for (const std::string g : {"dq", "dk", "dv"})
      add(prefix + g, "candidate_fp32/" + g, base + "reference_fp32/" + g, digest, tokens, bf16);
  };
  gradients(backward, true, std::nullopt, false);
  for (int r = 0; r < c.spec.cp && dump.find(base + "candidate_fp32/dq") != nullptr; ++r)
    gradients(backward + "per_rank[" + std::to_string(r) + "].", false, rank_tokens(r), false);
  gradients(backward + "bf16_final_write.", false, std::nullopt, true);
  // The te_p2p lane's backward (--include-lane-backward): against the FP32 reference (with the
  // lane's digest), and the canonical gradients read as BF16 against it.
  const std::string lane = backward + "production_lanes.te_p2p.";
  for (const std::string g : {"dq", "dk", "dv"}) {
    add(lane + "vs_fp32_reference." + g, "te_p2p_backward/" + g, base + "reference_fp32/" + g,
        true);
    add(lane + "vs_canonical_bf16." + g, "candidate_fp32/" + g, base + "te_p2p_backward/" + g,
        false, std::nullopt, true);
  }
  // The layer (--scope layer): its output, and the backward's every gradient, against the same
  // arithmetic from the CP=1 reference.
  add("layer.out", "layer/candidate/out", base + "layer/reference/out", true);
  for (const std::string g : {"dx", "q_proj", "k_proj", "v_proj", "o_proj", "q_bias", "k_bias",
                              "v_bias", "q_norm", "k_norm"}) {
    add("layer.backward.gradients." + g, "layer_backward/candidate/" + g,
        base + "layer_backward/reference/" + g, true);
  }
  add_lane_figures(dump, base, add);
  // The logprobs' active tokens: every sequence's but its first.
  add("dlogp.drift", "candidate/logp", base + "reference/logp", true,
      std::vector<Range>{Range{1, p.seq_len}});
  return specs;
}

std::vector<MissingFigure> missing_figures(const DumpFile& dump, const CaseInfo& c) {
  std::vector<MissingFigure> missing;
  if (c.paged) {
    const std::string base = "/paged_cases/" + c.name + "/";
    const TensorInfo* reference_out = dump.find(base + "reference/out");
    if ((reference_out == nullptr || reference_out->bf16) &&
        dump.find(base + "reference_fp32_arithmetic/out") == nullptr) {
      missing.push_back({"paged.drift.candidate.out",
                         "the dump holds the reference cast to BF16 only (an older dump); the "
                         "report's figure is against the reference before that write"});
    }
    missing.push_back({"paged.drift.fp32_split_merge", "the FP32 lane is not dumped"});
    missing.push_back({"paged.drift.dlogp", "the paged logprobs are not dumped"});
    missing.push_back({"paged.invariance", "the invariance lanes are not dumped"});
    return missing;
  }
  const std::string base = "/cases/" + c.name + "/";
  if (dump.find(base + "candidate_fp32/out") != nullptr &&
      dump.find("/cases/" + topology_counterpart(dump, c) + "/candidate_fp32/out") == nullptr) {
    missing.push_back(
        {"drift.topology_invariance",
         "its CP=1 counterpart " + topology_counterpart(dump, c) + " is not a case of this run"});
  }
  missing.push_back({"merge_order_probe", "the reversed-order merge is not dumped"});
  missing.push_back({"merge_oracle", "the FP64 oracle's differences are not dumped"});
  missing.push_back({"drift.rope", "RoPE's BF16 q and k are not dumped"});
  if (dump.find(base + "candidate/logp") != nullptr)
    missing.push_back({"dlogp.rl_metrics", "the per-token KL is not dumped"});
  return missing;
}

std::string tensor_digest(std::span<const float> values, bool bf16) {
  return values_digest(values, bf16 ? DigestFormat::bf16 : DigestFormat::fp32);
}

DiffStats diff_stats(std::span<const float> candidate, std::span<const float> reference,
                     const std::vector<std::int64_t>& shape,
                     const std::optional<std::vector<Range>>& tokens, bool bf16_candidate,
                     ThreadPool* pool) {
  std::size_t n = 1;
  for (const std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  if (shape.size() < 3 || candidate.size() != n || reference.size() != n)
    throw InspectError("tensors of " + shape_text(shape) + " hold " +
                       std::to_string(candidate.size()) + " and " +
                       std::to_string(reference.size()) + " values");
  std::vector<DiffPart> parts;
  if (!tokens) {
    parts.push_back(DiffPart{candidate.data(), reference.data(), n, bf16_candidate});
  } else {
    const std::int64_t rows = shape[0] * shape[1], seq = shape[2];
    const std::int64_t width = shape.size() == 4 ? shape[3] : 1;
    for (std::int64_t bh = 0; bh < rows; ++bh) {
      for (const Range& t : *tokens) {
        if (t.begin < 0 || t.end > seq || t.empty()) continue;
        const auto at = static_cast<std::size_t>((bh * seq + t.begin) * width);
        parts.push_back(DiffPart{candidate.data() + at, reference.data() + at,
                                 static_cast<std::size_t>(t.size() * width), bf16_candidate});
      }
    }
  }
  return compute_diff_stats(parts, CounterReducer{}, pool);
}

DiffStats FigureMeter::measure(const FigureSpec& spec) {
  const TensorInfo* c = dump_.find(spec.candidate);
  const TensorInfo* r = dump_.find(spec.reference);
  if (c == nullptr || r == nullptr) {
    throw InspectError(dump_.path() + ": " + spec.name + ": no dataset " +
                       (c == nullptr ? spec.candidate : spec.reference));
  }
  if (c->shape != r->shape) {
    throw InspectError(dump_.path() + ": " + spec.name + ": " + spec.candidate + " is " +
                       shape_text(c->shape) + " but " + spec.reference + " is " +
                       shape_text(r->shape));
  }
  const std::vector<float>& cv = values(spec.candidate, spec.reference);
  const std::vector<float>& rv = values(spec.reference, spec.candidate);
  DiffStats s = diff_stats(cv, rv, c->shape, spec.tokens, spec.bf16_candidate, pool_);
  if (spec.digest) s.digest = tensor_digest(cv, c->bf16);
  return s;
}

const std::vector<float>& FigureMeter::values(const std::string& path, const std::string& keep) {
  if (const auto at = cache_.find(path); at != cache_.end()) {
    at->second.used = ++clock_;
    return at->second.values;
  }
  const TensorInfo& t = *dump_.find(path);
  const std::size_t bytes = static_cast<std::size_t>(t.elements()) * sizeof(float);
  while (held_ + bytes > budget_) {
    auto oldest = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first != keep && (oldest == cache_.end() || it->second.used < oldest->second.used))
        oldest = it;
    }
    if (oldest == cache_.end()) break;  // only the pair's other is held: read beside it
    held_ -= oldest->second.values.size() * sizeof(float);
    cache_.erase(oldest);
  }
  std::vector<float> read = dump_.read(t);
  Cached& c = cache_[path];
  c.values = std::move(read);
  c.used = ++clock_;
  held_ += bytes;
  return c.values;
}

}  // namespace cpd::inspect
