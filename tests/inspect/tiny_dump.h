// A small dump with the layout cpdrift writes (docs/inspect.md), made with cpdrift's own writer
// (io/tensor_dump.h) on a toy problem — B=1, Hq=4, Hkv=2, D=4, S=8, one CP=2 case with a split
// of 4 — so the reader's unit tests run in milliseconds; and raw HDF5 helpers that make the
// files a dump must never be (a foreign file, a wrong rank or dtype, a missing attribute).
#pragma once

#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "io/tensor_dump.h"

namespace inspect_test {

inline std::string tmp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/cpdrift_inspect_" + std::to_string(::getpid()) + "_" +
         name;
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The toy problem.
constexpr int kB = 1, kHq = 4, kHkv = 2, kD = 4, kS = 8;
inline const std::string kCase = "qwen3_8b_tp1_cp2_chunk4_bf16";

// Values of tensor `seed`: reproducible, BF16-exact when `bf16`.
inline std::vector<float> values(std::size_t n, unsigned seed, bool bf16 = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = normal(gen);
    if (bf16) {
      std::uint32_t u;
      std::memcpy(&u, &x, 4);
      u &= 0xffff0000u;
      std::memcpy(&x, &u, 4);
    }
  }
  return v;
}

struct TinyTensor {
  std::string leg_path;  // "candidate_fp32/out"
  int heads;             // kHq, kHkv or 1 (logp)
  int width;             // kD or 1
  bool bf16;
  std::vector<float> data;  // [B, heads, S, width]
};

// The case's tensors: a reference and candidates of every leg the summary pairs.
inline std::vector<TinyTensor> tiny_tensors() {
  std::vector<TinyTensor> t;
  unsigned seed = 1;
  const auto add = [&](const std::string& path, int heads, int width, bool bf16) {
    const std::size_t n = static_cast<std::size_t>(kB * heads * kS * width);
    t.push_back(TinyTensor{path, heads, width, bf16, values(n, seed++, bf16)});
  };
  for (const char* leg : {"reference_fp32", "candidate_fp32", "candidate_bf16", "bf16_kernel"}) {
    const bool bf16 = std::string(leg) == "candidate_bf16" || std::string(leg) == "bf16_kernel";
    add(std::string(leg) + "/out", kHq, kD, bf16);
    add(std::string(leg) + "/lse", kHq, 1, false);
  }
  for (const char* g : {"dq", "dk", "dv"}) {
    const int heads = std::string(g) == "dq" ? kHq : kHkv;
    add(std::string("candidate_fp32/") + g, heads, kD, false);
    add(std::string("reference_fp32/") + g, heads, kD, false);
  }
  add("candidate/logp", 1, 1, false);
  add("reference/logp", 1, 1, false);
  return t;
}

// Writes the tiny dump to `path` with cpdrift's writer; `report` becomes /report_json.
inline std::vector<TinyTensor> write_tiny_dump(const std::string& path,
                                               const std::string& report = "{}") {
  std::vector<TinyTensor> tensors = tiny_tensors();
  auto dump = cpd::open_tensor_dump(path);
  for (const TinyTensor& t : tensors) {
    std::vector<std::int64_t> dims{kB, t.heads, kS};
    if (t.width > 1) dims.push_back(t.width);
    const bool token = t.leg_path.find("logp") != std::string::npos;
    dump->begin("/cases/" + kCase + "/" + t.leg_path, dims,
                {{"shape", std::string(token         ? "[B, 1, S]"
                                       : t.width > 1 ? "[B, H, S, D]"
                                                     : "[B, H, S]")},
                 {"heads", std::string(token             ? "none (one value per token)"
                                       : t.heads == kHkv ? "kv"
                                                         : "query")},
                 {"original_dtype", std::string(t.bf16 ? "bfloat16" : "float32")},
                 {"stored_dtype", std::string("float32")}});
    for (std::int64_t h = 0; h < t.heads; ++h) {
      // Two pieces per row, as two CP ranks would send them.
      for (const cpd::Range r : {cpd::Range{0, kS / 2}, cpd::Range{kS / 2, kS}}) {
        dump->write(cpd::GlobalPiece{0, h, r, 0}, t.data.data() + (h * kS + r.begin) * t.width);
      }
    }
    dump->end();
  }
  dump->annotate("/cases/" + kCase, {{"tp_world_size", std::int64_t{1}},
                                     {"cp_world_size", std::int64_t{2}},
                                     {"split", std::int64_t{4}},
                                     {"layout", std::string("contiguous")},
                                     {"protocol", std::string("ag_rs")}});
  dump->annotate("/", {{"schema_version", std::string("ws2_cp_attention_drift/v2")},
                       {"producer", std::string("cpdrift test")},
                       {"batch", std::int64_t{kB}},
                       {"seq_len", std::int64_t{kS}},
                       {"num_query_heads", std::int64_t{kHq}},
                       {"num_kv_heads", std::int64_t{kHkv}},
                       {"head_dim", std::int64_t{kD}},
                       {"seed", std::int64_t{2355}},
                       {"dtype", std::string("bf16")}});
  dump->write_text("/report_json", report);
  dump->commit();
  return tensors;
}

