#include "inspect/h5_support.h"

#include <algorithm>
#include <limits>

namespace cpd::inspect::h5 {
namespace {

// Collects the descriptions of HDF5's error stack, innermost first.
herr_t take_message(unsigned, const H5E_error2_t* e, void* out) {
  if (e->desc != nullptr && *e->desc != '\0')
    static_cast<std::vector<std::string>*>(out)->push_back(e->desc);
  return 0;
}

// An attribute larger than this is not one the dump writer made (HDF5 keeps them under 64 KiB
// unless stored densely); refusing it bounds what a corrupted size can make us allocate.
constexpr std::size_t kMaxAttributeBytes = std::size_t{1} << 20;

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* out) {
  auto* links = static_cast<std::vector<std::pair<std::string, H5L_type_t>>*>(out);
  links->emplace_back(name, info->type);
  return 0;
}

herr_t collect_attribute(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->push_back(name);
  return 0;
}

// Why H5Fopen refused a file, from its error stack: a truncated file says how much is missing.
std::string open_failure(const std::string& why) {
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
      return "truncated: the file has " + has + " bytes, its superblock says " + wants;
    return "truncated (HDF5: " + why + ")";
  }
  return "cannot be opened as HDF5, corrupted? (HDF5: " + (why.empty() ? "no reason given" : why) +
         ")";
}

std::string where(const std::string& path, const std::string& name) {
  return path == "/" ? "/" + name : path + "/" + name;
}

AttributeValue read_scalar(hid_t attr, const std::string& file, const std::string& what) {
  const Handle space(checked(H5Aget_space(attr), file, what), H5Sclose);
  if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR)
    throw InspectError(file + ": " + what + " is not a scalar");
  const Handle type(checked(H5Aget_type(attr), file, what), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls == H5T_STRING) {
    if (H5Tis_variable_str(type.get()) != 0)
      throw InspectError(file + ": " + what + " is a variable-length string (a dump's are fixed)");
    const std::size_t size = H5Tget_size(type.get());
    if (size == 0 || size > kMaxAttributeBytes)
      throw InspectError(file + ": " + what + " has an implausible size (" + std::to_string(size) +
                         " bytes)");
    const Handle mem(checked(H5Tcopy(H5T_C_S1), file, what), H5Tclose);
    checked(H5Tset_size(mem.get(), size + 1), file, what);
    checked(H5Tset_strpad(mem.get(), H5T_STR_NULLTERM), file, what);
    std::string text(size + 1, '\0');
    checked(H5Aread(attr, mem.get(), text.data()), file, "cannot read " + what);
    text.resize(text.find('\0'));
    return text;
  }
  if (cls == H5T_INTEGER) {
    std::int64_t value = 0;
    checked(H5Aread(attr, H5T_NATIVE_INT64, &value), file, "cannot read " + what);
    return value;
  }
  if (cls == H5T_FLOAT) {
    double value = 0;
    checked(H5Aread(attr, H5T_NATIVE_DOUBLE, &value), file, "cannot read " + what);
    return value;
  }
  throw InspectError(file + ": " + what + " is neither a string nor a number");
}

}  // namespace

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::string error_stack_text() {
  std::vector<std::string> stack;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_message, &stack);
  H5Eclear2(H5E_DEFAULT);
  if (stack.empty()) return "";
  // The innermost message says what was wrong; the outermost what the call was doing.
  std::string text = stack.front();
  if (stack.size() > 1 && stack.back() != stack.front()) text = stack.back() + ": " + text;
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

void fail(const std::string& file, const std::string& what) {
  const std::string why = error_stack_text();
  throw InspectError(file + ": " + what + (why.empty() ? "" : " (HDF5: " + why + ")"));
}

hid_t checked(hid_t id, const std::string& file, const std::string& what) {
  if (id < 0) fail(file, what);
  return id;
}

Handle open_file(const std::string& path) {
  silence_errors();
  const Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), path, "cannot open"), H5Pclose);
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
    throw InspectError(path + ": not an HDF5 file (no HDF5 superblock)");
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (file < 0) throw InspectError(path + ": " + open_failure(error_stack_text()));
  return Handle(file, H5Fclose);
}

Handle open_image(const void* data, std::size_t size, const std::string& name) {
  silence_errors();
  const Handle fapl(checked(H5Pcreate(H5P_FILE_ACCESS), name, "cannot open"), H5Pclose);
  checked(H5Pset_fapl_core(fapl.get(), 64 * 1024, false), name, "cannot open");
  // HDF5 copies the image: the const_cast only meets its signature.
  checked(H5Pset_file_image(fapl.get(), const_cast<void*>(data), size), name, "cannot open");
  const hid_t file = H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (file < 0) throw InspectError(name + ": " + open_failure(error_stack_text()));
  return Handle(file, H5Fclose);
}

std::vector<Member> members(hid_t file, const std::string& path, const std::string& file_name) {
  const Handle group(
      checked(H5Gopen2(file, path.c_str(), H5P_DEFAULT), file_name, "cannot open group " + path),
      H5Gclose);
  std::vector<std::pair<std::string, H5L_type_t>> links;
  hsize_t at = 0;
  checked(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_link, &links), file_name,
          "cannot list group " + path);
  std::vector<Member> out;
  for (const auto& [name, type] : links) {
    const std::string full = where(path, name);
    if (type != H5L_TYPE_HARD)
      throw InspectError(file_name + ": " + full + " is a soft or external link (a dump has none)");
    const Handle object(
        checked(H5Oopen(group.get(), name.c_str(), H5P_DEFAULT), file_name, "cannot open " + full),
        H5Oclose);
    const H5I_type_t kind = H5Iget_type(object.get());
    out.push_back(Member{name, kind == H5I_GROUP     ? Kind::group
                               : kind == H5I_DATASET ? Kind::dataset
                                                     : Kind::other});
  }
  return out;
}

Attributes read_attributes(hid_t file, const std::string& path, const std::string& file_name) {
  const Handle object(
      checked(H5Oopen(file, path.c_str(), H5P_DEFAULT), file_name, "cannot open " + path),
      H5Oclose);
  std::vector<std::string> names;
  hsize_t at = 0;
  checked(H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, &at, collect_attribute, &names),
          file_name, "cannot list the attributes of " + path);
  Attributes out;
  for (const std::string& name : names) {
    const std::string what = "attribute " + name + " of " + path;
    const Handle attr(
        checked(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT), file_name, "cannot open " + what),
        H5Aclose);
    out.emplace_back(name, read_scalar(attr.get(), file_name, what));
  }
  return out;
}

}  // namespace cpd::inspect::h5
