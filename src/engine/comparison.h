// What the engine hands the measurement layers (design: generate → shard → partial states →
// ordered merge → metrics → report/dump): candidate-vs-reference comparisons as the pieces this
// process holds, and the tensors a case publishes (digests at rank 0, datasets in a dump).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/global_tensor.h"
#include "core/shard.h"

namespace cpd {

/// One local piece of a compared tensor: `count` candidate and reference values, or `count`
/// precomputed non-negative differences (reference null, e.g. against an FP64 oracle), from the
/// shard of CP rank `cp_rank`. `bf16_candidate`: the candidate is compared as its BF16 final
/// write (each value rounded once), which is never stored.
struct ComparedPiece {
  int cp_rank = 0;
  const float* candidate = nullptr;
  const float* reference = nullptr;
  std::size_t count = 0;
  bool bf16_candidate = false;
};

/// The pieces of one comparison this process holds; the statistics combine them across
/// processes (metrics/diff_stats.h), whole or per CP rank.
struct Comparison {
  std::vector<ComparedPiece> pieces;
  /// Index into the case's published tensors of the candidate's, whose digest the statistics
  /// carry; -1 when none is published.
  int candidate_tensor = -1;

  void add(int cp_rank, const float* candidate, const float* reference, std::size_t count,
           bool bf16_candidate = false) {
    pieces.push_back(ComparedPiece{cp_rank, candidate, reference, count, bf16_candidate});
  }
  void add(int cp_rank, const Shard& candidate, const Shard& reference,
           bool bf16_candidate = false) {
    add(cp_rank, candidate.data.data(), reference.data.data(), candidate.data.size(),
        bf16_candidate);
  }
  void add_diffs(int cp_rank, std::span<const float> diffs) {
    add(cp_rank, diffs.data(), nullptr, diffs.size());
  }
};

/// An attention output's two comparisons.
struct OutLseComparison {
  Comparison out, lse;

  void add(int cp_rank, const AttnShard& candidate, const AttnShard& reference) {
    out.add(cp_rank, candidate.out, reference.out);
    lse.add(cp_rank, candidate.lse, reference.lse);
  }
};

/// The dump groups of a case's tensors: /cases/<case> and /paged_cases/<case>.
inline std::string case_group(const std::string& case_name) { return "/cases/" + case_name; }
inline std::string paged_case_group(const std::string& case_name) {
  return "/paged_cases/" + case_name;
}

/// A distributed tensor a case publishes.
struct CaseTensor {
  std::string path;    // its dataset in a dump (/cases/<case>/<leg>/<name>); "": never dumped
  bool digest = true;  // false: a reference, published only into a dump
  bool bf16 = false;  // BF16-exact values: digested as BF16 bits, dumped as original_dtype bfloat16
  GlobalTensor layout;
  std::vector<std::pair<std::string, std::string>> attributes;  // what its axes and rows are
};

}  // namespace cpd
