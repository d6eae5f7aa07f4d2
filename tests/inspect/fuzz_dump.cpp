// libFuzzer target (the fuzz suite's `fuzz_dump`): the reader cpdrift-inspect uses, over HDF5
// file images opened from memory (DumpFile::open_image), each built by HDF5 itself from the
// input, read as a recipe: which root, case and tensor attributes a file has, of which type and
// value; which groups, cases, legs and datasets, of which dtype (FP32 either endianness, FP64,
// int32, text), rank, extents and contents (any bits: NaN, infinities), written or never
// written; links and groups where datasets belong; the report inside or not. Every choice's 0 is
// what cpdrift writes, so the empty input is a valid dump and mutations wander away from it.
// The files are well-formed HDF5, so what is exercised is cpdrift's reader and what consumes it
// (the summary's figures, the plot), not HDF5's decoder — fuzz_dump_image.cpp feeds raw bytes.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "fuzz_exercise.h"

namespace {

constexpr std::size_t kMaxValues = 1024;  // per dataset: keeps an input's file small

class Recipe {
 public:
  explicit Recipe(FuzzedDataProvider& in) : in_(in) {}

  // The file, built in memory; its image.
  std::vector<char> build() {
    const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_core(fapl, 64 * 1024, false);
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);  // closes whatever a failed step left open
    const hid_t file = H5Fcreate("fuzz_recipe.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (file < 0) return {};
    root(file);
    H5Fflush(file, H5F_SCOPE_GLOBAL);
    std::vector<char> image;
    const ssize_t n = H5Fget_file_image(file, nullptr, 0);
    if (n > 0) {
      image.resize(static_cast<std::size_t>(n));
      H5Fget_file_image(file, image.data(), image.size());
    }
    H5Fclose(file);
    return image;
  }

 private:
  // 0 (and an exhausted input) picks the first option; the last is a string from the input.
  std::string pick(std::initializer_list<const char*> options) {
    const std::size_t i = in_.ConsumeIntegralInRange<std::size_t>(0, options.size());
    return i < options.size() ? std::string(options.begin()[i]) : in_.ConsumeRandomLengthString(16);
  }
  int choice(int last) { return in_.ConsumeIntegralInRange<int>(0, last); }

