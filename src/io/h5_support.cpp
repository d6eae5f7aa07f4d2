#include "io/h5_support.h"

#include <algorithm>
#include <cstring>

#include "io/hdf5_info.h"

namespace cpd {

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

namespace h5 {
namespace {

// HDF5's error stack, walked upward: from the most specific description of the failure to the
// API call's own.
herr_t take_message(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc != nullptr && *e->desc != '\0')
    static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
  return 0;
}

// The operating system's words for a failed read or write in HDF5's stack ("No space left on
// device", "File too large"): its file drivers put them in as "error message = '…'", within a
// description that spans lines and says no more.
std::string os_error(const std::vector<std::string>& stack) {
  static const std::string kMarker = "error message = '";
  for (const std::string& m : stack) {
    const std::size_t at = m.find(kMarker);
    if (at == std::string::npos) continue;
    const std::size_t begin = at + kMarker.size(), end = m.find('\'', begin);
    return m.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  return "";
}

// HDF5's error stack as one line, then cleared: what the call was doing, then what was wrong
// (the innermost message, or the system's reason): "unable to create dataset: name already
// exists", "…: No space left on device"; "" when the stack is empty.
std::string error_stack_text() {
  std::vector<std::string> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_message, &stack);
  H5Eclear2(H5E_DEFAULT);
  if (stack.empty()) return "";
  std::string why = os_error(stack);
  if (why.empty() && stack.front() != stack.back()) why = stack.front();
  std::string text = why.empty() ? stack.back() : stack.back() + ": " + why;
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

// `id` (or a status) when not negative, else FileError("<file>: <what> (HDF5: <the stack>)").
hid_t checked(hid_t id, const std::string& file, const std::string& what) {
  if (id >= 0) return id;
  const std::string why = error_stack_text();
  throw FileError(file + ": " + what + (why.empty() ? "" : " (HDF5: " + why + ")"));
}

// Opens `name` read-only through `fapl`; why H5Fopen refused it otherwise, from its error stack:
// a truncated file says how much is missing.
Handle open_with(const std::string& name, hid_t fapl) {
  const hid_t file = H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl);
  if (file >= 0) return Handle(file);
  const std::string why = error_stack_text();
  if (why.find("truncated file") != std::string::npos) {
    // HDF5 1.10–1.14: "truncated file: eof = 800, sblock->base_addr = 0, stored_eof = 2048".
    const auto number_after = [&](const std::string& key) -> std::string {
      const std::size_t at = why.find(key);
      if (at == std::string::npos) return "";
      const std::size_t begin = at + key.size();
      return why.substr(begin, why.find_first_not_of("0123456789", begin) - begin);
    };
    const std::string has = number_after("eof = "), wants = number_after("stored_eof = ");
    if (!has.empty() && !wants.empty())
      throw FileError(name + ": truncated: the file has " + has + " bytes, its superblock says " +
                      wants);
    throw FileError(name + ": truncated (HDF5: " + why + ")");
  }
  throw FileError(name + ": cannot be opened as HDF5, corrupted? (HDF5: " +
                  (why.empty() ? "no reason given" : why) + ")");
}

// A fixed-length string of `size` bytes, read by `read(memory type, buffer)` into a buffer one
// byte longer, so that it ends in a NUL whatever its padding.
template <class Read>
std::string fixed_string(std::size_t size, const std::string& file, const std::string& what,
                         Read&& read) {
  const std::string cannot = "cannot read " + what;
  const Handle mem(checked(H5Tcopy(H5T_C_S1), file, cannot));
  checked(H5Tset_size(mem.get(), size + 1), file, cannot);
  checked(H5Tset_strpad(mem.get(), H5T_STR_NULLTERM), file, cannot);
  std::string text(size + 1, '\0');
  checked(read(mem.get(), text.data()), file, cannot);
  text.resize(std::strlen(text.c_str()));
  return text;
}

// An attribute larger than this is not one cpdrift writes (HDF5 keeps them under 64 KiB unless
// stored densely); refusing it bounds what a corrupted size can make us allocate.
constexpr std::size_t kMaxAttributeBytes = std::size_t{1} << 20;

// Attribute `name` of `object` (at `path`), a scalar string or number.
DumpValue read_scalar(hid_t object, const std::string& name, const std::string& path,
                      const std::string& file) {
  const std::string what = "attribute " + name + " of " + path;
  const Handle attr(
      checked(H5Aopen(object, name.c_str(), H5P_DEFAULT), file, "cannot open " + what));
  const Handle space(checked(H5Aget_space(attr.get()), file, what));
  if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
    throw FileError(file + ": " + what + " is not a scalar");
  const Handle type(checked(H5Aget_type(attr.get()), file, what));
  const H5T_class_t cls = H5Tget_class(type.get());
  const auto number = [&](auto value, hid_t mem) -> DumpValue {
    checked(H5Aread(attr.get(), mem, &value), file, "cannot read " + what);
    return value;
  };
  if (cls == H5T_INTEGER || cls == H5T_ENUM) return number(std::int64_t{0}, H5T_NATIVE_INT64);
  if (cls == H5T_FLOAT) return number(0.0, H5T_NATIVE_DOUBLE);
  if (cls != H5T_STRING) throw FileError(file + ": " + what + " is neither a string nor a number");
  if (H5Tis_variable_str(type.get()) > 0) {  // what h5py writes for a str
    const Handle mem(checked(H5Tcopy(H5T_C_S1), file, what));
    checked(H5Tset_size(mem.get(), H5T_VARIABLE), file, what);
    checked(H5Tset_cset(mem.get(), H5Tget_cset(type.get())), file, what);  // h5py's is UTF-8
    char* text = nullptr;
    checked(H5Aread(attr.get(), mem.get(), &text), file, "cannot read " + what);
    const std::string value = text == nullptr ? "" : text;
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > kMaxAttributeBytes)
    throw FileError(file + ": " + what + " has an implausible size (" + std::to_string(size) +
                    " bytes)");
  return fixed_string(size, file, what,
                      [&](hid_t mem, char* out) { return H5Aread(attr.get(), mem, out); });
}

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* out) {
  static_cast<std::vector<std::pair<std::string, H5L_type_t>>*>(out)->emplace_back(name,
                                                                                   info->type);
  return 0;
}

herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

}  // namespace

