// The GPU transports' host-side decisions, compiled in every build so they are tested
// everywhere.
#include <algorithm>
#include <map>

#include "comm/gpu_transports.h"
#include "core/errors.h"

namespace cpd {

std::string shared_device_error(const std::vector<std::string>& device_ids) {
  std::map<std::string, std::vector<int>> users;
  for (std::size_t p = 0; p < device_ids.size(); ++p)
    users[device_ids[p]].push_back(static_cast<int>(p));
  for (const auto& [id, procs] : users) {
    if (procs.size() < 2) continue;
    std::string list;
    for (const int p : procs) list += (list.empty() ? "" : ", ") + std::to_string(p);
    return "processes " + list + " share one GPU, which NCCL refuses (one rank per GPU)";
  }
  return "";
}

std::uint64_t exchange_rounds(std::span<const std::uint64_t> sizes, std::uint64_t slot_bytes) {
  const std::uint64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  return (largest + slot_bytes - 1) / slot_bytes;
}

std::uint64_t window_slot_bytes(std::uint64_t window_bytes, int world) {
  const std::uint64_t slot =
      window_bytes / static_cast<std::uint64_t>(std::max(1, world)) / 256 * 256;
  if (slot == 0) {
    throw UsageError("--staging-mib: a window of " + std::to_string(window_bytes) +
                     " bytes leaves no slot for " + std::to_string(world) + " processes");
  }
  return slot;
}

}  // namespace cpd
