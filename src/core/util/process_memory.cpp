#include "core/util/process_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace cpd {
namespace {

std::string gigabytes(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", static_cast<double>(bytes) * 1e-9);
  return text;
}

// A number of bytes from a one-line file; false when absent or "max".
bool read_bytes(const char* path, std::uint64_t& out) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word == "max") return false;
  try {
    out = std::stoull(word);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The number after `key` on a line of `path` ("key value ..."); false when absent.
bool read_field(const char* path, const std::string& key, std::uint64_t& out) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string k;
    std::uint64_t v = 0;
    if (in >> k >> v && k == key) {
      out = v;
      return true;
    }
  }
  return false;
}

}  // namespace

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0 || usage.ru_maxrss < 0) return 0;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports kibibytes
}

MemoryBudget memory_budget(int processes_on_node) {
  const std::uint64_t share = static_cast<std::uint64_t>(std::max(1, processes_on_node));
  const std::string shared = share == 1 ? "" : " shared by " + std::to_string(share) + " processes";
  MemoryBudget best;
  const auto consider = [&](std::uint64_t bytes, const std::string& source) {
    if (best.bytes == 0 || bytes < best.bytes) best = MemoryBudget{bytes, source};
  };
  if (std::uint64_t kib = 0; read_field("/proc/meminfo", "MemAvailable:", kib))
    consider(kib * 1024 / share, "MemAvailable " + gigabytes(kib * 1024) + shared);
  // cgroup v2, then v1 (a v1 "unlimited" is a huge number, which never binds). What it uses
  // less its inactive file pages (the kernel reclaims those before it refuses memory).
  std::uint64_t limit = 0, used = 0, reclaimable = 0;
  if (read_bytes("/sys/fs/cgroup/memory.max", limit)) {
    read_bytes("/sys/fs/cgroup/memory.current", used);
    read_field("/sys/fs/cgroup/memory.stat", "inactive_file", reclaimable);
  } else if (read_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit)) {
    read_bytes("/sys/fs/cgroup/memory/memory.usage_in_bytes", used);
    read_field("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file", reclaimable);
  }
  used = used > reclaimable ? used - reclaimable : 0;
  if (limit > 0) {
    const std::uint64_t left = limit > used ? limit - used : 0;
    consider(left / share, "the cgroup's memory limit " + gigabytes(limit) + " (" +
                               gigabytes(used) + " in use)" + shared);
  }
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    consider(static_cast<std::uint64_t>(as.rlim_cur),
             "the address-space limit (ulimit -v) " + gigabytes(as.rlim_cur));
  }
  return best;
}

}  // namespace cpd
