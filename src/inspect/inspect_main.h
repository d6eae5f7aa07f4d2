// cpdrift-inspect: reads the HDF5 dumps cpdrift writes (`--dump PATH`) without MPI — list,
// summary, diff, export, plot (docs/inspect.md).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace cpd::inspect {

/// Exit statuses: 0 done (diff: the dumps agree), 1 diff: they differ, 2 an error (bad
/// arguments, a file that is missing, truncated, corrupted or not a cpdrift dump).
inline constexpr int kExitOk = 0;
inline constexpr int kExitDiffer = 1;
inline constexpr int kExitError = 2;

/// Runs the command line `args` (without the program name): results on `out`; an error as one
/// line `cpdrift-inspect: error: ...` on `err`. Never throws.
int inspect_main(const std::vector<std::string>& args, std::FILE* out, std::FILE* err);

}  // namespace cpd::inspect
