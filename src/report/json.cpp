#include "report/json.h"

#include <fcntl.h>
#include <locale.h>
#include <rapidjson/encodedstream.h>
#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/prettywriter.h>
#include <rapidjson/reader.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <utility>

#include "core/util/partial_files.h"

namespace cpd::json {
namespace {

[[noreturn]] void type_error(const char* wanted, Type got) {
  throw std::runtime_error(std::string("json: expected ") + wanted + ", got " + type_name(got));
}

// Writes `v`. A NaN or infinity (which JSON cannot represent) throws, naming its path (`path`:
// the members and indices from the root); the caller drops its buffer, so a bad value never
// leaves half a document.
template <typename Writer>
void emit(const Value& v, Writer& w, std::string& path) {
  using rapidjson::SizeType;
  const std::size_t mark = path.size();
  if (v.is_array()) {
    w.StartArray();
    for (std::size_t i = 0; i < v.size(); ++i) {
      // Appended piecewise: `"[" + std::to_string(i)` trips GCC 12's bogus -Wrestrict at -O3.
      path.push_back('[');
      path += std::to_string(i);
      path.push_back(']');
      emit(v.as_array()[i], w, path);
      path.resize(mark);
    }
    w.EndArray();
  } else if (v.is_object()) {
    w.StartObject();
    for (const auto& [key, member] : v.as_object()) {
      w.Key(key.data(), static_cast<SizeType>(key.size()));
      path.append(mark != 0 ? "." : "").append(key);
      emit(member, w, path);
      path.resize(mark);
    }
    w.EndObject();
  } else if (v.is_string()) {
    w.String(v.as_string().data(), static_cast<SizeType>(v.as_string().size()));
  } else if (v.type() == Type::int64) {
    w.Int64(v.as_int64());
  } else if (v.type() == Type::uint64) {
    w.Uint64(v.as_uint64());
  } else if (v.type() == Type::floating && std::isfinite(v.as_double())) {
    w.Double(v.as_double());
  } else if (v.type() == Type::floating) {
    throw std::invalid_argument("json: non-finite number (" + std::to_string(v.as_double()) +
                                ") at " + (path.empty() ? std::string("<root>") : path));
  } else if (v.is_bool()) {
    w.Bool(v.as_bool());
  } else {
    w.Null();
  }
}

// Builds a Value from RapidJSON's SAX events. Numbers arrive as their text
// (kParseNumbersAsStringsFlag) and are converted here, correctly rounded: RapidJSON 1.1.0's
// own full-precision path reads "0e308" as 1.9e289 and long runs of zeros wrongly
// (Tencent/rapidjson#1249, #1441; found by tests/fuzz/fuzz_json.cpp).
class Builder : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Builder> {
 public:
  // Deeper documents are refused: the Value tree is freed recursively.
  static constexpr std::size_t kMaxDepth = 512;

  bool Null() { return add(Value()); }
  bool Bool(bool b) { return add(Value(b)); }
  bool String(const char* s, rapidjson::SizeType n, bool) { return add(Value(std::string(s, n))); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    return add(number(std::string_view(s, n)));
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    keys_.emplace_back(s, n);
    return true;
  }
  bool StartObject() { return open(Value::object()); }
  bool EndObject(rapidjson::SizeType) { return close(); }
  bool StartArray() { return open(Value::array()); }
  bool EndArray(rapidjson::SizeType) { return close(); }

  Value take() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  Value number(std::string_view text) {
    const char* first = text.data();
    const char* last = first + text.size();
    if (text.find_first_of(".eE") == std::string_view::npos) {
      std::int64_t i = 0;
      if (std::from_chars(first, last, i).ec == std::errc()) return Value(i);
      std::uint64_t u = 0;
      if (std::from_chars(first, last, u).ec == std::errc()) return Value(u);
    }
    double d = 0;
    const auto [end, ec] = std::from_chars(first, last, d);
    if (ec == std::errc() && end == last) return Value(d);
    // Out of range: underflow reads as the nearest value (zero or subnormal); a value past
    // the largest double is refused (RapidJSON refuses an exponent past 308 itself). strtod_l
    // in the C locale: JSON's decimal point is '.' whatever the process's locale.
    static const locale_t c_locale = ::newlocale(LC_ALL_MASK, "C", locale_t{});
    const double nearest = ::strtod_l(std::string(text).c_str(), nullptr, c_locale);
    if (!std::isfinite(nearest)) {
      error_ = "number too big for a double: " + std::string(text);
      failed_ = true;
    }
    return Value(nearest);
  }

  bool add(Value v) {
    if (failed_) return false;
    if (stack_.empty()) {
      root_ = std::move(v);
    } else if (stack_.back().is_array()) {
      stack_.back().push_back(std::move(v));
    } else {
      // Last duplicate wins, as in Python's json module.
      stack_.back().as_object().insert_or_assign(std::move(keys_.back()), std::move(v));
      keys_.pop_back();
    }
    return true;
  }
  bool open(Value container) {
    if (stack_.size() == kMaxDepth) {
      error_ = "nested deeper than " + std::to_string(kMaxDepth) + " levels";
      return false;
    }
    stack_.push_back(std::move(container));
    return true;
  }
  bool close() {
    Value done = std::move(stack_.back());
    stack_.pop_back();
    return add(std::move(done));
  }

