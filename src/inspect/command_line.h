// cpdrift-inspect: reads the HDF5 dumps cpdrift writes (`--dump PATH`) without MPI — list,
// summary, diff, export, plot (docs/inspect.md). Its command line, its subcommands and what they
// share to print and write.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "metrics/diff_stats.h"

namespace cpd::inspect {

/// Exit statuses: 0 done (diff: the dumps agree), 1 diff: they differ, 2 an error (bad
/// arguments, a file that is missing, truncated, corrupted or not a cpdrift dump).
inline constexpr int kExitOk = 0;
inline constexpr int kExitDiffer = 1;
inline constexpr int kExitError = 2;

/// Runs the command line `args` (without the program name): results on `out`; an error as one
/// line `cpdrift-inspect: error: ...` on `err`. Never throws.
int inspect_main(const std::vector<std::string>& args, std::FILE* out, std::FILE* err);

/// One subcommand's parsed arguments.
struct Arguments {
  std::string command;                // "list", "summary", "diff", "export", "plot"
  std::vector<std::string> operands;  // files, tensor names
  std::map<std::string, std::vector<std::string>> options;  // "--atol" → its values
  bool json = false;

  /// The last value of `name`, if given.
  std::optional<std::string> value(const std::string& name) const;
  /// Every value of `name`, in order (a repeatable option: --case).
  std::vector<std::string> values(const std::string& name) const;
};

// The subcommands; each returns the exit status.
int list_command(const Arguments& a, std::FILE* out);
int summary_command(const Arguments& a, std::FILE* out);
int diff_command(const Arguments& a, std::FILE* out);
int export_command(const Arguments& a, std::FILE* out);
int plot_command(const Arguments& a, std::FILE* out);

/// "1.234e-05" (printf %.3e).
std::string sci(double value);
/// sci(max |diff|), or "nonfinite" when the statistics are not finite.
std::string max_abs_text(const DiffStats& s);
/// The threads a subcommand measures with: the machine's, at least 1 and at most 16.
int measure_threads();

/// The bytes of a .npy file holding `values` ('<f4': little-endian FP32) in C order with
/// `shape`: the magic "\x93NUMPY", version 1.0, a little-endian uint16 header length, the header
/// dict padded with spaces to a multiple of 64 bytes and ended by '\n', then the data.
/// numpy.load reads it back as an array of that shape and dtype float32.
std::string npy_bytes(std::span<const float> values, const std::vector<std::int64_t>& shape);

}  // namespace cpd::inspect
