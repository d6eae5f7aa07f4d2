// The HDF5 support that the dump writer (io/hdf5_dump.cpp), --inputs (inputs/hdf5_inputs.cpp),
// compare (compare/h5_columns.cpp) and cpdrift-inspect (inspect/dump_reader.cpp) share: owned ids,
// HDF5's error printing off and its error stack read into one line, files opened read-only, a
// dataset's type, shape and values, a group's members, scalar attributes. Only sources built with
// HDF5 include it, and with it <hdf5.h>.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "io/tensor_dump.h"

namespace cpd::h5 {

/// Owns one HDF5 id (file, group, dataset, attribute, type, space, property list).
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)) {}
  Handle& operator=(Handle&& o) noexcept {
    close();
    id_ = std::exchange(o.id_, -1);
    return *this;
  }
  ~Handle() { close(); }
  hid_t get() const { return id_; }
  /// Closes the id now; the close's status (a close can be where buffered data is written).
  herr_t close();

 private:
  hid_t id_ = -1;
};

/// A file HDF5 cannot read as asked (not HDF5, truncated, corrupted, an object missing or of the
/// wrong kind): one line naming the file and HDF5's reason. Bad input: a UsageError.
class FileError : public UsageError {
 public:
  using UsageError::UsageError;
};

/// Turns HDF5's automatic error printing off, for good: every caller reports failures itself.
void silence_errors();

/// For CPD_H5_CHECK (code that writes: the dump): a LibraryError naming `call` and where it was
/// made, with HDF5's error stack as one line.
[[noreturn]] void throw_call_error(const char* call, const char* file, int line);

/// Opens `path` read-only (file locking off: a reader never writes). FileError: not HDF5 ("no
/// HDF5 superblock"), truncated ("the file has N bytes, its superblock says M") or corrupted.
Handle open_file(const std::string& path);
/// The same for a file image in memory (HDF5 copies it); `name` stands for it in messages.
Handle open_image(const void* data, std::size_t size, const std::string& name);

/// Whether `loc` has a link at `path` (false when a group on the way is missing too).
bool exists(hid_t loc, const std::string& path);

template <class T>
hid_t native_type() {
  return std::is_same_v<T, float>          ? H5T_NATIVE_FLOAT
         : std::is_same_v<T, double>       ? H5T_NATIVE_DOUBLE
         : std::is_same_v<T, std::int64_t> ? H5T_NATIVE_INT64
                                           : H5T_NATIVE_UINT16;
}

/// A dataset of a file being read: its type, shape, attributes and values, converted to what is
/// asked (HDF5 converts any integer or float type). Each failure is a FileError naming it.
class Dataset {
 public:
  Dataset(hid_t loc, const std::string& path, const std::string& file);

  hid_t get() const { return id_.get(); }
  H5T_class_t type_class() const { return class_; }
  std::size_t type_size() const { return size_; }
  /// Its extents ([] for a scalar).
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::size_t elements() const;

  /// Every value, in C order.
  template <class T>
  std::vector<T> read() const {
    std::vector<T> values(elements());
    if (!values.empty()) read_into(native_type<T>(), nullptr, nullptr, values.data());
    return values;
  }
  /// The block at `start` of `count` extents (one of each axis), in C order, into `out`.
  template <class T>
  void read_block(const hsize_t* start, const hsize_t* count, T* out) const {
    read_into(native_type<T>(), start, count, out);
  }
  /// Its text, when it is a scalar fixed-length string (else a FileError).
  std::string read_text() const;
  /// Its attribute `name`, or nothing when it has none: a scalar string (fixed or variable length),
  /// an integer (or an enum: h5py's booleans) as int64, a float as double; any other kind is a
  /// FileError.
  std::optional<DumpValue> attribute(const std::string& name) const;

 private:
  void read_into(hid_t mem_type, const hsize_t* start, const hsize_t* count, void* out) const;

  std::string path_, file_;
  Handle id_;
  H5T_class_t class_ = H5T_NO_CLASS;
  std::size_t size_ = 0;
  bool variable_ = false, scalar_ = false;
  std::vector<std::int64_t> shape_;
};

enum class Kind { group, dataset, other };
struct Member {
  std::string name;
  Kind kind = Kind::other;
};
/// The members of group `path` in name order; soft and external links are refused (cpdrift
/// writes none, and following one would open another file).
std::vector<Member> members(hid_t file, const std::string& path, const std::string& file_name);

/// Every attribute of the object at `path`, in name order, read as Dataset::attribute reads one.
DumpAttributes read_attributes(hid_t file, const std::string& path, const std::string& file_name);

/// Writes a scalar attribute as Dataset::attribute reads it (CPD_H5_CHECK).
void write_attribute(hid_t object, const std::string& name, const DumpValue& value);

}  // namespace cpd::h5

// CPD_H5_CHECK: every HDF5 call of code that writes checked, one shape for every library: a
// negative id or status becomes a LibraryError with HDF5's messages.
#define CPD_H5_CHECK(call)                                                          \
  ([&]() {                                                                          \
    const auto cpd_h5_result_ = (call);                                             \
    if (cpd_h5_result_ < 0) ::cpd::h5::throw_call_error(#call, __FILE__, __LINE__); \
    return cpd_h5_result_;                                                          \
  }())
