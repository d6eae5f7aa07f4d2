#include "inspect/output_format.h"

#include <cstdio>

namespace cpd::inspect {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string problem_text(const Problem& p) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "B=%d S=%lld Hq=%d Hkv=%d D=%d, dtype %s, seed %llu%s", p.batch,
                static_cast<long long>(p.seq_len), p.dims.num_q_heads, p.dims.num_kv_heads,
                p.dims.head_dim, to_string(p.dtype), static_cast<unsigned long long>(p.seed),
                p.rope ? ", RoPE" : ", no RoPE");
  std::string text = buf;
  if (p.distribution != InputDistribution::gaussian)
    text += std::string(", ") + to_string(p.distribution) + " inputs";
  return text;
}

std::string sci(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", value);
  return buf;
}

std::string max_abs_text(const DiffStats& s) { return s.finite() ? sci(s.max_abs) : "nonfinite"; }

std::string short_digest(const std::optional<std::string>& digest) {
  return digest ? digest->substr(0, 16) : "-";
}

}  // namespace cpd::inspect