  std::vector<Value> stack_;
  std::vector<std::string> keys_;
  Value root_;
  std::string error_;
  bool failed_ = false;
};

}  // namespace

const char* type_name(Type type) {
  static constexpr const char* kNames[] = {"null",   "bool",   "int64", "uint64",
                                           "double", "string", "array", "object"};
  return kNames[static_cast<int>(type)];
}

bool Value::as_bool() const {
  if (!is_bool()) type_error("bool", type());
  return std::get<bool>(data_);
}

std::int64_t Value::as_int64() const {
  if (type() == Type::int64) return std::get<std::int64_t>(data_);
  if (type() == Type::uint64) throw std::runtime_error("json: integer does not fit int64");
  type_error("integer", type());
}

std::uint64_t Value::as_uint64() const {
  if (type() == Type::uint64) return std::get<std::uint64_t>(data_);
  if (type() != Type::int64) type_error("integer", type());
  const std::int64_t i = std::get<std::int64_t>(data_);
  if (i < 0) throw std::runtime_error("json: negative integer does not fit uint64");
  return static_cast<std::uint64_t>(i);
}

double Value::as_double() const {
  if (type() == Type::floating) return std::get<double>(data_);
  if (type() == Type::uint64) return static_cast<double>(std::get<std::uint64_t>(data_));
  if (type() != Type::int64) type_error("number", type());
  return static_cast<double>(std::get<std::int64_t>(data_));
}

const std::string& Value::as_string() const {
  if (!is_string()) type_error("string", type());
  return std::get<std::string>(data_);
}

const Array& Value::as_array() const {
  if (!is_array()) type_error("array", type());
  return std::get<Array>(data_);
}

Array& Value::as_array() { return const_cast<Array&>(std::as_const(*this).as_array()); }

const Object& Value::as_object() const {
  if (!is_object()) type_error("object", type());
  return std::get<Object>(data_);
}

Object& Value::as_object() { return const_cast<Object&>(std::as_const(*this).as_object()); }

Value& Value::operator[](const std::string& key) { return as_object()[key]; }

const Value& Value::at(const std::string& key) const {
  const Object& members = as_object();
  const auto it = members.find(key);
  if (it == members.end()) throw std::out_of_range("json: no member \"" + key + "\"");
  return it->second;
}

Value& Value::at(const std::string& key) {
  return const_cast<Value&>(std::as_const(*this).at(key));
}

bool Value::contains(const std::string& key) const { return as_object().count(key) > 0; }

const Value& Value::at(std::size_t index) const {
  const Array& elements = as_array();
  if (index >= elements.size()) {
    throw std::out_of_range("json: index " + std::to_string(index) + " out of range (size " +
                            std::to_string(elements.size()) + ")");
  }
  return elements[index];
}

Value& Value::at(std::size_t index) { return const_cast<Value&>(std::as_const(*this).at(index)); }

void Value::push_back(Value v) { as_array().push_back(std::move(v)); }

std::size_t Value::size() const {
  if (is_array()) return as_array().size();
  if (is_object()) return as_object().size();
  type_error("array or object", type());
}

std::string to_string(const Value& v, bool pretty) {
  std::string path;
  rapidjson::StringBuffer buffer;
  if (pretty) {
    rapidjson::PrettyWriter<rapidjson::StringBuffer> writer(buffer);
    writer.SetIndent(' ', 2);
    emit(v, writer, path);
  } else {
    rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
    emit(v, writer, path);
  }
  std::string out(buffer.GetString(), buffer.GetSize());
  if (pretty) out.push_back('\n');
  return out;
}

Value parse(std::string_view text) {
  Builder builder;
  rapidjson::Reader reader;
  rapidjson::MemoryStream bytes(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> stream(bytes);
  // Iterative: a deeply nested document cannot exhaust the stack while it is read.
  constexpr unsigned kFlags =
      rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseIterativeFlag;
  const rapidjson::ParseResult ok = reader.Parse<kFlags>(stream, builder);
  if (ok.IsError()) {
    throw std::runtime_error(
        "json: parse error at offset " + std::to_string(ok.Offset()) + ": " +
        (builder.error().empty() ? rapidjson::GetParseError_En(ok.Code()) : builder.error()));
  }
  return builder.take();
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = partial_path(path);
  int fd = -1;
  bool created = false;
  const auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (created) ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write \"" + path + "\": " + what + " \"" + tmp +
                             "\": " + std::strerror(err));
  };

  fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create temporary file");
  created = true;
  for (std::size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno != EINTR) fail("write failed on");
    if (n > 0) done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync failed on");
  // close() can report delayed write errors (e.g. on NFS), so it is checked too.
  const int closing = std::exchange(fd, -1);
  if (::close(closing) != 0) fail("close failed on");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename");

  // Make the rename itself durable. Best effort: some file systems refuse fsync on a
  // directory, and the new content is already in place either way.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace cpd::json
