// Reads a cpdrift HDF5 dump (`cpdrift --dump PATH`, docs/inspect.md) and validates everything it
// reads: the file, its root attributes, every case group and tensor dataset (shape, dtype, rank,
// attributes). Anything that is not a complete cpdrift dump — a truncated, corrupted or foreign
// file, a missing dataset or attribute, a wrong rank or dtype — is one InspectError naming the
// file and what is wrong; HDF5's own error printing is off, and no other exception escapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/plan.h"
#include "io/tensor_dump.h"

namespace cpd::inspect {

/// What cpdrift-inspect cannot read or do: one line, which names the file when there is one.
/// The tool prints it as `cpdrift-inspect: error: <what>` and exits with status 2.
class InspectError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The file the reader last handed to HDF5 ("" before any), for the fatal-signal handler
/// (inspect/main.cpp): HDF5 1.10 does not checksum its metadata and can fault on a corrupted file.
const char* file_being_read();

/// The value of `name` in `attributes`, or null.
const DumpValue* find_attribute(const DumpAttributes& attributes, const std::string& name);
/// "1", "0.5", "bf16": a value as `list` prints it.
std::string attribute_text(const DumpValue& value);
/// "B=1 S=16 Hq=32 Hkv=8 D=128, dtype bf16, seed 2355, RoPE"
std::string problem_text(const Problem& p);

/// One FP32 tensor dataset of the dump.
struct TensorInfo {
  std::string path;                 // "/cases/<case>/<leg>/<name>", "/inputs/q"
  std::vector<std::int64_t> shape;  // [B, H, S] or [B, H, S, D], every extent ≥ 1
  DumpAttributes attributes;        // in name order: shape, heads, original_dtype, …
  bool bf16 = false;                // original_dtype "bfloat16": BF16-exact values

  std::int64_t elements() const;
  /// The dataset's name within its case: "<leg>/<name>" ("candidate_fp32/out").
  std::string leg_path() const;
};

/// A case group: `/cases/<name>` (a prefill or chunked case) or `/paged_cases/<name>`.
struct CaseInfo {
  std::string name;
  bool paged = false;
  DumpAttributes attributes;
  CaseSpec spec;                     // prefill cases: read off the attributes
  std::vector<std::size_t> tensors;  // indices into DumpFile::tensors(), in path order
};

/// The run's problem as the root attributes state it.
struct DumpProblem {
  Problem problem;
  std::string schema_version, producer, created_at_utc, command;
};

/// An open, validated dump. Move-only; closes the file when destroyed.
class DumpFile {
 public:
  /// Opens and validates `path` (metadata only: tensors are read on demand). Throws
  /// InspectError: the file is missing, not HDF5, truncated, corrupted, or not a cpdrift dump.
  static DumpFile open(const std::string& path);
  /// The same for an HDF5 file image in memory (the fuzz target), which HDF5 copies; `name`
  /// stands for the file in messages.
  static DumpFile open_image(const void* data, std::size_t size, const std::string& name);

  DumpFile(DumpFile&&) noexcept;
  DumpFile& operator=(DumpFile&&) noexcept;
  ~DumpFile();

  const std::string& path() const;
  const DumpProblem& problem() const;
  const DumpAttributes& root_attributes() const;
  /// Prefill cases first (the report's `cases` order is kept: HDF5 name order), then paged.
  const std::vector<CaseInfo>& cases() const;
  const CaseInfo* find_case(const std::string& name) const;
  /// Every tensor dataset, sorted by path.
  const std::vector<TensorInfo>& tensors() const;
  /// The tensor at `path` ("/cases/x/candidate_fp32/out"), or null.
  const TensorInfo* find(const std::string& path) const;
  /// Its values in C order, as stored (FP32). Throws InspectError when HDF5 cannot read them.
  std::vector<float> read(const TensorInfo& tensor) const;
  /// The report the run wrote (`/report_json`), when the dump holds one.
  std::optional<std::string> report_json() const;

 private:
  struct Impl;
  explicit DumpFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpd::inspect
