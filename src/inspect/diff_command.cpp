// `cpdrift-inspect diff`: two dumps tensor by tensor (two runs, two machines, CPU vs GPU).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string_view>

#include "core/util/thread_pool.h"
#include "inspect/command_line.h"
#include "inspect/figures.h"
#include "report/run_report.h"

namespace cpd::inspect {
namespace {

using json::Value;

struct TensorDiff {
  std::string path;
  const TensorInfo* a = nullptr;
  const TensorInfo* b = nullptr;
  DiffStats stats;  // A as the candidate, B as the reference
  std::string digest_a, digest_b;
  // "agree" or "differ" when compared; else "only_in_a", "only_in_b" or "shape_mismatch".
  const char* verdict = "agree";
  bool compared() const { return a != nullptr && b != nullptr && a->shape == b->shape; }
};

std::optional<double> parse_atol(const Arguments& a) {
  const std::optional<std::string> text = a.value("--atol");
  if (!text) return std::nullopt;
  char* end = nullptr;
  const double atol = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !std::isfinite(atol) || atol < 0)
    throw InspectError("diff: --atol " + *text + ": not a finite number >= 0");
  return atol;
}

TensorDiff compare(const DumpFile& a, const DumpFile& b, const std::string& path,
                   std::optional<double> atol, ThreadPool& pool) {
  TensorDiff d;
  d.path = path;
  d.a = a.find(path);
  d.b = b.find(path);
  if (!d.compared()) {
    d.verdict = d.a == nullptr ? "only_in_b" : d.b == nullptr ? "only_in_a" : "shape_mismatch";
    return d;
  }
  const std::vector<float> va = a.read(*d.a), vb = b.read(*d.b);
  d.stats = diff_stats(va, vb, d.a->shape, std::nullopt, false, &pool);
  d.digest_a = tensor_digest(va, d.a->bf16);
  d.digest_b = tensor_digest(vb, d.b->bf16);
  const bool agree = atol ? d.stats.finite() && d.stats.max_abs <= *atol : d.stats.bitwise_equal();
  d.verdict = agree ? "agree" : "differ";
  return d;
}

Value shape_value(const TensorInfo* t) {
  return t == nullptr ? Value() : Value(json::Array(t->shape.begin(), t->shape.end()));
}

Value diff_json(const DumpFile& a, const DumpFile& b, std::optional<double> atol,
                const std::vector<TensorDiff>& diffs, std::size_t differ) {
  const auto tensor = [](const TensorDiff& d) {
    const bool compared = d.compared();
    return json::Object{{"path", d.path},
                        {"verdict", d.verdict},
                        {"shape_a", shape_value(d.a)},
                        {"shape_b", shape_value(d.b)},
                        {"stats", compared ? stats_json(d.stats) : Value(nullptr)},
                        {"digest_a", compared ? Value(d.digest_a) : Value(nullptr)},
                        {"digest_b", compared ? Value(d.digest_b) : Value(nullptr)}};
  };
  return json::Object{{"a", a.path()},
                      {"b", b.path()},
                      {"atol", atol ? Value(*atol) : Value(nullptr)},
                      {"rule", atol ? "agree: max |A - B| <= atol" : "agree: bitwise equal"},
                      {"agree", differ == 0},
                      {"tensor_count", diffs.size()},
                      {"differ_count", differ},
                      {"tensors", json::array_of(diffs, tensor)}};
}

void print_text(std::FILE* out, const DumpFile& a, const DumpFile& b, std::optional<double> atol,
                const std::vector<TensorDiff>& diffs, std::size_t differ) {
  std::fprintf(out, "# cpdrift-inspect diff: A %s, B %s\n", a.path().c_str(), b.path().c_str());
  std::fprintf(out, "# A: %s\n# B: %s\n", problem_text(a.problem().problem).c_str(),
               problem_text(b.problem().problem).c_str());
  std::fprintf(out, "# per tensor |A - B|; agree: %s\n",
               atol ? ("max |A - B| <= " + sci(*atol)).c_str() : "bitwise equal");
  std::size_t width = 6;
  for (const TensorDiff& d : diffs) width = std::max(width, d.path.size());
  const int w = static_cast<int>(width);
  std::fprintf(out, "#   %-*s %-10s %-10s %10s %-7s %-16s %-16s %s\n", w, "tensor", "max_abs",
               "mean_abs", "mismatches", "bitwise", "digest A", "digest B", "verdict");
  for (const TensorDiff& d : diffs) {
    if (!d.compared()) {
      const std::string why =
          d.a == nullptr   ? "only in B"
          : d.b == nullptr ? "only in A"
                           : "shapes " + shape_text(d.a->shape) + " vs " + shape_text(d.b->shape);
      std::fprintf(out, "    %-*s %s\n", w, d.path.c_str(), why.c_str());
      continue;
    }
    const DiffStats& s = d.stats;
    std::fprintf(out, "    %-*s %-10s %-10s %10llu %-7s %-16s %-16s %s\n", w, d.path.c_str(),
                 max_abs_text(s).c_str(), s.finite() ? sci(s.mean_abs).c_str() : "-",
                 static_cast<unsigned long long>(s.mismatch_count),
                 s.bitwise_equal() ? "yes" : "no", d.digest_a.substr(0, 16).c_str(),
                 d.digest_b.substr(0, 16).c_str(), d.verdict);
  }
  std::fprintf(out, "# %zu tensors: %zu agree, %zu differ: %s\n", diffs.size(),
               diffs.size() - differ, differ, differ == 0 ? "SAME" : "DIFFERENT");
}

}  // namespace

int diff_command(const Arguments& args, std::FILE* out) {
  const std::optional<double> atol = parse_atol(args);
  const DumpFile a = DumpFile::open(args.operands[0]);
  const DumpFile b = DumpFile::open(args.operands[1]);
  std::set<std::string> paths;
  for (const TensorInfo& t : a.tensors()) paths.insert(t.path);
  for (const TensorInfo& t : b.tensors()) paths.insert(t.path);
  ThreadPool pool(measure_threads());
  std::vector<TensorDiff> diffs;
  std::size_t differ = 0;
  for (const std::string& path : paths) {
    diffs.push_back(compare(a, b, path, atol, pool));
    differ += std::string_view(diffs.back().verdict) != "agree";
  }
  if (args.json) {
    std::fputs(json::to_string(diff_json(a, b, atol, diffs, differ)).c_str(), out);
  } else {
    print_text(out, a, b, atol, diffs, differ);
  }
  return differ == 0 ? kExitOk : kExitDiffer;
}

}  // namespace cpd::inspect
