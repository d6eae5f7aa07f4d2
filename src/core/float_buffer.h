// FloatBuffer: a vector of floats that a producer fills whole, so growing it does not clear it
// first (a partial state's payload, a shard's rows).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

namespace cpd {

/// The whole 2 MiB pages inside [address, address + bytes), as [begin, end) (empty when
/// begin == end), for buffers of 4 MiB and more; none for smaller ones.
struct HugePageSpan {
  std::uintptr_t begin = 0, end = 0;
};
HugePageSpan huge_page_span(std::uintptr_t address, std::size_t bytes) noexcept;

/// Asks the kernel to back huge_page_span(p, bytes) with transparent huge pages (madvise
/// MADV_HUGEPAGE): at S = 32768 a kernel streams 16 MB of K and of V per head, and on 4 KiB
/// pages every 4 KiB costs a TLB miss and, when first touched, a page fault. A hint: nothing
/// changes where the system does not offer it.
void advise_huge_pages(void* p, std::size_t bytes) noexcept;

/// std::allocator, except that a vector grown without a value leaves its new elements
/// uninitialised (default-initialised), so a buffer that a kernel fills whole is written once,
/// not cleared first; and that large buffers ask for huge pages (advise_huge_pages) before
/// anything touches them.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    T* p = std::allocator<T>::allocate(n);
    advise_huge_pages(p, n * sizeof(T));
    return p;
  }
  /// Without a value: default-initialised. With one, allocator_traits constructs as usual.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
};

/// Floats whose growth without a value leaves them unwritten (see DefaultInitAllocator).
using FloatBuffer = std::vector<float, DefaultInitAllocator<float>>;

/// Marks `b` as not yet written: nothing, except in a sanitized build (CPD_POISON_UNINITIALIZED),
/// where it is filled with NaN, so an element its producer failed to write shows in the
/// results instead of passing unseen with whatever the memory held.
inline void mark_unwritten([[maybe_unused]] FloatBuffer& b) {
#if defined(CPD_POISON_UNINITIALIZED)
  std::fill(b.begin(), b.end(), std::numeric_limits<float>::quiet_NaN());
#endif
}

/// `n` floats for a producer that writes every one (see mark_unwritten).
inline FloatBuffer unwritten_floats(std::size_t n) {
  FloatBuffer b(n);
  mark_unwritten(b);
  return b;
}

}  // namespace cpd
