// The report's drift figures, recomputed from a dump's tensors: the same candidate/reference
// pairing as the engine's comparisons (engine/case_runner.cpp, case_legs.cpp, paged_case.cpp),
// the same statistics (metrics/diff_stats.h) and digests, so every figure equals the JSON
// report's bit for bit. docs/inspect.md lists the figures and those a dump cannot reproduce.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/range.h"
#include "inspect/dump_reader.h"
#include "metrics/diff_stats.h"

namespace cpd {
class ThreadPool;
}

namespace cpd::inspect {

/// One figure: a candidate tensor against a reference tensor of the same shape.
struct FigureSpec {
  std::string name;       // its path in the report's case object: "drift.cp_merge_fp32.out"
  std::string candidate;  // dataset paths in the dump
  std::string reference;
  bool bf16_candidate = false;  // each candidate value read rounded once to BF16 (a final write)
  /// Only these sequence positions (axis S) of every (b, h): a CP rank's shard, or a logprob's
  /// active tokens; nullopt takes every element.
  std::optional<std::vector<Range>> tokens;
  bool digest = false;  // the statistics carry the candidate's SHA-256, as the report's do
};

struct Figure {
  FigureSpec spec;
  DiffStats stats;
};

/// A figure of the report that a dump cannot reproduce, and why.
struct MissingFigure {
  std::string name, reason;
};

/// The report figures of case `c` whose tensors the dump holds, in the report's order.
std::vector<FigureSpec> report_figures(const DumpFile& dump, const CaseInfo& c);
/// The report figures of `c` that the dump cannot reproduce.
std::vector<MissingFigure> missing_figures(const DumpFile& dump, const CaseInfo& c);

/// The SHA-256 the report gives a tensor: of its FP32 little-endian bytes, or of its BF16 bit
/// patterns when it is BF16-exact (`bf16`), in C order (metrics/digest.h).
std::string tensor_digest(std::span<const float> values, bool bf16);

/// Statistics of `candidate` against `reference` (both [B, H, S, W] in C order, `shape`),
/// over `tokens` of every (b, h) when set. Throws InspectError for sizes that disagree.
DiffStats diff_stats(std::span<const float> candidate, std::span<const float> reference,
                     const std::vector<std::int64_t>& shape,
                     const std::optional<std::vector<Range>>& tokens, bool bf16_candidate,
                     ThreadPool* pool);

/// Measures figures of one dump. Tensors read stay cached (a case's reference serves most of its
/// figures) up to `cache_bytes`, then the least recently used go: at S = 128k one [B, Hq, S, D]
/// tensor is 2 GiB, and a case has a dozen.
class FigureMeter {
 public:
  FigureMeter(const DumpFile& dump, ThreadPool* pool,
              std::size_t cache_bytes = std::size_t{1} << 32)
      : dump_(dump), pool_(pool), budget_(cache_bytes) {}
  /// Throws InspectError when a tensor is missing, unreadable or of another shape.
  DiffStats measure(const FigureSpec& spec);
  /// Drops the tensors read so far (between cases).
  void forget() {
    cache_.clear();
    held_ = 0;
  }

 private:
  struct Cached {
    std::vector<float> values;
    std::uint64_t used = 0;
  };
  // The values at `path`, read if need be; evicting never drops `keep` (the pair's other).
  const std::vector<float>& values(const std::string& path, const std::string& keep);

  const DumpFile& dump_;
  ThreadPool* pool_;
  std::size_t budget_, held_ = 0;
  std::uint64_t clock_ = 0;
  std::map<std::string, Cached> cache_;
};

}  // namespace cpd::inspect
