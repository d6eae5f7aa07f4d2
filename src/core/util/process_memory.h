// What this process has used of the machine's memory, and what it may use.
#pragma once

#include <cstdint>
#include <string>

namespace cpd {

/// The process's peak resident set so far, in bytes (getrusage's ru_maxrss: what
/// `/usr/bin/time -f %M` prints, times 1024). 0 where the system does not say.
std::uint64_t peak_rss_bytes();

/// The memory one of `processes_on_node` processes may count on, and what limits it.
struct MemoryBudget {
  std::uint64_t bytes = 0;  // 0: nothing known
  std::string source;       // e.g. "MemAvailable 21.3 GB shared by 4 processes"
};

/// The least of: the node's MemAvailable (/proc/meminfo) and the cgroup's memory limit less
/// what the cgroup already uses (its inactive file pages not counted), each shared evenly by
/// the node's processes; and this process's address-space limit (RLIMIT_AS, ulimit -v).
MemoryBudget memory_budget(int processes_on_node);

}  // namespace cpd
