#include "compare/stream_comparison.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/errors.h"

namespace cpd {
namespace {

constexpr double kMaxDelta = 300;

[[noreturn]] void invalid(const std::string& why) {
  throw UsageError("invalid comparison: " + why);
}

std::string key_text(const LogprobRecord& r) {
  return "(sequence " + std::to_string(r.sequence) + ", position " + std::to_string(r.position) +
         ")";
}

bool key_less(const LogprobRecord& a, const LogprobRecord& b) {
  return a.sequence != b.sequence ? a.sequence < b.sequence : a.position < b.position;
}

// The stream's record indices in (sequence, position) order; refuses a non-finite logprob
// (the first in file order) and a key seen twice.
std::vector<std::size_t> sorted_records(const LogprobStream& s) {
  for (std::size_t i = 0; i < s.records.size(); ++i) {
    if (!std::isfinite(s.records[i].logprob)) {
      invalid(s.where(i) + ": logprob is not finite (" + std::to_string(s.records[i].logprob) +
              ")");
    }
  }
  std::vector<std::size_t> order(s.records.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return key_less(s.records[a], s.records[b]);
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const LogprobRecord &a = s.records[order[i - 1]], &b = s.records[order[i]];
    if (!key_less(a, b)) {
      invalid(s.where(order[i]) + ": " + key_text(b) + " again (first at " + s.where(order[i - 1]) +
              ")");
    }
  }
  return order;
}

// KL(π_rollout ‖ π_train) = Σ_v p_rollout(v)·(logp_rollout(v) − logp_train(v)), FP64.
double exact_kl(const LogprobStream& train, std::size_t ti, const LogprobStream& rollout,
                std::size_t ri) {
  const double* t = train.vocab.data() + train.vocab_row[ti] * train.vocab_size;
  const double* r = rollout.vocab.data() + rollout.vocab_row[ri] * rollout.vocab_size;
  double kl = 0;
  for (std::int64_t v = 0; v < train.vocab_size; ++v) {
    if (!std::isfinite(t[v]) && t[v] != -INFINITY)
      invalid(train.where(ti) + ": vocab_logprobs[" + std::to_string(v) + "] is not finite");
    if (!std::isfinite(r[v]) && r[v] != -INFINITY)
      invalid(rollout.where(ri) + ": vocab_logprobs[" + std::to_string(v) + "] is not finite");
    if (r[v] == -INFINITY) continue;  // p_rollout = 0 adds nothing
    if (t[v] == -INFINITY) {
      invalid(train.where(ti) + ": vocab_logprobs[" + std::to_string(v) +
              "] is -inf where the rollout's is not: KL(rollout || train) is infinite");
    }
    kl += std::exp(r[v]) * (r[v] - t[v]);
  }
  return kl;
}

// Record i's top-k list as (id, logprob) sorted by id; refuses a repeated id and a non-finite
// logprob.
std::vector<std::pair<std::int64_t, double>> top_list(const LogprobStream& s, std::size_t i) {
  std::vector<std::pair<std::int64_t, double>> list;
  if (s.top_begin.empty()) return list;
  for (std::size_t e = s.top_begin[i]; e < s.top_begin[i + 1]; ++e) {
    if (!std::isfinite(s.top_logprobs[e])) {
      invalid(s.where(i) + ": top-k logprob of token " + std::to_string(s.top_ids[e]) +
              " is not finite");
    }
    list.emplace_back(s.top_ids[e], s.top_logprobs[e]);
  }
  std::sort(list.begin(), list.end());
  for (std::size_t e = 1; e < list.size(); ++e) {
    if (list[e].first == list[e - 1].first)
      invalid(s.where(i) + ": top-k list names token " + std::to_string(list[e].first) + " twice");
  }
  return list;
}

// The id with the largest logprob (the smallest id among equals).
std::int64_t best_id(const std::vector<std::pair<std::int64_t, double>>& list) {
  std::size_t best = 0;
  for (std::size_t e = 1; e < list.size(); ++e) {
    if (list[e].second > list[best].second) best = e;
  }
  return list[best].first;
}

TopkFigures compare_topk(const LogprobStream& train, const LogprobStream& rollout,
                         const StreamComparison& c) {
  TopkFigures f;
  if (train.top_begin.empty() || rollout.top_begin.empty()) {
    f.reason = "needs top_logprobs in both streams";
    return f;
  }
  double overlap_sum = 0, abs_sum = 0;
  std::uint64_t top1 = 0;
  f.overlap_min = 1;
  for (std::size_t k = 0; k < c.tokens.size(); ++k) {
    const auto a = top_list(train, c.train_record[k]), b = top_list(rollout, c.rollout_record[k]);
    if (a.empty() || b.empty()) continue;
    std::size_t common = 0;
    for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
      if (a[i].first < b[j].first) {
        ++i;
      } else if (b[j].first < a[i].first) {
        ++j;
      } else {
        const double d = std::fabs(a[i].second - b[j].second);
        abs_sum += d;
        f.common_abs_max = std::max(f.common_abs_max, d);
        ++common;
        ++i;
        ++j;
      }
    }
    const double overlap =
        static_cast<double>(common) / static_cast<double>(a.size() + b.size() - common);
    overlap_sum += overlap;
    f.overlap_min = std::min(f.overlap_min, overlap);
    top1 += best_id(a) == best_id(b);
    f.common_entries += common;
    ++f.tokens;
  }
  if (f.tokens == 0) {
    f.reason = "no active token has a top_logprobs list in both streams";
    f.overlap_min = 0;
    return f;
  }
  f.available = true;
  f.overlap_mean = overlap_sum / static_cast<double>(f.tokens);
  f.top1_agreement = static_cast<double>(top1) / static_cast<double>(f.tokens);
  if (f.common_entries > 0) f.common_abs_mean = abs_sum / static_cast<double>(f.common_entries);
  return f;
}

}  // namespace

