// An enum's spellings in one table, so that to_string and the parsers read the same names.
#pragma once

#include <cstddef>

namespace cpd {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

/// The name of `value` in `table`; "?" for a value the table lacks (every one should be there).
template <class E, std::size_t N>
constexpr const char* name_of(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& e : table) {
    if (e.value == value) return e.name;
  }
  return "?";
}

}  // namespace cpd
