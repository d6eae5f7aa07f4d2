#include "cpdrift/util/process_memory.h"

#include <sys/resource.h>

namespace cpd {

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0 || usage.ru_maxrss < 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports kibibytes
}

}  // namespace cpd
