// HDF5 inputs: q, k, v — or the layer's hidden — at / or under /inputs (what --dump-inputs
// writes), read a hyperslab of rows at a time. HDF5 (serial) is not thread-safe: one lock around
// the library per file.
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "cpdrift/bf16.h"
#include "inputs/file_inputs.h"
#include "inputs/raw_tensor.h"
#include "io/h5_support.h"

namespace cpd::input_files {
namespace {

struct H5File {
  h5::Handle id;
  std::mutex lock;
};

struct H5Tensor {
  std::shared_ptr<H5File> file;
  std::shared_ptr<const h5::Dataset> set;
  StoredType type = StoredType::f32;

  // [B, H, S, D] rows of (b, h), or [B, S, hidden] rows of b (h is 0).
  void read_rows(int b, std::int64_t h, Range tokens, float* out) const {
    const std::lock_guard<std::mutex> guard(file->lock);
    const std::vector<std::int64_t>& shape = set->shape();
    const bool per_head = shape.size() == 4;
    std::vector<hsize_t> start{static_cast<hsize_t>(b)}, count{1};
    if (per_head) {
      start.push_back(static_cast<hsize_t>(h));
      count.push_back(1);
    }
    start.insert(start.end(), {static_cast<hsize_t>(tokens.begin), 0});
    count.insert(count.end(),
                 {static_cast<hsize_t>(tokens.size()), static_cast<hsize_t>(shape.back())});
    try {
      if (type != StoredType::bf16) return set->read_block(start.data(), count.data(), out);
      std::vector<std::uint16_t> raw(static_cast<std::size_t>(tokens.size() * shape.back()));
      set->read_block(start.data(), count.data(), raw.data());
      for (std::size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_f32(raw[i]);
    } catch (const h5::FileError& e) {
      // Checked at open; a failure here is the file changing under the run: a runtime error.
      throw std::runtime_error(e.what());
    }
  }
};

// Attribute `name` of a tensor as a T; nothing when it has none, or one of another type or of a
// kind not read (vectors): the caller refuses it, saying what it must be.
template <class T>
std::optional<T> attribute(const h5::Dataset& set, const std::string& name) {
  try {
    const std::optional<DumpValue> v = set.attribute(name);
    const T* value = v ? std::get_if<T>(&*v) : nullptr;
    return value != nullptr ? std::optional<T>(*value) : std::nullopt;
  } catch (const h5::FileError&) {
    return std::nullopt;
  }
}

H5Tensor open_tensor(const std::shared_ptr<H5File>& file, const std::string& path,
                     const std::string& name) {
  if (!h5::exists(file->id.get(), name)) throw UsageError(path + ": no dataset " + name);
  H5Tensor t{file, std::make_shared<const h5::Dataset>(file->id.get(), name, path)};
  const H5T_class_t cls = t.set->type_class();
  const std::size_t size = t.set->type_size();
  if (cls == H5T_FLOAT && (size == 4 || size == 2)) {
    t.type = size == 4 ? StoredType::f32 : StoredType::f16;
  } else if (cls == H5T_INTEGER && size == 2 &&
             attribute<std::string>(*t.set, "dtype") == "bfloat16") {
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
  H5Fget_filesize(file->id.get(), &file_size);
  if (at != HADDR_UNDEF && at + H5Dget_storage_size(t.set->get()) > file_size) {
    throw UsageError(path + ": " + name + " ends at byte " +
                     std::to_string(at + H5Dget_storage_size(t.set->get())) + ", the file has " +
                     std::to_string(file_size) + " (truncated?)");
  }
  return t;
}

}  // namespace

void open_hdf5(const std::string& path, const ModelDims& dims, bool layer, FileInputs& in) {
  auto file = std::make_shared<H5File>();
  file->id = h5::open_file(path);
  const hid_t id = file->id.get();
  const std::string base = h5::exists(id, "inputs") ? "/inputs/" : "/";
  const bool has_qkv = h5::exists(id, base + "q"), has_hidden = h5::exists(id, base + "hidden");
  check_kind(path, layer, has_qkv, has_hidden);
  if (layer) {
    const H5Tensor x = open_tensor(file, path, base + "hidden");
    check_hidden_shape(path, x.set->shape(), dims, in.file);
    in.file.dtype = type_name(x.type);
    in.hidden = std::bind_front(&H5Tensor::read_rows, x);
  } else {
    const H5Tensor q = open_tensor(file, path, base + "q"), k = open_tensor(file, path, base + "k"),
                   v = open_tensor(file, path, base + "v");
    check_shapes(path, q.set->shape(), k.set->shape(), v.set->shape(), dims, in.file);
    const std::optional<std::int64_t> rope_q = attribute<std::int64_t>(*q.set, "rope_applied");
    if ((rope_q != 0 && rope_q != 1) || attribute<std::int64_t>(*k.set, "rope_applied") != rope_q) {
      throw UsageError(path + ": " + base + "q and " + base +
                       "k need an integer attribute rope_applied, 1 or 0, the same on both (are "
                       "they stored after RoPE?)");
    }
    in.file.rope_applied = rope_q == 1;
    in.file.dtype = type_name(q.type);
    in.q = std::bind_front(&H5Tensor::read_rows, q);
    in.k = std::bind_front(&H5Tensor::read_rows, k);
    in.v = std::bind_front(&H5Tensor::read_rows, v);
  }
  const std::string positions = base + "positions";
  if (h5::exists(id, positions)) {
    const h5::Dataset set(id, positions, path);
    if (set.type_class() != H5T_INTEGER)
      throw UsageError(path + ": " + positions + " must hold integers");
    use_positions(path, set.shape(), {}, in);  // the shape checked before anything is read
    use_positions(path, set.shape(), set.read<std::int64_t>(), in);
  }
}

}  // namespace cpd::input_files