  static void put_string(hid_t object, const std::string& name, const std::string& value,
                         bool vlen) {
    const hid_t space = H5Screate(H5S_SCALAR), type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, vlen ? H5T_VARIABLE : std::max<std::size_t>(1, value.size()));
    const hid_t a = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    const char* p = value.c_str();
    if (a >= 0) H5Awrite(a, type, vlen ? static_cast<const void*>(&p) : p);
    if (a >= 0) H5Aclose(a);
    H5Tclose(type);
    H5Sclose(space);
  }
  static void put_number(hid_t object, const std::string& name, hid_t type, const void* value,
                         hid_t memory, hsize_t count = 0) {
    const hid_t space = count == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &count, nullptr);
    const hid_t a = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      H5Awrite(a, memory, value);
      H5Aclose(a);
    }
    H5Sclose(space);
  }

  // An attribute: as cpdrift writes it (`text`, or `number` when `is_number`), or absent, or of
  // another type or value.
  void attribute(hid_t object, const std::string& name, const std::string& text,
                 std::int64_t number, bool is_number) {
    const std::int64_t any = in_.ConsumeIntegral<std::int64_t>();
    const double real = in_.ConsumeFloatingPoint<double>();
    const std::int64_t pair[2] = {number, any};
    switch (choice(7)) {
      case 0:
        if (is_number)
          put_number(object, name, H5T_STD_I64LE, &number, H5T_NATIVE_INT64);
        else
          put_string(object, name, text, false);
        break;
      case 1:
        break;  // absent
      case 2:
        put_number(object, name, H5T_STD_I64LE, &any, H5T_NATIVE_INT64);
        break;
      case 3:
        put_number(object, name, H5T_IEEE_F64LE, &real, H5T_NATIVE_DOUBLE);
        break;
      case 4:
        put_string(object, name, in_.ConsumeRandomLengthString(24), false);
        break;
      case 5:
        put_string(object, name, text, true);  // variable-length
        break;
      case 6:
        put_number(object, name, H5T_STD_I64LE, pair, H5T_NATIVE_INT64, 2);  // not a scalar
        break;
      default:
        put_number(object, name, H5T_STD_U8LE, &any, H5T_NATIVE_UINT8);
        break;
    }
  }

  void root(hid_t file) {
    const hid_t g = H5Gopen2(file, "/", H5P_DEFAULT);
    batch_ = 1 + choice(1);
    seq_ = 8 >> choice(2);
    hq_ = 4 >> choice(2);
    hkv_ = hq_ >> choice(1);
    dim_ = 4 >> choice(2);
    attribute(g, "schema_version", pick({"ws2_cp_attention_drift/v2", "ws2_cp_attention_drift/v1"}),
              0, false);
    attribute(g, "batch", "", batch_, true);
    attribute(g, "seq_len", "", seq_, true);
    attribute(g, "num_query_heads", "", hq_, true);
    attribute(g, "num_kv_heads", "", hkv_, true);
    attribute(g, "head_dim", "", dim_, true);
    attribute(g, "seed", "", 2355, true);
    attribute(g, "dtype", pick({"bf16", "fp32"}), 0, false);
    H5Gclose(g);
    switch (choice(3)) {
      case 0:
        text_dataset(file, "/report_json",
                     R"({"thresholds": {"out_max_abs": 2e-4, "lse_max_abs": 2e-4}})");
        break;
      case 1:
        text_dataset(file, "/report_json", in_.ConsumeRandomLengthString(64));
        break;
      case 2:
        H5Gclose(H5Gcreate2(file, "/report_json", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        break;
      default:
        break;
    }
    if (choice(1) == 1) inputs(file);
    const int cases = choice(3) == 0 ? 1 : choice(3);
    if (cases > 0 || choice(1) == 0) {
      const hid_t all = H5Gcreate2(file, "/cases", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      for (int c = 0; c < cases && all >= 0; ++c) prefill_case(all);
      if (all >= 0) H5Gclose(all);
    }
    if (choice(2) == 1) {
      const hid_t all = H5Gcreate2(file, "/paged_cases", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      for (int c = 0; c < 1 + choice(1) && all >= 0; ++c) paged_case(all);
      if (all >= 0) H5Gclose(all);
    }
  }

  void inputs(hid_t file) {
    const hid_t g = H5Gcreate2(file, "/inputs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return;
    for (const char* t : {"q", "k", "v"})
      tensor(g, t, std::string(t) == "q" ? hq_ : hkv_, seq_, true, "[B, H, S, D]", "query");
    H5Gclose(g);
  }

  void prefill_case(hid_t all) {
    const int cp = 1 << choice(2);
    const std::string name = pick({"qwen3_8b_tp1_cp2_chunk4_bf16", "qwen3_8b_tp1_cp1_chunk4_bf16",
                                   "qwen3_8b_tp2_cp2_prefill_bf16_zigzag"});
    const hid_t g = H5Gcreate2(all, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return;
    attribute(g, "tp_world_size", "", 1 + choice(1), true);
    attribute(g, "cp_world_size", "", cp, true);
    const bool sized = choice(1) == 0;
    attribute(g, "split", "none", 1 + choice(7), sized);
    attribute(g, "layout", pick({"contiguous", "zigzag"}), 0, false);
    attribute(g, "protocol", pick({"ag_rs", "ring_kv", "allgather_kv"}), 0, false);
    const int legs = choice(4);
    const std::vector<std::string> standard = {"reference_fp32", "candidate_fp32", "candidate_bf16",
                                               "bf16_kernel",    "te_p2p",         "candidate",
                                               "reference"};
    for (int l = 0; l < (legs == 0 ? static_cast<int>(standard.size()) : legs); ++l) {
      const std::string leg = legs == 0 ? standard[static_cast<std::size_t>(l)]
                                        : pick({"candidate_fp32", "reference_fp32", "candidate",
                                                "reference", "bf16_kernel", "cpu_fp32"});
      const hid_t lg = H5Gcreate2(g, leg.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (lg < 0) continue;
      if (leg == "candidate" || leg == "reference") {
        tensor(lg, "logp", 1, seq_, false, "[B, 1, S]", "none (one value per token)");
      } else {
        tensor(lg, "out", hq_, seq_, true, "[B, H, S, D]", "query");
        tensor(lg, "lse", hq_, seq_, false, "[B, H, S]", "query");
        if (leg.rfind("_fp32") != std::string::npos && choice(1) == 0) {
          tensor(lg, "dq", hq_, seq_, true, "[B, H, S, D]", "query");
          tensor(lg, "dk", hkv_, seq_, true, "[B, H, S, D]", "kv");
          tensor(lg, "dv", hkv_, seq_, true, "[B, H, S, D]", "kv");
        }
      }
      odd_member(lg);
      H5Gclose(lg);
    }
    H5Gclose(g);
  }

  void paged_case(hid_t all) {
    const std::string name = pick({"qwen3_8b_tp1_decode_split_kv_disabled_bf16"});
    const hid_t g = H5Gcreate2(all, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return;
    const int q_len = 1 + choice(3);
    attribute(g, "kv_lens", "8", 0, false);
    attribute(g, "q_len", "", q_len, true);
    attribute(g, "page_size", "", 4, true);
    attribute(g, "shared_prefix_tokens", "", 0, true);
    for (const char* leg : {"candidate", "reference"}) {
      const hid_t lg = H5Gcreate2(g, leg, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (lg < 0) continue;
      tensor(lg, "out", hq_, q_len, true, "[B, H, Q, D]", "");
      tensor(lg, "lse", hq_, q_len, false, "[B, H, Q]", "");
      H5Gclose(lg);
    }
    H5Gclose(g);
  }

  // Sometimes a member a dump never has: a soft or external link, a nested group, a dataset
  // of random rank.
  void odd_member(hid_t group) {
    switch (choice(7)) {
      case 1:
        H5Lcreate_soft("out", group, "alias", H5P_DEFAULT, H5P_DEFAULT);
        break;
      case 2:
        H5Lcreate_external("elsewhere.h5", "/x", group, "outside", H5P_DEFAULT, H5P_DEFAULT);
        break;
      case 3:
        H5Gclose(H5Gcreate2(group, "nested", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
        break;
      case 4: {
        std::vector<hsize_t> dims(static_cast<std::size_t>(1 + choice(4)));
        for (hsize_t& d : dims) d = static_cast<hsize_t>(1 + choice(3));
        dataset(group, "odd", dims, "[B, H, S]", "query");
        break;
      }
      default:
        break;
    }
  }

  // A tensor as cpdrift writes it ([B, heads, length(, D)]), unless the input says otherwise.
  void tensor(hid_t group, const char* name, int heads, int length, bool wide, const char* shape,
              const char* kind) {
    std::vector<hsize_t> dims{static_cast<hsize_t>(batch_), static_cast<hsize_t>(heads),
                              static_cast<hsize_t>(length)};
    if (wide) dims.push_back(static_cast<hsize_t>(dim_));
    if (choice(5) == 5)
      dims[static_cast<std::size_t>(choice(static_cast<int>(dims.size()) - 1))] += 1;
    dataset(group, name, dims, shape, kind);
  }

  void dataset(hid_t group, const char* name, const std::vector<hsize_t>& dims, const char* shape,
               const char* kind) {
    std::size_t n = 1;
    for (const hsize_t d : dims) n *= d;
    if (n > kMaxValues) return;
    const int dtype = choice(6);
    const hid_t type = dtype == 3   ? H5T_IEEE_F32BE
                       : dtype == 4 ? H5T_IEEE_F64LE
                       : dtype == 5 ? H5T_STD_I32LE
                       : dtype == 6 ? H5T_STD_U16LE
                                    : H5T_IEEE_F32LE;
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d = H5Dcreate2(group, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Sclose(space);
    if (d < 0) return;
    if (choice(7) != 7) {  // else never written: no storage
      std::vector<std::uint8_t> bytes = in_.ConsumeBytes<std::uint8_t>(n * 4);
      bytes.resize(n * 4);  // zeros past the input's end
      std::vector<float> values(n);
      if (n > 0) std::memcpy(values.data(), bytes.data(), bytes.size());  // n is 0 when Hkv is
      H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    }
    attribute(d, "shape", shape, 0, false);
    if (*kind != '\0') attribute(d, "heads", kind, 0, false);
    attribute(d, "original_dtype", pick({"float32", "bfloat16"}), 0, false);
    attribute(d, "stored_dtype", "float32", 0, false);
    H5Dclose(d);
  }

  static void text_dataset(hid_t file, const char* path, const std::string& text) {
    const hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(type, std::max<std::size_t>(1, text.size()));
    const hid_t d = H5Dcreate2(file, path, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (d >= 0) {
      H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.c_str());
      H5Dclose(d);
    }
    H5Sclose(space);
    H5Tclose(type);
  }

  FuzzedDataProvider& in_;
  int batch_ = 1, seq_ = 8, hq_ = 4, hkv_ = 2, dim_ = 4;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  FuzzedDataProvider in(data, size);
  const std::vector<char> image = Recipe(in).build();
  if (image.empty()) return 0;
  return inspect_fuzz::run_one(
      [&] { return cpd::inspect::DumpFile::open_image(image.data(), image.size(), "fuzz.h5"); });
}
