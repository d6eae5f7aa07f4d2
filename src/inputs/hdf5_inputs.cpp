// HDF5 inputs: q, k, v at / or under /inputs (what --dump-inputs writes), read a hyperslab of
// rows at a time. HDF5 (serial) is not thread-safe: one lock around the library per file.
#include <hdf5.h>

#include <memory>
#include <mutex>
#include <stdexcept>

#include "core/errors.h"
#include "inputs/file_inputs.h"
#include "inputs/raw_tensor.h"
#include "io/h5_handle.h"

namespace cpd::input_files {
namespace {

using h5io::Handle;

struct H5File {
  Handle file;
  std::mutex lock;
};

struct H5Tensor {
  std::shared_ptr<H5File> h5;
  std::string path, name;  // file, dataset
  std::shared_ptr<Handle> set;
  std::vector<std::int64_t> shape;
  StoredType type = StoredType::f32;

  void read_rows(int b, std::int64_t h, Range tokens, float* out) const {
    const std::lock_guard<std::mutex> guard(h5->lock);
    const Handle space(H5Dget_space(set->get()), H5Sclose);
    const hsize_t start[4] = {static_cast<hsize_t>(b), static_cast<hsize_t>(h),
                              static_cast<hsize_t>(tokens.begin), 0};
    const hsize_t count[4] = {1, 1, static_cast<hsize_t>(tokens.size()),
                              static_cast<hsize_t>(shape[3])};
    const hsize_t n = count[2] * count[3];
    const Handle mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
    herr_t status =
        H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
    if (status >= 0 && type == StoredType::bf16) {
      std::vector<std::uint16_t> raw(n);
      status =
          H5Dread(set->get(), H5T_NATIVE_UINT16, mem.get(), space.get(), H5P_DEFAULT, raw.data());
      for (hsize_t i = 0; i < n && status >= 0; ++i)
        out[i] = widen(StoredType::bf16, reinterpret_cast<const unsigned char*>(&raw[i]));
    } else if (status >= 0) {
      status = H5Dread(set->get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, out);
    }
    // Checked at open; a failure here is the file changing under the run: a runtime error.
    if (status < 0) throw std::runtime_error(path + ": " + name + ": cannot read rows");
  }
};

std::string text_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return "";
  const Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  const Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) return "";
  const std::size_t size = H5Tget_size(type.get());
  const Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), size + 1);
  std::string text(size + 1, '\0');
  if (H5Aread(attr.get(), mem.get(), text.data()) < 0) return "";
  text.resize(text.find('\0'));
  return text;
}

// An integer attribute (rope_applied), or -1 when absent or not an integer.
long long int_attribute(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return -1;
  const Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  const Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) return -1;
  long long value = -1;
  if (H5Aread(attr.get(), H5T_NATIVE_LLONG, &value) < 0) return -1;
  return value;
}

