// What this process has used of the machine's memory.
#pragma once

#include <cstdint>

namespace cpd {

/// The process's peak resident set so far, in bytes (getrusage's ru_maxrss: what
/// `/usr/bin/time -f %M` prints, times 1024). 0 where the system does not say.
std::uint64_t peak_rss_bytes();

}  // namespace cpd