herr_t Handle::close() {
  const hid_t id = std::exchange(id_, -1);
  if (id < 0) return 0;
  const H5I_type_t type = H5Iget_type(id);
  return type == H5I_FILE          ? H5Fclose(id)
         : type == H5I_DATASET     ? H5Dclose(id)
         : type == H5I_ATTR        ? H5Aclose(id)
         : type == H5I_DATATYPE    ? H5Tclose(id)
         : type == H5I_DATASPACE   ? H5Sclose(id)
         : type == H5I_GENPROP_LST ? H5Pclose(id)
                                   : H5Oclose(id);  // a group
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void throw_call_error(const char* call, const char* file, int line) {
  const std::string why = error_stack_text();
  throw_library_error("HDF5", call, why.empty() ? "unknown HDF5 error" : why, file, line);
}

Handle open_file(const std::string& path) {
  silence_errors();
  const Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), path, "cannot open"));
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl.get(), false, true);
#endif
#if H5_VERSION_GE(1, 12, 0)
  const htri_t hdf5 = H5Fis_accessible(path.c_str(), fapl.get());
#else
  const htri_t hdf5 = H5Fis_hdf5(path.c_str());
#endif
  if (hdf5 <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw FileError(path + ": not an HDF5 file (no HDF5 superblock)");
  }
  return open_with(path, fapl.get());
}

Handle open_image(const void* data, std::size_t size, const std::string& name) {
  silence_errors();
  const Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), name, "cannot open"));
  checked(H5Pset_fapl_core(fapl.get(), 64 * 1024, false), name, "cannot open");
  // HDF5 copies the image: the const_cast only meets its signature.
  checked(H5Pset_file_image(fapl.get(), const_cast<void*>(data), size), name, "cannot open");
  return open_with(name, fapl.get());
}

bool exists(hid_t loc, const std::string& path) {
  return H5Lexists(loc, path.c_str(), H5P_DEFAULT) > 0;
}

Dataset::Dataset(hid_t loc, const std::string& path, const std::string& file)
    : path_(path),
      file_(file),
      id_(checked(H5Dopen2(loc, path.c_str(), H5P_DEFAULT), file, "cannot open dataset " + path)) {
  const std::string what = "cannot read " + path;
  const Handle type(checked(H5Dget_type(id_.get()), file, what));
  class_ = H5Tget_class(type.get());
  size_ = H5Tget_size(type.get());
  variable_ = H5Tis_variable_str(type.get()) > 0;
  const Handle space(checked(H5Dget_space(id_.get()), file, what));
  scalar_ = H5Sget_simple_extent_type(space.get()) == H5S_SCALAR;
  std::vector<hsize_t> dims(
      static_cast<std::size_t>(checked(H5Sget_simple_extent_ndims(space.get()), file, what)));
  checked(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), file, what);
  shape_.assign(dims.begin(), dims.end());
}

