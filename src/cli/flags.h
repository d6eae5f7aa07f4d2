// The command line's pieces, read the same way by every command: numbers within their range,
// comma lists, names from an enum's table, and the walk over argv that hands each flag its value.
// Every refusal is a UsageError of one line naming the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/fault_injection.h"
#include "core/errors.h"

namespace cpd {

[[noreturn]] inline void bad(const std::string& what) { throw UsageError(what); }

/// Refuses `value` outside [min, max], saying the range and `why` it is so:
/// "--threads: must be from 1 to N (4 per CPU; …), got 100000".
void check_range(const std::string& flag, std::int64_t value, std::int64_t min, std::int64_t max,
                 const std::string& why = "");

/// A decimal integer of `Int` within [min, max] (`why`: as check_range's).
template <class Int>
Int parse_int(const std::string& flag, const std::string& text, Int min,
              Int max = std::numeric_limits<Int>::max(), const std::string& why = "");

/// Where a real number may lie: [min, max], either end open when `above_min` / `below_max`;
/// `why` (shown when refused) says where the range comes from.
struct NumberRange {
  double min = 0, max = std::numeric_limits<double>::max();
  bool above_min = false, below_max = false;
  const char* why = "";
};

/// A finite decimal number within `range`.
double parse_number(const std::string& flag, const std::string& text, const NumberRange& range);

/// The items of a comma list; an empty item is refused.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);

/// --kv-chunk-sizes: split sizes of at least 1, or none/full/no_split (disabled), each once.
std::vector<std::optional<std::int64_t>> parse_splits(const std::string& flag,
                                                      const std::string& text);

/// --inject-fault KIND@RANK[:WHEN].
FaultSpec parse_fault(const std::string& flag, const std::string& text);

/// A comma list, each item read by `parse`. An item given twice would run (or name) the same
/// thing twice: refused, with the item, once every item has been read.
template <class T, class Parse>
std::vector<T> parse_list(const std::string& flag, const std::string& text, Parse parse) {
  const std::vector<std::string> items = split_list(flag, text);
  std::vector<T> values;
  for (const std::string& item : items) values.push_back(parse(item));
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (values[i] == values[j])
        bad(flag + ": '" + items[i] + "' repeats '" + items[j] + "' (each item once)");
    }
  }
  return values;
}

/// One name from an enum's table (the spellings to_string prints); an unknown name is refused
/// with the list of known ones.
template <class T, std::size_t N>
T parse_name(const std::string& flag, const std::string& item, const char* what,
             const EnumName<T> (&table)[N]) {
  for (const EnumName<T>& e : table) {
    if (item == e.name) return e.value;
  }
  std::string known;
  for (const EnumName<T>& e : table) known += (known.empty() ? "" : ", ") + std::string(e.name);
  bad(flag + ": unknown " + what + " '" + item + "' (" + known + ")");
}

/// Walks argv, handing each flag's value (from `--flag value` or `--flag=value`) to its setter.
class FlagReader {
 public:
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;

  void value(const std::string& name, Setter s) { values_[name] = std::move(s); }
  void toggle(const std::string& name, std::function<void()> s) { toggles_[name] = std::move(s); }
  /// A file's path, into `slot`; an empty one is refused.
  void path(const std::string& name, std::string& slot);
  /// An integer of `Int` within [min, max] (parse_int), into `slot`; with `integers`, a comma
  /// list of them (parse_list).
  template <class Int, class Slot>
  void integer(const std::string& name, Slot& slot, Int min,
               Int max = std::numeric_limits<Int>::max(), const std::string& why = "") {
    value(name, [&slot, min, max, why](const std::string& f, const std::string& v) {
      slot = parse_int<Int>(f, v, min, max, why);
    });
  }
  void integers(const std::string& name, std::vector<int>& slot, int min,
                int max = std::numeric_limits<int>::max(), const std::string& why = "") {
    value(name, [&slot, min, max, why](const std::string& f, const std::string& v) {
      slot = parse_list<int>(
          f, v, [&](const std::string& item) { return parse_int<int>(f, item, min, max, why); });
    });
  }
  /// A finite number within `range` (parse_number), into `slot`.
  template <class Slot>
  void number(const std::string& name, Slot& slot, const NumberRange& range) {
    value(name, [&slot, range](const std::string& f, const std::string& v) {
      slot = parse_number(f, v, range);
    });
  }
  /// One name of `table` (parse_name), or a comma list of them (parse_list).
  template <class T, std::size_t N>
  void name(const std::string& flag, T& slot, const char* what, const EnumName<T> (&table)[N]) {
    value(flag, [&slot, what, &table](const std::string& f, const std::string& v) {
      slot = parse_name(f, v, what, table);
    });
  }
  template <class T, std::size_t N>
  void names(const std::string& flag, std::vector<T>& slot, const char* what,
             const EnumName<T> (&table)[N]) {
    value(flag, [&slot, what, &table](const std::string& f, const std::string& v) {
      slot = parse_list<T>(
          f, v, [&](const std::string& item) { return parse_name(f, item, what, table); });
    });
  }
  /// Where arguments that are not flags go (a command's files); without it they are refused.
  void positional(std::function<void(const std::string&)> take) { positional_ = std::move(take); }

  /// Reads args[first..]; an unknown flag, a missing value or a stray argument is refused.
  void read(const std::vector<std::string>& args, std::size_t first);
  /// The first of `names` that the arguments read gave, in their order; "" when none.
  std::string first_given(std::initializer_list<const char*> names) const;
  bool given(const char* name) const { return !first_given({name}).empty(); }

 private:
  std::map<std::string, Setter> values_;
  std::map<std::string, std::function<void()>> toggles_;
  std::function<void(const std::string&)> positional_;
  std::vector<std::string> given_;  // the flags read, in order
};

}  // namespace cpd
