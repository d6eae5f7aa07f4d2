// A small JSON value model for building reports, serialised with RapidJSON.
//
// Objects are std::map, so keys always come out sorted by byte order at every depth, exactly
// like Python's json.dumps(sort_keys=True); reports are therefore byte-stable and hashable.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace cpd::json {

class Value;
using Array = std::vector<Value>;
using Object = std::map<std::string, Value>;

enum class Type { null, boolean, int64, uint64, floating, string, array, object };

/// Character types are excluded so that `Value('x')` does not silently become a number.
template <typename T>
concept JsonInteger = std::integral<T> && !std::same_as<T, bool> && !std::same_as<T, char> &&
                      !std::same_as<T, wchar_t> && !std::same_as<T, char8_t> &&
                      !std::same_as<T, char16_t> && !std::same_as<T, char32_t>;

class Value {
  using Storage = std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, double,
                               std::string, Array, Object>;

 public:
  Value() = default;
  Value(std::nullptr_t) {}
  // A template so that pointers (which convert to bool) do not silently pick this overload.
  template <std::same_as<bool> B>
  Value(B b) : data_(b) {}
  // Unsigned values that fit int64 are stored as int64 so that a value built from size_t
  // compares equal to the same number parsed back from text.
  template <JsonInteger I>
  Value(I i) : data_(from_integer(i)) {}
  template <std::floating_point F>
  Value(F f) : data_(static_cast<double>(f)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(Array a) : data_(std::move(a)) {}
  Value(Object o) : data_(std::move(o)) {}

  static Value object() { return Value(Object{}); }
  static Value array() { return Value(Array{}); }

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_null() const { return type() == Type::null; }
  bool is_bool() const { return type() == Type::boolean; }
  bool is_integer() const { return type() == Type::int64 || type() == Type::uint64; }
  bool is_number() const { return is_integer() || type() == Type::floating; }
  bool is_string() const { return type() == Type::string; }
  bool is_array() const { return type() == Type::array; }
  bool is_object() const { return type() == Type::object; }

  // Accessors throw std::runtime_error on a type mismatch or an out-of-range integer.
  bool as_bool() const;
  std::int64_t as_int64() const;
  std::uint64_t as_uint64() const;
  double as_double() const;  ///< Any number; integers are converted.
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  /// Object member access; operator[] inserts null when the key is missing, at() throws.
  Value& operator[](const std::string& key);
  const Value& at(const std::string& key) const;
  Value& at(const std::string& key);
  bool contains(const std::string& key) const;
  /// Array element access; throws std::out_of_range.
  const Value& at(std::size_t index) const;
  Value& at(std::size_t index);
  void push_back(Value v);
  /// Number of elements or members; throws for scalars.
  std::size_t size() const;

  friend bool operator==(const Value&, const Value&) = default;

 private:
  // Built in the initialiser list: assigning in the constructor body makes GCC 12 report a
  // spurious -Wmaybe-uninitialized for the variant it resets.
  template <JsonInteger I>
  static Storage from_integer(I i) {
    if constexpr (std::is_unsigned_v<I>) {
      if (static_cast<std::uint64_t>(i) > static_cast<std::uint64_t>(INT64_MAX)) {
        return Storage(std::in_place_type<std::uint64_t>, static_cast<std::uint64_t>(i));
      }
    }
    return Storage(std::in_place_type<std::int64_t>, static_cast<std::int64_t>(i));
  }

  Storage data_;
};

const char* type_name(Type type);

/// `o`'s value, or null when it is empty.
template <typename T>
Value nullable(const std::optional<T>& o) {
  return o ? Value(*o) : Value(nullptr);
}

/// The array of `f(x)` for each x of `range`, in order (of x itself without `f`).
template <typename Range, typename F = std::identity>
Value array_of(const Range& range, F f = {}) {
  Array a;
  for (const auto& x : range) a.emplace_back(f(x));
  return a;
}

/// Serialises `v`. pretty: two-space indent and a trailing newline; compact: no whitespace at
/// all and no newline. Throws std::invalid_argument naming the path (e.g. `cases[3].out.max`)
/// of the first NaN or infinity, which JSON cannot represent.
std::string to_string(const Value& v, bool pretty = true);

/// Parses one JSON document; throws std::runtime_error with the byte offset on malformed input.
/// Integers that fit int64 or uint64 stay integers, all other numbers become doubles.
Value parse(std::string_view text);

/// Replaces `path` with `content` atomically (temp file in the same directory, fsync, rename),
/// so readers never see a partial report. Throws std::runtime_error naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace cpd::json