std::size_t Dataset::elements() const {
  std::size_t n = 1;
  for (const std::int64_t d : shape_) n *= static_cast<std::size_t>(d);
  return n;
}

void Dataset::read_into(hid_t mem_type, const hsize_t* start, const hsize_t* count,
                        void* out) const {
  const std::string what = "cannot read " + path_;
  Handle file_space, mem_space;
  if (start != nullptr) {
    file_space = Handle(checked(H5Dget_space(id_.get()), file_, what));
    checked(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
            file_, what);
    const auto n = static_cast<hsize_t>(H5Sget_select_npoints(file_space.get()));
    mem_space = Handle(checked(H5Screate_simple(1, &n, nullptr), file_, what));
  }
  checked(H5Dread(id_.get(), mem_type, start != nullptr ? mem_space.get() : H5S_ALL,
                  start != nullptr ? file_space.get() : H5S_ALL, H5P_DEFAULT, out),
          file_, what);
}

std::string Dataset::read_text() const {
  if (class_ != H5T_STRING || variable_ || size_ == 0 || !scalar_)
    throw FileError(file_ + ": " + path_ + " is not a scalar fixed-length string");
  return fixed_string(size_, file_, path_, [&](hid_t mem, char* out) {
    return H5Dread(id_.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
  });
}

std::optional<DumpValue> Dataset::attribute(const std::string& name) const {
  if (checked(H5Aexists(id_.get(), name.c_str()), file_, "cannot read " + path_) == 0) return {};
  return read_scalar(id_.get(), name, path_, file_);
}

std::vector<Member> members(hid_t file, const std::string& path, const std::string& file_name) {
  const Handle group(
      checked(H5Gopen2(file, path.c_str(), H5P_DEFAULT), file_name, "cannot open group " + path));
  std::vector<std::pair<std::string, H5L_type_t>> links;
  hsize_t at = 0;
  checked(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_link, &links), file_name,
          "cannot list group " + path);
  std::vector<Member> out;
  for (const auto& [name, type] : links) {
    const std::string full = path == "/" ? "/" + name : path + "/" + name;
    if (type != H5L_TYPE_HARD)
      throw FileError(file_name + ": " + full + " is a soft or external link (a dump has none)");
    const Handle object(
        checked(H5Oopen(group.get(), name.c_str(), H5P_DEFAULT), file_name, "cannot open " + full));
    const H5I_type_t kind = H5Iget_type(object.get());
    out.push_back(Member{name, kind == H5I_GROUP     ? Kind::group
                               : kind == H5I_DATASET ? Kind::dataset
                                                     : Kind::other});
  }
  return out;
}

DumpAttributes read_attributes(hid_t file, const std::string& path, const std::string& file_name) {
  const Handle object(
      checked(H5Oopen(file, path.c_str(), H5P_DEFAULT), file_name, "cannot open " + path));
  std::vector<std::string> names;
  hsize_t at = 0;
  checked(H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_attribute, &names),
          file_name, "cannot list the attributes of " + path);
  DumpAttributes out;
  for (const std::string& name : names)
    out.emplace_back(name, read_scalar(object.get(), name, path, file_name));
  return out;
}

void write_attribute(hid_t object, const std::string& name, const DumpValue& value) {
  const Handle space(CPD_H5_CHECK(H5Screate(H5S_SCALAR)));
  const auto create = [&](hid_t type) {
    return Handle(CPD_H5_CHECK(
        H5Acreate2(object, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT)));
  };
  if (const auto* s = std::get_if<std::string>(&value)) {
    const Handle type(CPD_H5_CHECK(H5Tcopy(H5T_C_S1)));
    CPD_H5_CHECK(H5Tset_size(type.get(), std::max<std::size_t>(1, s->size())));
    CPD_H5_CHECK(H5Awrite(create(type.get()).get(), type.get(), s->c_str()));
  } else if (const auto* i = std::get_if<std::int64_t>(&value)) {
    CPD_H5_CHECK(H5Awrite(create(H5T_STD_I64LE).get(), H5T_NATIVE_INT64, i));
  } else {
    const double d = std::get<double>(value);
    CPD_H5_CHECK(H5Awrite(create(H5T_IEEE_F64LE).get(), H5T_NATIVE_DOUBLE, &d));
  }
}

}  // namespace h5
}  // namespace cpd