H5Tensor open_tensor(const std::shared_ptr<H5File>& h5, const std::string& path,
                     const std::string& name) {
  H5Tensor t;
  t.h5 = h5;
  t.path = path;
  t.name = name;
  if (H5Lexists(h5->file.get(), name.c_str(), H5P_DEFAULT) <= 0)
    throw UsageError(path + ": no dataset " + name);
  t.set = std::make_shared<Handle>(H5Dopen2(h5->file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (t.set->get() < 0) throw UsageError(path + ": " + name + " is not a dataset");
  const Handle space(H5Dget_space(t.set->get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (const hsize_t d : dims) t.shape.push_back(static_cast<std::int64_t>(d));
  const Handle type(H5Dget_type(t.set->get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const std::size_t size = H5Tget_size(type.get());
  const std::string dtype = text_attribute(t.set->get(), "dtype");
  if (cls == H5T_FLOAT && (size == 4 || size == 2)) {
    t.type = size == 4 ? StoredType::f32 : StoredType::f16;
  } else if (cls == H5T_INTEGER && size == 2 && dtype == "bfloat16") {
    t.type = StoredType::bf16;
  } else {
    throw UsageError(path + ": " + name +
                     ": must be float32, float16, or uint16 with attribute dtype = \"bfloat16\"" +
                     (cls == H5T_FLOAT && size == 8 ? " (float64: store float32)" : ""));
  }
  // A truncated file opens (HDF5 reads its metadata first) and fails only on reading rows, in
  // the middle of a run: a contiguous dataset's bytes must lie inside the file now.
  const haddr_t at = H5Dget_offset(t.set->get());
  hsize_t file_size = 0;
  H5Fget_filesize(h5->file.get(), &file_size);
  if (at != HADDR_UNDEF && at + H5Dget_storage_size(t.set->get()) > file_size) {
    throw UsageError(path + ": " + name + " ends at byte " +
                     std::to_string(at + H5Dget_storage_size(t.set->get())) + ", the file has " +
                     std::to_string(file_size) + " (truncated?)");
  }
  return t;
}

}  // namespace

void open_hdf5(const std::string& path, const ModelDims& dims, FileInputs& in) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // failures become one line, not HDF5's stack
  auto h5 = std::make_shared<H5File>();
  h5->file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (h5->file.get() < 0) throw UsageError(path + ": cannot be opened as HDF5 (truncated?)");
  const std::string base = H5Lexists(h5->file.get(), "inputs", H5P_DEFAULT) > 0 ? "/inputs/" : "/";
  const H5Tensor q = open_tensor(h5, path, base + "q"), k = open_tensor(h5, path, base + "k"),
                 v = open_tensor(h5, path, base + "v");
  check_shapes(path, q.shape, k.shape, v.shape, dims, in.file);
  const long long rope_q = int_attribute(q.set->get(), "rope_applied");
  const long long rope_k = int_attribute(k.set->get(), "rope_applied");
  if ((rope_q != 0 && rope_q != 1) || rope_k != rope_q) {
    throw UsageError(path + ": " + base + "q and " + base +
                     "k need an integer attribute rope_applied, 1 or 0, the same on both (are "
                     "they stored after RoPE?)");
  }
  in.file.rope_applied = rope_q == 1;
  in.file.dtype = type_name(q.type);
  in.q = [q](int b, std::int64_t h, Range r, float* out) { q.read_rows(b, h, r, out); };
  in.k = [k](int b, std::int64_t h, Range r, float* out) { k.read_rows(b, h, r, out); };
  in.v = [v](int b, std::int64_t h, Range r, float* out) { v.read_rows(b, h, r, out); };
  const std::string positions = base + "positions";
  if (H5Lexists(h5->file.get(), positions.c_str(), H5P_DEFAULT) > 0) {
    const Handle set(H5Dopen2(h5->file.get(), positions.c_str(), H5P_DEFAULT), H5Dclose);
    const Handle space(H5Dget_space(set.get()), H5Sclose);
    const Handle type(H5Dget_type(set.get()), H5Tclose);
    if (set.get() < 0 || H5Tget_class(type.get()) != H5T_INTEGER)
      throw UsageError(path + ": " + positions + " must hold integers");
    hsize_t d[2] = {0, 0};
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank == 2) H5Sget_simple_extent_dims(space.get(), d, nullptr);
    const std::vector<std::int64_t> shape =
        rank == 2 ? std::vector<std::int64_t>{static_cast<std::int64_t>(d[0]),
                                              static_cast<std::int64_t>(d[1])}
                  : std::vector<std::int64_t>{};
    std::vector<std::int64_t> values(rank == 2 ? d[0] * d[1] : 0);
    if (!values.empty() &&
        H5Dread(set.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
      throw UsageError(path + ": " + positions + ": cannot read (truncated?)");
    check_positions(path, shape, values, in.file);
    in.positions = std::move(values);
    in.file.positions = true;
  }
}

}  // namespace cpd::input_files
