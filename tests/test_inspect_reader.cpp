// cpdrift-inspect's reader (inspect/dump_reader.h): it finds the layout cpdrift's own writer
// makes, value for value, and refuses every file that is not a complete dump with one
// InspectError naming the file and what is wrong.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "inspect/dump_reader.h"
#include "inspect/tiny_dump.h"

using namespace inspect_test;
using cpd::inspect::DumpFile;
using cpd::inspect::find_attribute;
using cpd::inspect::InspectError;

namespace {

// The error opening `path` gives ("" when it opens).
std::string open_error(const std::string& path) {
  try {
    DumpFile::open(path);
  } catch (const InspectError& e) {
    return e.what();
  }
  return "";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A tiny dump at `name`, changed by `edit`; returns its path.
template <class F>
std::string edited_dump(const std::string& name, F&& edit) {
  const std::string path = tmp_path(name);
  write_tiny_dump(path);
  {
    const Edit e(path);
    edit(e);
  }
  return path;
}

const std::string kLeg = "/cases/" + kCase + "/candidate_fp32";

}  // namespace

TEST_CASE("the reader finds every tensor cpdrift's writer put in a dump, bit for bit") {
  const std::string path = tmp_path("ok.h5");
  const std::string report = R"({"thresholds": {"out_max_abs": 0.001}})";
  const std::vector<TinyTensor> written = write_tiny_dump(path, report);
  const DumpFile dump = DumpFile::open(path);
  const cpd::Problem& p = dump.problem().problem;
  CHECK(dump.problem().schema_version == "ws2_cp_attention_drift/v2");
  CHECK(dump.problem().producer == "cpdrift test");
  CHECK((p.batch == kB && p.seq_len == kS && p.dims.num_q_heads == kHq &&
         p.dims.num_kv_heads == kHkv && p.dims.head_dim == kD));
  CHECK(p.dtype == cpd::DType::bf16);
  REQUIRE(dump.cases().size() == 1);
  const cpd::inspect::CaseInfo& c = dump.cases().front();
  CHECK(c.name == kCase);
  CHECK_FALSE(c.paged);
  CHECK((c.spec.tp == 1 && c.spec.cp == 2 && c.spec.split == 4));
  CHECK(c.spec.layout == cpd::CpLayout::contiguous);
  CHECK(c.tensors.size() == written.size());
  REQUIRE(dump.tensors().size() == written.size());
  for (const TinyTensor& t : written) {
    CAPTURE(t.leg_path);
    const cpd::inspect::TensorInfo* info = dump.find("/cases/" + kCase + "/" + t.leg_path);
    REQUIRE(info != nullptr);
    CHECK(info->leg_path() == t.leg_path);
    CHECK(info->bf16 == t.bf16);
    CHECK(info->shape.size() == (t.width > 1 ? 4u : 3u));
    CHECK(info->elements() == static_cast<std::int64_t>(t.data.size()));
    CHECK(same_bits(dump.read(*info), t.data));
  }
  CHECK(dump.report_json() == report);
  // The same file from memory (the fuzz target's way in).
  const std::string bytes = file_bytes(path);
  const DumpFile image = DumpFile::open_image(bytes.data(), bytes.size(), "image.h5");
  CHECK(image.path() == "image.h5");
  CHECK(same_bits(image.read(image.tensors().front()), dump.read(dump.tensors().front())));
  std::remove(path.c_str());
}

TEST_CASE("files that are not dumps are refused with one line naming the file") {
  const std::string missing = tmp_path("missing.h5");
  CHECK(open_error(missing) == missing + ": no such file");

  const std::string empty = tmp_path("empty.h5");
  write_bytes(empty, "");
  CHECK(open_error(empty) == empty + ": empty file (0 bytes), not a dump");

  const std::string dir = tmp_path("dir.h5");
  std::filesystem::create_directory(dir);
  CHECK(open_error(dir) == dir + ": is a directory, not a dump");
  std::filesystem::remove(dir);

  const std::string text = tmp_path("text.h5");
  write_bytes(text, "{\"schema_version\": \"ws2_cp_attention_drift/v2\"}\n");
  CHECK(open_error(text) == text + ": not an HDF5 file (no HDF5 superblock)");

  const std::string foreign = tmp_path("foreign.h5");
  write_foreign_file(foreign);
  CHECK(open_error(foreign) == foreign + ": not a cpdrift dump (no schema_version attribute on /)");

  // Cut at every eighth of its length: HDF5 finds the end missing, or no superblock at all.
  const std::string whole = tmp_path("whole.h5"), cut = tmp_path("cut.h5");
  write_tiny_dump(whole);
  const std::string bytes = file_bytes(whole);
  for (int eighth = 1; eighth < 8; ++eighth) {
    CAPTURE(eighth);
    write_bytes(cut, bytes.substr(0, bytes.size() * static_cast<std::size_t>(eighth) / 8));
    const std::string e = open_error(cut);
    CHECK(e.rfind(cut + ": ", 0) == 0);
    CHECK(e.find("truncated") != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  }
  // The superblock's signature overwritten: not HDF5 any more.
  std::string broken = bytes;
  broken.replace(1, 3, "XYZ");
  write_bytes(cut, broken);
  CHECK(open_error(cut) == cut + ": not an HDF5 file (no HDF5 superblock)");
  for (const std::string& f : {empty, text, foreign, whole, cut}) std::remove(f.c_str());
}

TEST_CASE("a dump missing an attribute, or with a wrong rank, dtype or shape, is refused") {
  struct Bad {
    const char* name;
    std::function<void(const Edit&)> edit;
    std::string says;
  };
  const std::string group = "/cases/" + kCase;
  const std::vector<Bad> bad = {
      {"schema",
       [](const Edit& e) {
         e.remove_attribute("/", "schema_version");
         const hid_t root = H5Gopen2(e.file(), "/", H5P_DEFAULT);
         Edit::string_attribute(root, "schema_version", "ws2_cp_attention_drift/v1");
         H5Gclose(root);
       },
       ": schema \"ws2_cp_attention_drift/v1\"; cpdrift-inspect reads ws2_cp_attention_drift/v2"},
      {"seq_len", [](const Edit& e) { e.remove_attribute("/", "seq_len"); },
       ": / has no attribute seq_len"},
      {"layout", [&](const Edit& e) { e.remove_attribute(group, "layout"); },
       ": " + group + " has no attribute layout"},
      {"dtype_attr", [&](const Edit& e) { e.remove_attribute(kLeg + "/out", "original_dtype"); },
       ": " + kLeg + "/out has no attribute original_dtype"},
      {"rank",
       [&](const Edit& e) {
         e.add_dataset(kLeg + "/flat", H5T_IEEE_F32LE, {8, 4});
       },
       ": " + kLeg + "/flat has rank 2 (a dump's tensors are [B, H, S] or [B, H, S, D])"},
      {"float64",
       [&](const Edit& e) {
         e.add_dataset(kLeg + "/wide", H5T_IEEE_F64LE, {1, 4, 8, 4});
       },
       ": " + kLeg + "/wide is not FP32 (a 8-byte float dataset)"},
      {"int",
       [&](const Edit& e) {
         e.add_dataset(kLeg + "/ints", H5T_STD_I32LE, {1, 4, 8, 4});
       },
       ": " + kLeg + "/ints is not FP32 (a 4-byte non-float dataset)"},
      {"extent",
       [&](const Edit& e) {
         e.add_dataset(kLeg + "/long", H5T_IEEE_F32LE, {1, 4, 9, 4});
       },
       ": " + kLeg + "/long is [1, 4, 9, 4]; the run's [B, H, S, D] is [1, 4, 8, 4]"},
      {"shape_attr",
       [&](const Edit& e) {
         e.add_dataset(kLeg + "/odd", H5T_IEEE_F32LE, {1, 4, 8}, "[B, H, S, D]");
       },
       ": " + kLeg + "/odd has rank 3 but its shape attribute says [B, H, S, D]"},
      {"group",
       [&](const Edit& e) {
         H5Gclose(H5Gcreate2(e.file(), (kLeg + "/nested").c_str(), H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT));
       },
       ": " + kLeg + "/nested is not a dataset"},
      {"link",
       [&](const Edit& e) {
         H5Lcreate_soft((kLeg + "/out").c_str(), e.file(), (kLeg + "/alias").c_str(), H5P_DEFAULT,
                        H5P_DEFAULT);
       },
       ": " + kLeg + "/alias is a soft or external link (a dump has none)"},
      {"cp",
       [&](const Edit& e) {
         e.remove_attribute(group, "cp_world_size");
         const hid_t g = H5Gopen2(e.file(), group.c_str(), H5P_DEFAULT);
         const hid_t space = H5Screate(H5S_SCALAR);
         const hid_t a =
             H5Acreate2(g, "cp_world_size", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
         const std::int64_t three = 3;
         H5Awrite(a, H5T_NATIVE_INT64, &three);
         H5Aclose(a);
         H5Sclose(space);
         H5Gclose(g);
       },
       ": " + group + ": CP=3 (contiguous) needs seq-len divisible by 3, got 8"},
      {"no_cases", [&](const Edit& e) { e.remove("/cases"); }, ": a cpdrift dump without any case"},
      {"empty_case",
       [&](const Edit& e) {
         const hid_t g = H5Gcreate2(e.file(), "/cases/qwen3_8b_tp1_cp1_prefill_bf16", H5P_DEFAULT,
                                    H5P_DEFAULT, H5P_DEFAULT);
         Edit::int_attribute(g, "tp_world_size", 1);
         Edit::int_attribute(g, "cp_world_size", 1);
         Edit::string_attribute(g, "split", "none");
         Edit::string_attribute(g, "layout", "contiguous");
         Edit::string_attribute(g, "protocol", "ag_rs");
         H5Gclose(g);
       },
       ": /cases/qwen3_8b_tp1_cp1_prefill_bf16 holds no tensor"},
      {"huge_cp",
       [&](const Edit& e) {
         e.remove_attribute(group, "cp_world_size");
         const hid_t g = H5Gopen2(e.file(), group.c_str(), H5P_DEFAULT);
         Edit::int_attribute(g, "cp_world_size", std::int64_t{1} << 20);
         H5Gclose(g);
       },
       ": " + group + ": tp_world_size 1, cp_world_size 1048576: not a case cpdrift runs"},
      {"split_text",
       [&](const Edit& e) {
         e.remove_attribute(group, "split");
         const hid_t g = H5Gopen2(e.file(), group.c_str(), H5P_DEFAULT);
         Edit::string_attribute(g, "split", "all");
         H5Gclose(g);
       },
       ": attribute split of " + group + " is neither a size nor \"none\""},
      {"layout_name",
       [&](const Edit& e) {
         e.remove_attribute(group, "layout");
         const hid_t g = H5Gopen2(e.file(), group.c_str(), H5P_DEFAULT);
         Edit::string_attribute(g, "layout", "spiral");
         H5Gclose(g);
       },
       ": layout \"spiral\" is not one cpdrift writes"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.name);
    const std::string path = edited_dump(std::string("bad_") + b.name + ".h5", b.edit);
    CHECK(open_error(path) == path + b.says);
    std::remove(path.c_str());
  }
}

TEST_CASE("attributes: strings, integers (booleans too) and floats are read, other kinds refused") {
  // A dump whose root carries one more attribute, `extra`, of HDF5 type `type` and space `space`.
  const auto with_extra = [](const char* name, hid_t type, hid_t space, const void* value) {
    return edited_dump(std::string("attr_") + name + ".h5", [&](const Edit& e) {
      const hid_t a = H5Acreate2(e.file(), "extra", type, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, type, value);
      H5Aclose(a);
    });
  };
  const hid_t scalar = H5Screate(H5S_SCALAR);
  // h5py stores a Python bool as an enum of FALSE and TRUE: read as the integer.
  const hid_t boolean = H5Tenum_create(H5T_NATIVE_INT8);
  std::int8_t value = 0;
  H5Tenum_insert(boolean, "FALSE", &value);
  value = 1;
  H5Tenum_insert(boolean, "TRUE", &value);
  const std::string with_bool = with_extra("bool", boolean, scalar, &value);
  const DumpFile bool_dump = DumpFile::open(with_bool);
  const auto* extra = find_attribute(bool_dump.root_attributes(), "extra");
  REQUIRE(extra != nullptr);
  CHECK(std::get<std::int64_t>(*extra) == 1);
  const double half = 0.5;
  const std::string with_float = with_extra("float", H5T_NATIVE_DOUBLE, scalar, &half);
  const DumpFile float_dump = DumpFile::open(with_float);
  extra = find_attribute(float_dump.root_attributes(), "extra");
  REQUIRE(extra != nullptr);
  CHECK(std::get<double>(*extra) == 0.5);

  const hid_t variable = H5Tcopy(H5T_C_S1);
  H5Tset_size(variable, H5T_VARIABLE);
  const char* text = "bf16";
  const std::string with_vlen = with_extra("vlen", variable, scalar, &text);
  const DumpFile vlen_dump = DumpFile::open(with_vlen);  // h5py's str: read like a fixed one
  extra = find_attribute(vlen_dump.root_attributes(), "extra");
  REQUIRE(extra != nullptr);
  CHECK(std::get<std::string>(*extra) == "bf16");
  const hsize_t two = 2;
  const hid_t pair = H5Screate_simple(1, &two, nullptr);
  const std::int64_t values[2] = {1, 2};
  const std::string with_array = with_extra("array", H5T_NATIVE_INT64, pair, values);
  CHECK(open_error(with_array) == with_array + ": attribute extra of / is not a scalar");
  const hid_t opaque = H5Tcreate(H5T_OPAQUE, 4);
  const std::string with_opaque = with_extra("opaque", opaque, scalar, values);
  CHECK(open_error(with_opaque) ==
        with_opaque + ": attribute extra of / is neither a string nor a number");
  for (const hid_t t : {boolean, variable, opaque}) H5Tclose(t);
  for (const hid_t s : {scalar, pair}) H5Sclose(s);
  for (const std::string& f : {with_bool, with_float, with_vlen, with_array, with_opaque})
    std::remove(f.c_str());
}
