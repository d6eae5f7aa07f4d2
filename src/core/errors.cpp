#include "core/errors.h"

#include <unistd.h>

#include <atomic>

#include "core/util/partial_files.h"

namespace cpd {
namespace {

std::atomic<int> error_rank{-1};

}  // namespace

void set_error_rank(int rank) { error_rank = rank; }

void throw_library_error(const char* library, const char* call, const std::string& decoded,
                         const char* file, int line) {
  throw LibraryError(library, host_name() + " rank " + std::to_string(error_rank.load()) + " " +
                                  file + ":" + std::to_string(line) + ": " + call +
                                  " failed: " + decoded);
}

}  // namespace cpd
