// HDF5 logprob columns: /sequence, /position, /token_id, /logprob [N], optional /active [N] and
// /vocab_logprobs [N, V]; HDF5 converts any integer or float type to what is read.
#include <hdf5.h>

#include <string>
#include <vector>

#include "compare/logprob_stream.h"
#include "core/errors.h"
#include "io/h5_handle.h"

namespace cpd::stream_io {
namespace {

using h5io::Handle;

// One dataset's shape and values as `mem_type` (H5T_NATIVE_INT64 or H5T_NATIVE_DOUBLE).
template <class T>
std::vector<T> read_dataset(hid_t file, const std::string& path, const char* name, hid_t mem_type,
                            std::vector<hsize_t>& dims) {
  const std::string what = path + ": /" + name;
  const Handle set(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (set.get() < 0) throw UsageError(what + ": cannot open the dataset");
  const Handle type(H5Dget_type(set.get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)
    throw UsageError(what + ": must hold numbers");
  if (mem_type == H5T_NATIVE_INT64 && cls == H5T_FLOAT)
    throw UsageError(what + ": must hold integers");
  const Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 1 || rank > 2) throw UsageError(what + ": must be 1-D (or [N, V])");
  dims.assign(static_cast<std::size_t>(rank), 0);
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::size_t n = 1;
  for (const hsize_t d : dims) n *= static_cast<std::size_t>(d);
  std::vector<T> values(n);
  if (n > 0 && H5Dread(set.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    throw UsageError(what + ": cannot read (truncated or corrupted file?)");
  return values;
}

}  // namespace

void read_hdf5_columns(const std::string& path, LogprobStream& s) {
  s.files.push_back(fingerprint(path));
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // failures become one line, not HDF5's stack
  const Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file.get() < 0)
    throw UsageError(path + ": cannot be opened as HDF5 (truncated or corrupted?)");
  const auto exists = [&](const char* name) {
    return H5Lexists(file.get(), name, H5P_DEFAULT) > 0;
  };
  for (const char* name : {"sequence", "position", "token_id", "logprob"}) {
    if (!exists(name)) throw UsageError(path + ": no dataset /" + name);
  }
  std::vector<hsize_t> dims;
  const auto column = [&](const char* name) {
    std::vector<std::int64_t> v =
        read_dataset<std::int64_t>(file.get(), path, name, H5T_NATIVE_INT64, dims);
    if (dims.size() != 1) throw UsageError(path + ": /" + std::string(name) + " must be 1-D");
    return v;
  };
  const std::vector<double> logprob =
      read_dataset<double>(file.get(), path, "logprob", H5T_NATIVE_DOUBLE, dims);
  if (dims.size() != 1) throw UsageError(path + ": /logprob must be 1-D");
  const std::size_t n = logprob.size();
  const std::vector<std::int64_t> seq = column("sequence"), pos = column("position"),
                                  tok = column("token_id");
  std::vector<std::int64_t> active;
  if (exists("active")) active = column("active");
  using Column = std::pair<const char*, const std::vector<std::int64_t>*>;
  for (const auto& [name, v] : {Column{"sequence", &seq}, Column{"position", &pos},
                                Column{"token_id", &tok}, Column{"active", &active}}) {
    if (v->size() != n && !(v == &active && v->empty())) {
      throw UsageError(path + ": /" + name + " has " + std::to_string(v->size()) +
                       " entries, /logprob " + std::to_string(n));
    }
  }
  if (exists("vocab_logprobs")) {
    s.vocab = read_dataset<double>(file.get(), path, "vocab_logprobs", H5T_NATIVE_DOUBLE, dims);
    if (dims.size() != 2 || dims[0] != n || dims[1] == 0)
      throw UsageError(path + ": /vocab_logprobs must be [" + std::to_string(n) + ", V]");
    s.vocab_size = static_cast<std::int64_t>(dims[1]);
  }
  if (exists("top_ids") != exists("top_logprobs"))
    throw UsageError(path + ": /top_ids and /top_logprobs go together");
  if (exists("top_ids")) {
    const std::vector<std::int64_t> ids =
        read_dataset<std::int64_t>(file.get(), path, "top_ids", H5T_NATIVE_INT64, dims);
    const std::vector<hsize_t> id_dims = dims;
    const std::vector<double> lps =
        read_dataset<double>(file.get(), path, "top_logprobs", H5T_NATIVE_DOUBLE, dims);
    if (id_dims.size() != 2 || id_dims[0] != n || dims != id_dims) {
      throw UsageError(path + ": /top_ids and /top_logprobs must both be [" + std::to_string(n) +
                       ", K]");
    }
    take_top_columns(ids, lps, n, static_cast<std::size_t>(id_dims[1]), path, s);
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto* v : {&seq, &pos, &tok}) {
      if ((*v)[i] < 0) {
        throw UsageError(path + " row " + std::to_string(i) + ": " +
                         (v == &seq   ? "sequence"
                          : v == &pos ? "position"
                                      : "token_id") +
                         " is negative");
      }
    }
    LogprobRecord r;
    r.sequence = seq[i];
    r.position = pos[i];
    r.token_id = tok[i];
    r.logprob = logprob[i];
    r.active = active.empty() || active[i] != 0;
    s.records.push_back(r);
    s.vocab_row.push_back(s.vocab_size > 0 ? static_cast<std::int64_t>(i) : -1);
  }
}

}  // namespace cpd::stream_io
