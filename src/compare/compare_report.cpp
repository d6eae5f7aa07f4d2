#include "compare/compare_report.h"

#include <algorithm>

#include "report/rl_metrics_json.h"

namespace cpd {
namespace {

using json::Value;

Value stream_json(const LogprobStream& s) {
  const auto file = [](const SourceFile& f) {
    return json::Object{{"path", f.path}, {"size_bytes", f.size_bytes}, {"sha256", f.sha256}};
  };
  return json::Object{{"path", s.path},
                      {"format", s.format},
                      {"records", s.records.size()},
                      {"vocab_size", s.vocab_size > 0 ? Value(s.vocab_size) : Value()},
                      {"files", json::array_of(s.files, file)}};
}

// Token k of the comparison, with its token id and the records it came from.
Value token_json(const CompareRun& run, std::size_t k) {
  const StreamComparison& c = run.comparison;
  const TokenPair& t = c.tokens[k];
  return json::Object{{"sequence", t.sequence},
                      {"position", t.position},
                      {"token_id", c.token_ids[k]},
                      {"logp_train", t.train},
                      {"logp_rollout", t.rollout},
                      {"delta", t.train - t.rollout},
                      {"train_record", run.train.where(c.train_record[k])},
                      {"rollout_record", run.rollout.where(c.rollout_record[k])}};
}

// The index of the token at (sequence, position) (tokens are in that order).
std::size_t index_of(const StreamComparison& c, const TokenPair& t) {
  const auto it = std::lower_bound(
      c.tokens.begin(), c.tokens.end(), t, [](const TokenPair& a, const TokenPair& b) {
        return a.sequence != b.sequence ? a.sequence < b.sequence : a.position < b.position;
      });
  return static_cast<std::size_t>(it - c.tokens.begin());
}

}  // namespace

json::Value compare_json(const CompareRun& run) {
  const StreamComparison& c = run.comparison;
  const RlMetrics& m = c.metrics;
  Value rl = rl_metrics_json(m);
  rl["sign_convention"] = "delta = logp_train - logp_rollout (TRAIN file - ROLLOUT file)";
  Value& kl = rl["kl_rollout_train"];
  if (!c.exact_kl) kl["exact_mean"] = Value();
  kl["exact_status"] = c.exact_kl ? "available" : "unavailable";
  if (!c.exact_kl) kl["exact_reason"] = c.exact_kl_reason;
  rl["first_divergent_token"] =
      m.diverged ? token_json(run, index_of(c, m.first_divergent)) : Value();
  rl["worst_tokens"] =
      json::array_of(m.worst, [&](const TokenPair& t) { return token_json(run, index_of(c, t)); });
  // Engine streams carry no CP layout: the boundary bins are the run's, binning by position is
  // this command's.
  rl.as_object().erase("abs_delta_by_boundary_distance");
  rl["abs_delta_by_position"] = abs_delta_bins_json(c.by_position, "position");

  const TopkFigures& k = c.topk;
  Value top = Value::object();
  top["status"] = k.available ? "available" : "unavailable";
  if (!k.available) {
    top["reason"] = k.reason;
  } else {
    top["tokens"] = k.tokens;
    top["overlap_jaccard"] = json::Object{{"mean", k.overlap_mean}, {"min", k.overlap_min}};
    top["top1_agreement"] = k.top1_agreement;
    top["common_entries"] = k.common_entries;
    top["common_abs_delta"] = json::Object{{"mean", k.common_abs_mean}, {"max", k.common_abs_max}};
  }

  const Value alignment =
      json::Object{{"key", "(sequence, position)"},    {"records", c.records},
                   {"active_tokens", c.tokens.size()}, {"inactive_records", c.inactive},
                   {"sequences", c.sequences},         {"first_position", c.first_position},
                   {"last_position", c.last_position}};
  return json::Object{
      {"schema_version", kCompareSchema},
      {"producer", run.producer},
      {"created_at_utc", run.created_at_utc},
      {"command", run.command},
      {"train", stream_json(run.train)},
      {"rollout", stream_json(run.rollout)},
      {"alignment", alignment},
      {"rl_metrics", std::move(rl)},
      {"top_logprobs", std::move(top)},
      {"verdict",
       json::Object{{"max_abs_delta", run.max_abs_delta ? Value(*run.max_abs_delta) : Value()},
                    {"passed", run.passed()}}}};
}

void print_compare_table(std::FILE* out, const CompareRun& run) {
  const StreamComparison& c = run.comparison;
  const RlMetrics& m = c.metrics;
  const auto source = [](const LogprobStream& s) {
    std::string text =
        s.path + " (" + s.format + ", " + std::to_string(s.records.size()) + " records";
    if (s.files.size() == 1) text += ", sha256 " + s.files.front().sha256.substr(0, 12);
    return text + ")";
  };
  std::fprintf(out, "# %s: selected-token logprobs, train vs rollout\n", run.producer.c_str());
  std::fprintf(out, "# train   : %s\n", source(run.train).c_str());
  std::fprintf(out, "# rollout : %s\n", source(run.rollout).c_str());
  std::fprintf(out,
               "# aligned : %llu records by (sequence, position), %zu active tokens in %llu "
               "sequence%s, positions %lld-%lld; %llu inactive\n",
               static_cast<unsigned long long>(c.records), c.tokens.size(),
               static_cast<unsigned long long>(c.sequences), c.sequences == 1 ? "" : "s",
               static_cast<long long>(c.first_position), static_cast<long long>(c.last_position),
               static_cast<unsigned long long>(c.inactive));
  std::fprintf(out, "#\n# Δ = train - rollout; ρ = exp Δ; KL(rollout ‖ train)\n");
  // Padded by hand: printf pads bytes, and Δ and ρ take two.
  std::fputs(
      "# |Δ| mean  |Δ| p50   |Δ| p99   |Δ| max   ρ min     ρ max     ρ ESS     k3 KL     "
      "exact KL  first divergent\n",
      out);
  char exact[16] = "n/a";
  if (c.exact_kl) std::snprintf(exact, sizeof exact, "%.2e", m.kl_exact_mean);
  std::string first = "none (bitwise equal)";
  if (m.diverged) {
    first = "seq " + std::to_string(m.first_divergent.sequence) + " pos " +
            std::to_string(m.first_divergent.position);
  }
  std::fprintf(out, "  %-9.2e %-9.2e %-9.2e %-9.2e %-9.5f %-9.5f %-9.1f %-9.2e %-9s %s\n",
               m.abs_mean, m.abs_p50, m.abs_p99, m.abs_max, m.ratio_min, m.ratio_max,
               m.effective_sample_size, m.k3_mean, exact, first.c_str());
  if (!c.exact_kl) std::fprintf(out, "# exact KL: %s\n", c.exact_kl_reason.c_str());
  const TopkFigures& k = c.topk;
  if (k.available) {
    std::fprintf(out,
                 "# top-k   : %llu tokens; id overlap (Jaccard) mean %.3f, least %.3f; same top-1 "
                 "id %.1f%%; |Δ| of the %llu shared entries mean %.2e, max %.2e\n",
                 static_cast<unsigned long long>(k.tokens), k.overlap_mean, k.overlap_min,
                 100.0 * k.top1_agreement, static_cast<unsigned long long>(k.common_entries),
                 k.common_abs_mean, k.common_abs_max);
  } else {
    std::fprintf(out, "# top-k   : %s\n", k.reason.c_str());
  }
  std::fprintf(out, "#\n# by position       tokens     |Δ| mean   |Δ| max\n");
  for (const DistanceBin& b : c.by_position) {
    const std::string range =
        std::to_string(b.min) + "-" + (b.max < 0 ? std::string("") : std::to_string(b.max));
    std::fprintf(out, "  %-16s %-10llu %-10.2e %.2e\n", range.c_str(),
                 static_cast<unsigned long long>(b.tokens), b.abs_mean, b.abs_max);
  }
  if (!m.worst.empty()) {
    std::fprintf(out, "#\n# worst tokens      token_id   logp train      logp rollout    Δ\n");
    for (const TokenPair& t : m.worst) {
      const std::size_t k = index_of(c, t);
      const std::string at =
          "seq " + std::to_string(t.sequence) + " pos " + std::to_string(t.position);
      std::fprintf(out, "  %-16s %-10lld %-15.8g %-15.8g %+.3e\n", at.c_str(),
                   static_cast<long long>(c.token_ids[k]), t.train, t.rollout, t.train - t.rollout);
    }
  }
  if (run.max_abs_delta) {
    std::fprintf(out, "#\n# Comparison : %s (|Δ| max %.3e %s --max-abs-delta %.3e)\n",
                 run.passed() ? "OK" : "FAILED", m.abs_max, run.passed() ? "<=" : ">",
                 *run.max_abs_delta);
  } else {
    std::fprintf(out, "#\n# Comparison : valid (no gate: --max-abs-delta X makes one)\n");
  }
}

}  // namespace cpd
