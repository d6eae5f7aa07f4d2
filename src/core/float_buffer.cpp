#include "core/float_buffer.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cpd {

HugePageSpan huge_page_span(std::uintptr_t address, std::size_t bytes) noexcept {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return {};
  // Only whole huge pages inside the buffer: the advice never reaches a neighbour's memory.
  return HugePageSpan{(address + kHuge - 1) & ~(kHuge - 1), (address + bytes) & ~(kHuge - 1)};
}

void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const HugePageSpan span = huge_page_span(reinterpret_cast<std::uintptr_t>(p), bytes);
  // A failure (a kernel without THP) leaves the buffer on 4 KiB pages, as it was.
  if (span.end > span.begin)
    madvise(reinterpret_cast<void*>(span.begin), span.end - span.begin, MADV_HUGEPAGE);
#endif
}

}  // namespace cpd
