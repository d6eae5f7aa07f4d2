// Half-open index ranges [begin, end) over sequence positions, heads or elements.
#pragma once

#include <cstdint>
#include <vector>

namespace cpd {

struct Range {
  std::int64_t begin = 0;
  std::int64_t end = 0;

  std::int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool contains(std::int64_t i) const { return begin <= i && i < end; }
  bool contains(const Range& r) const { return begin <= r.begin && r.end <= end; }
  friend bool operator==(const Range&, const Range&) = default;
  friend auto operator<=>(const Range&, const Range&) = default;
};

/// Total length of a list of ranges.
inline std::int64_t total_size(const std::vector<Range>& ranges) {
  std::int64_t n = 0;
  for (const Range& r : ranges) n += r.size();
  return n;
}

}  // namespace cpd
