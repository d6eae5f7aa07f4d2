#include "core/plan.h"

#include <algorithm>
#include <string>

#include "core/util/sha256.h"

namespace cpd {

const char* to_string(CpLayout l) { return name_of(kCpLayoutNames, l); }
const char* to_string(Protocol p) { return name_of(kProtocolNames, p); }

std::vector<Range> cp_owner_ranges(CpLayout layout, int cp, int cp_rank, std::int64_t seq_len) {
  if (layout == CpLayout::contiguous) {
    const std::int64_t n = seq_len / cp;
    return {Range{cp_rank * n, (cp_rank + 1) * n}};
  }
  const std::int64_t chunk = seq_len / (2 * cp);
  const std::int64_t mirror = 2 * cp - 1 - cp_rank;
  return {Range{cp_rank * chunk, (cp_rank + 1) * chunk},
          Range{mirror * chunk, (mirror + 1) * chunk}};
}

std::vector<Range> split_range(Range owner, std::optional<std::int64_t> split) {
  if (!split) return {owner};
  std::vector<Range> blocks;
  for (std::int64_t s = owner.begin; s < owner.end;) {
    const std::int64_t e = s + std::min(*split, owner.end - s);  // no overflow for any split
    blocks.push_back(Range{s, e});
    s = e;
  }
  return blocks;
}

SplitReading read_split_plan(const std::vector<Range>& ranges, const std::vector<Range>& blocks,
                             std::optional<std::int64_t> requested_fixed) {
  // Each range's blocks, which must tile it in order.
  std::vector<std::vector<Range>> runs(ranges.size());
  for (const Range& b : blocks) {
    const auto in = std::find_if(ranges.begin(), ranges.end(),
                                 [&](const Range& r) { return r.contains(b) && !b.empty(); });
    if (in == ranges.end()) return {};
    runs[static_cast<std::size_t>(in - ranges.begin())].push_back(b);
  }
  std::optional<std::int64_t> cut;  // the size of the first block of a range cut in several
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::int64_t next = ranges[i].begin;
    for (const Range& b : runs[i]) {
      if (b.begin != next) return {};
      next = b.end;
    }
    if (next != ranges[i].end) return {};
    if (runs[i].size() > 1 && !cut) cut = runs[i].front().size();
  }
  if (!cut) {
    const bool fits = requested_fixed && std::all_of(runs.begin(), runs.end(), [&](const auto& r) {
                        return r.empty() || r.front().size() <= *requested_fixed;
                      });
    return fits ? SplitReading{"fixed", requested_fixed} : SplitReading{"disabled", std::nullopt};
  }
  for (const std::vector<Range>& run : runs) {
    for (std::size_t j = 0; j < run.size(); ++j) {
      const bool last = j + 1 == run.size();
      if (last ? run[j].size() > *cut : run[j].size() != *cut) return {};
    }
  }
  return SplitReading{"fixed", cut};
}

std::vector<KvBlock> kv_block_grid(const CaseSpec& spec, std::int64_t seq_len) {
  std::vector<KvBlock> blocks;
  for (int r = 0; r < spec.cp; ++r) {
    for (const Range& owned : cp_owner_ranges(spec.layout, spec.cp, r, seq_len)) {
      for (const Range& b : split_range(owned, spec.split)) blocks.push_back(KvBlock{0, b, r});
    }
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const KvBlock& a, const KvBlock& b) { return a.range.begin < b.range.begin; });
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].index = static_cast<int>(i);
  return blocks;
}

std::vector<Range> kv_block_bounds(const CaseSpec& spec, std::int64_t seq_len) {
  std::vector<Range> bounds;
  for (const KvBlock& b : kv_block_grid(spec, seq_len)) bounds.push_back(b.range);
  return bounds;
}

std::string block_metadata_hash(const std::vector<Range>& bounds) {
  std::string json = "[";
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (i > 0) json += ',';
    json += '[' + std::to_string(bounds[i].begin) + ',' + std::to_string(bounds[i].end) + ']';
  }
  json += ']';
  return sha256_hex(json).substr(0, 16);
}

CaseSpec cp1_counterpart(const CaseSpec& spec) {
  CaseSpec ref = spec;
  ref.cp = 1;
  ref.protocol = Protocol::ag_rs;  // with one CP rank every protocol is the same computation
  return ref;
}

std::string case_name(const CaseSpec& spec, const Problem& problem) {
  std::string name =
      model_slug(problem.dims) + "_tp" + std::to_string(spec.tp) + "_cp" + std::to_string(spec.cp);
  name += spec.split ? "_chunk" + std::to_string(*spec.split) : std::string("_prefill");
  name += std::string("_") + to_string(problem.dtype);
  if (spec.layout != CpLayout::contiguous) name += std::string("_") + to_string(spec.layout);
  if (spec.protocol != Protocol::ag_rs) name += std::string("_") + to_string(spec.protocol);
  return name;
}

std::string validate_case(const CaseSpec& spec, const Problem& problem) {
  const auto cp = std::to_string(spec.cp);
  if (std::string why = tp_problem(problem.dims, spec.tp); !why.empty()) return why;
  if (spec.cp < 1) return "CP=" + cp + " must be at least 1";
  if (spec.split && *spec.split < 1) {
    return "split size " + std::to_string(*spec.split) + " must be at least 1";
  }
  const std::int64_t parts = spec.layout == CpLayout::zigzag ? 2LL * spec.cp : spec.cp;
  if (problem.seq_len % parts != 0) {
    return "CP=" + cp + " (" + to_string(spec.layout) + ") needs seq-len divisible by " +
           std::to_string(parts) + ", got " + std::to_string(problem.seq_len);
  }
  return "";
}

LogicalRank logical_rank(const CaseSpec& spec, const Problem& problem, int id) {
  LogicalRank r;
  r.id = id;
  r.tp_rank = id % spec.tp;
  r.cp_rank = id / spec.tp;
  const int hq = problem.dims.num_q_heads / spec.tp, hkv = problem.dims.num_kv_heads / spec.tp;
  r.q_heads = Range{r.tp_rank * hq, (r.tp_rank + 1) * hq};
  r.kv_heads = Range{r.tp_rank * hkv, (r.tp_rank + 1) * hkv};
  r.tokens = cp_owner_ranges(spec.layout, spec.cp, r.cp_rank, problem.seq_len);
  return r;
}

}  // namespace cpd