// HDF5 edits on an existing file, for the files a dump must not be.
class Edit {
 public:
  explicit Edit(const std::string& path)
      : file_(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {}
  ~Edit() { H5Fclose(file_); }
  hid_t file() const { return file_; }
  void remove(const std::string& path) const { H5Ldelete(file_, path.c_str(), H5P_DEFAULT); }
  void remove_attribute(const std::string& object, const std::string& name) const {
    H5Adelete_by_name(file_, object.c_str(), name.c_str(), H5P_DEFAULT);
  }
  // A dataset of `type` and `dims` at `path` (its group must exist), with a shape attribute.
  void add_dataset(const std::string& path, hid_t type, std::vector<hsize_t> dims,
                   const std::string& shape = "[B, H, S, D]") const {
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d =
        H5Dcreate2(file_, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    std::size_t n = 1;
    for (hsize_t x : dims) n *= x;
    std::vector<double> zeros(n, 0.0);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data());
    string_attribute(d, "shape", shape);
    string_attribute(d, "original_dtype", "float32");
    H5Dclose(d);
    H5Sclose(space);
  }
  // Overwrites element `index` of an FP32 dataset.
  void set_value(const std::string& path, hsize_t index, float value) const {
    const hid_t d = H5Dopen2(file_, path.c_str(), H5P_DEFAULT);
    const hid_t space = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(space);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank)), at(dims.size());
    H5Sget_simple_extent_dims(space, dims.data(), nullptr);
    for (int i = rank - 1; i >= 0; --i) {
      at[static_cast<std::size_t>(i)] = index % dims[static_cast<std::size_t>(i)];
      index /= dims[static_cast<std::size_t>(i)];
    }
    H5Sselect_elements(space, H5S_SELECT_SET, 1, at.data());
    const hsize_t one = 1;
    const hid_t mem = H5Screate_simple(1, &one, nullptr);
    H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &value);
    H5Sclose(mem);
    H5Sclose(space);
    H5Dclose(d);
  }
  static void int_attribute(hid_t object, const std::string& name, std::int64_t value) {
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a =
        H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &value);
    H5Aclose(a);
    H5Sclose(space);
  }
  static void string_attribute(hid_t object, const std::string& name, const std::string& value) {
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, value.size());
    const hid_t a = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, value.c_str());
    H5Aclose(a);
    H5Tclose(type);
    H5Sclose(space);
  }

 private:
  hid_t file_;
};

// An HDF5 file that is not a cpdrift dump: one dataset, no schema_version.
inline void write_foreign_file(const std::string& path) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims[2] = {3, 4};
  const hid_t space = H5Screate_simple(2, dims, nullptr);
  const hid_t d =
      H5Dcreate2(f, "temperature", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const double v[12] = {};
  H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
  H5Dclose(d);
  H5Sclose(space);
  H5Fclose(f);
}

}  // namespace inspect_test