StreamComparison compare_streams(const LogprobStream& train, const LogprobStream& rollout,
                                 const RlMetricOptions& options) {
  const std::vector<std::size_t> ts = sorted_records(train), rs = sorted_records(rollout);
  StreamComparison c;
  // A key in one stream only: the first such key in (sequence, position) order.
  std::size_t i = 0, j = 0;
  const bool both_vocab = train.vocab_size > 0 && rollout.vocab_size > 0;
  if (both_vocab && train.vocab_size != rollout.vocab_size) {
    invalid("the vocabularies differ: " + train.path + " has " + std::to_string(train.vocab_size) +
            " logprobs a token, " + rollout.path + " " + std::to_string(rollout.vocab_size));
  }
  c.exact_kl = both_vocab;
  c.exact_kl_reason = both_vocab ? "" : "needs vocab_logprobs in both streams";
  std::int64_t last_sequence = -1;
  while (i < ts.size() || j < rs.size()) {
    const LogprobRecord* t = i < ts.size() ? &train.records[ts[i]] : nullptr;
    const LogprobRecord* r = j < rs.size() ? &rollout.records[rs[j]] : nullptr;
    if (r == nullptr || (t != nullptr && key_less(*t, *r))) {
      invalid(rollout.path + " has no record for " + key_text(*t) + " (" + train.where(ts[i]) +
              ")");
    }
    if (t == nullptr || key_less(*r, *t)) {
      invalid(train.path + " has no record for " + key_text(*r) + " (" + rollout.where(rs[j]) +
              ")");
    }
    if (t->token_id != r->token_id) {
      invalid("the token ids differ at " + key_text(*t) + ": " + std::to_string(t->token_id) +
              " in " + train.where(ts[i]) + ", " + std::to_string(r->token_id) + " in " +
              rollout.where(rs[j]));
    }
    if (t->active != r->active) {
      invalid("\"active\" differs at " + key_text(*t) + ": " + train.where(ts[i]) + " says " +
              (t->active ? "true" : "false") + ", " + rollout.where(rs[j]) + " " +
              (r->active ? "true" : "false"));
    }
    ++c.records;
    if (!t->active) {
      ++c.inactive;
    } else {
      // exp(Δ) and its square must stay finite for the ratio figures: a logprob off by more
      // than 300 nats is a broken stream, not a drift to average.
      if (std::fabs(t->logprob - r->logprob) > kMaxDelta) {
        invalid("the logprobs differ by " + std::to_string(t->logprob - r->logprob) + " nats at " +
                key_text(*t) + " (" + train.where(ts[i]) + ", " + rollout.where(rs[j]) +
                "): more than " + std::to_string(static_cast<int>(kMaxDelta)) +
                ", so exp(delta) is no ratio to report");
      }
      TokenPair p;
      p.sequence = t->sequence;
      p.position = t->position;
      p.train = t->logprob;
      p.rollout = r->logprob;
      if (c.exact_kl) {
        const bool rows = train.vocab_row[ts[i]] >= 0 && rollout.vocab_row[rs[j]] >= 0;
        if (!rows) {
          c.exact_kl = false;
          c.exact_kl_reason =
              "vocab_logprobs missing at " + key_text(*t) + " (" +
              (train.vocab_row[ts[i]] < 0 ? train.where(ts[i]) : rollout.where(rs[j])) + ")";
        } else {
          if (t->token_id >= train.vocab_size) {
            invalid(train.where(ts[i]) + ": token_id " + std::to_string(t->token_id) +
                    " is outside its " + std::to_string(train.vocab_size) + "-entry vocabulary");
          }
          p.kl = exact_kl(train, ts[i], rollout, rs[j]);
        }
      }
      if (c.tokens.empty()) c.first_position = p.position;
      c.first_position = std::min(c.first_position, p.position);
      c.last_position = std::max(c.last_position, p.position);
      if (p.sequence != last_sequence) ++c.sequences;
      last_sequence = p.sequence;
      c.tokens.push_back(p);
      c.token_ids.push_back(t->token_id);
      c.train_record.push_back(ts[i]);
      c.rollout_record.push_back(rs[j]);
    }
    ++i;
    ++j;
  }
  if (c.tokens.empty()) {
    invalid(c.records == 0 ? "no records in " + train.path + " and " + rollout.path
                           : "no active token (all " + std::to_string(c.records) +
                                 " records have \"active\": false)");
  }
  if (!c.exact_kl) {
    for (TokenPair& p : c.tokens) p.kl = 0;
  }
  c.metrics = compute_rl_metrics(c.tokens, options);
  c.topk = compare_topk(train, rollout, c);
  constexpr std::int64_t kEdges[] = {0, 64, 256, 1024, 4096, 16384, 65536};
  c.by_position = abs_delta_bins(c.tokens, &TokenPair::position, kEdges);
  // A 2K-token stream does not list the empty bins beyond its last position.
  while (c.by_position.back().tokens == 0) c.by_position.pop_back();
  return c;
}

}  // namespace cpd
