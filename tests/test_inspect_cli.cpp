// cpdrift-inspect through its command line on real dumps of cpdrift (CPDRIFT_BIN, and
// CPDRIFT_INSPECT_BIN): the summary equal to the JSON report bit for bit (and a changed dump not),
// diff of two runs and of two seeds, list, export, plot, and broken files as one line and
// status 2.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>

#include "cli_support.h"
#include "inspect/tiny_dump.h"
#include "report/json.h"

using namespace cli_test;
using cpd::json::Value;

namespace {

std::string inspect_bin() {
  const char* path = std::getenv("CPDRIFT_INSPECT_BIN");
  REQUIRE_MESSAGE(path != nullptr, "CPDRIFT_INSPECT_BIN is not set (meson test sets it)");
  return path;
}

Result inspect(const std::string& args) { return run_command(inspect_bin() + " " + args); }

std::string scratch(const std::string& name) {
  return tmp_dir() + "/cpdrift_inspect_cli_" + std::to_string(::getpid()) + "_" + name;
}

// cpdrift with `args`, its dump at `h5` and report at `json` (two processes when MPI is built).
void run_cpdrift(const std::string& args, const std::string& h5, const std::string& json = "",
                 int processes = 2) {
  const std::string all =
      args + " --quiet --dump " + h5 + (json.empty() ? "" : " --output " + json);
#if defined(CPD_HAVE_MPI)
  const Result r = processes > 1 ? run_mpi(processes, all) : run(all);
#else
  (void)processes;
  const Result r = run(all);
#endif
  CAPTURE(r.err);
  REQUIRE(r.status == 0);
}

// The value at `path` ("drift.cp_merge_fp32.out", "per_rank[1].lse") under `v`.
const Value& at_path(const Value& v, const std::string& path) {
  const Value* at = &v;
  static const std::regex part(R"(([^.\[\]]+)|\[(\d+)\])");
  for (auto it = std::sregex_iterator(path.begin(), path.end(), part); it != std::sregex_iterator();
       ++it) {
    at = (*it)[1].matched ? &at->at((*it)[1].str())
                          : &at->at(static_cast<std::size_t>(std::stoul((*it)[2].str())));
  }
  return *at;
}

const Value& report_case(const Value& report, const std::string& kind, const std::string& name) {
  for (const Value& c : report.at(kind == "paged" ? "paged_cases" : "cases").as_array()) {
    if (c.at("case_name").as_string() == name) return c;
  }
  FAIL("the report has no case " << name);
  return report;
}

struct Compared {
  std::size_t figures = 0, equal = 0;
  std::map<std::string, std::size_t> per_case_differ;
};

// Every figure of `summary` against the same figure of `report`: the JSON text of both, which
// is equal only when every number is the same double (the writer prints the shortest
// round-trip form), every count, flag and digest the same.
Compared compare_with_report(const Value& summary, const Value& report) {
  Compared c;
  for (const Value& sc : summary.at("cases").as_array()) {
    const Value& rc =
        report_case(report, sc.at("kind").as_string(), sc.at("case_name").as_string());
    for (const Value& f : sc.at("figures").as_array()) {
      ++c.figures;
      const std::string ours = cpd::json::to_string(f.at("stats"), false);
      const std::string theirs =
          cpd::json::to_string(at_path(rc, f.at("figure").as_string()), false);
      if (ours == theirs) {
        ++c.equal;
      } else {
        ++c.per_case_differ[sc.at("case_name").as_string() + " " + f.at("figure").as_string()];
      }
    }
  }
  return c;
}

// The one-line refusal every broken file gets: status 2, nothing on stdout, one line naming it.
void check_refused(const Result& r, const std::string& file) {
  CAPTURE(r.err);
  CHECK(r.status == 2);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("cpdrift-inspect: error: " + file + ": ", 0) == 0);
}

}  // namespace

TEST_CASE("summary reproduces every figure of the report it can, bit for bit") {
  // TP=2 with CP=1 and 2 (so the topology figures have their counterpart), both layouts, a
  // split and none, the backward (with the te_p2p lane's) and dlogp legs, and the paged cases;
  // BF16 and FP32 runs.
  const std::string base =
      "--seq-len 32 --tp-world-sizes 2 --cp-world-sizes 1,2 --kv-chunk-sizes none,8 "
      "--cp-layouts contiguous,zigzag --include-backward --include-lane-backward --include-dlogp "
      "--modes prefill,chunked_prefill,paged_prefill,decode --page-size 4 --fixed-split-size 8";
  for (const char* dtype : {"bf16", "fp32"}) {
    CAPTURE(dtype);
    const std::string h5 = scratch(std::string("summary_") + dtype + ".h5"), json = h5 + ".json";
    run_cpdrift(base + " --dtype " + dtype, h5, json);
    const Value report = cpd::json::parse(slurp(json));
    const Result r = inspect("summary " + h5 + " --json");
    REQUIRE(r.status == 0);
    const Value summary = cpd::json::parse(r.out);
    CHECK(summary.at("cases").size() ==
          report.at("cases").size() + report.at("paged_cases").size());
    const Compared c = compare_with_report(summary, report);
    CAPTURE(c.per_case_differ.size() > 0 ? c.per_case_differ.begin()->first : "");
    CHECK(c.figures >= 300);  // 8 prefill cases of about 37 figures, 4 paged
    CHECK(c.equal == c.figures);
    // The text form prints the same figures (rounded) and what the dump cannot reproduce.
    const Result text =
        inspect("summary " + h5 + " --case qwen3_8b_tp2_cp2_chunk8_" + std::string(dtype));
    REQUIRE(text.status == 0);
    CHECK(text.out.find("    drift.topology_invariance.out ") != std::string::npos);
    CHECK(text.out.find("#   not in the dump: merge_order_probe") != std::string::npos);
    // The paged candidate's out figure: against reference/out in an FP32 run, against the
    // reference_fp32_arithmetic/out a BF16 run's dump holds beside its BF16 write.
    CHECK(r.out.find("\"paged.drift.candidate.out\"") != std::string::npos);
    if (std::string(dtype) == "bf16") {
      // Negative control: one value of one tensor moved by one ULP changes that case's figures
      // (a figure, a count or a digest), and only that case's.
      const std::string edited = scratch("summary_edited.h5");
      std::filesystem::copy_file(h5, edited, std::filesystem::copy_options::overwrite_existing);
      const std::string victim = "qwen3_8b_tp2_cp2_chunk8_bf16";
      {
        const inspect_test::Edit e(edited);
        const hid_t d =
            H5Dopen2(e.file(), ("/cases/" + victim + "/candidate_fp32/out").c_str(), H5P_DEFAULT);
        float first = 0;
        const hsize_t zero[4] = {0, 0, 0, 0}, one[1] = {1};
        const hid_t space = H5Dget_space(d), mem = H5Screate_simple(1, one, nullptr);
        H5Sselect_elements(space, H5S_SELECT_SET, 1, zero);
        H5Dread(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &first);
        first = std::nextafter(first, 1e30f);
        H5Dwrite(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &first);
        H5Sclose(mem);
        H5Sclose(space);
        H5Dclose(d);
      }
      const Result e = inspect("summary " + edited + " --json");
      REQUIRE(e.status == 0);
      const Compared changed = compare_with_report(cpd::json::parse(e.out), report);
      CHECK(changed.equal < changed.figures);
      CHECK(changed.per_case_differ.count(victim + " drift.cp_merge_fp32.out") == 1);
      CHECK(changed.per_case_differ.count(victim + " per_rank[0].cp_merge_fp32.out") == 1);
      for (const auto& [figure, n] : changed.per_case_differ) {
        CAPTURE(figure);
        CHECK(figure.rfind(victim + " ", 0) == 0);
      }
      std::remove(edited.c_str());
    }
    std::remove(h5.c_str());
    std::remove(json.c_str());
  }
}

TEST_CASE("diff: the same run twice agrees, another seed differs, --atol decides") {
  const std::string args =
      "--seq-len 16 --tp-world-sizes 1 --cp-world-sizes 2 --kv-chunk-sizes 4 --dump-inputs";
  const std::string a = scratch("diff_a.h5"), b = scratch("diff_b.h5"), c = scratch("diff_c.h5"),
                    d = scratch("diff_d.h5");
  run_cpdrift(args, a, "", 2);
  run_cpdrift(args, b, "", 1);  // one process: the same bits
  run_cpdrift(args + " --seed 7", c);
  run_cpdrift(args + " --kv-chunk-sizes 8", d);  // other cases
  const Result same = inspect("diff " + a + " " + b);
  CHECK(same.status == 0);
  CHECK(same.out.find(": SAME\n") != std::string::npos);
  const Result seeds = inspect("diff " + a + " " + c);
  CHECK(seeds.status == 1);
  CHECK(seeds.out.find(": DIFFERENT\n") != std::string::npos);
  CHECK(seeds.err.empty());
  CHECK(inspect("diff " + a + " " + c + " --atol 1e30").status == 0);
  CHECK(inspect("diff " + a + " " + c + " --atol 1e-9").status == 1);
  // JSON: every tensor with both digests; equal runs have equal digests.
  const Result js = inspect("diff " + a + " " + b + " --json");
  REQUIRE(js.status == 0);
  const Value v = cpd::json::parse(js.out);
  CHECK(v.at("agree").as_bool());
  CHECK(v.at("tensor_count").as_int64() == 3 + 14);  // q, k, v; one case's 7 out/lse pairs
  for (const Value& t : v.at("tensors").as_array()) {
    CAPTURE(t.at("path").as_string());
    CHECK(t.at("digest_a") == t.at("digest_b"));
    CHECK(t.at("stats").at("bitwise_equal").as_bool());
  }
  const Value sv = cpd::json::parse(inspect("diff " + a + " " + c + " --json").out);
  CHECK_FALSE(sv.at("agree").as_bool());
  CHECK(sv.at("differ_count").as_int64() == 17);
  // Tensors of cases only one dump has are differences too.
  const Result cases = inspect("diff " + a + " " + d + " --json");
  CHECK(cases.status == 1);
  CHECK(cases.out.find("\"verdict\": \"only_in_a\"") != std::string::npos);
  CHECK(cases.out.find("\"verdict\": \"only_in_b\"") != std::string::npos);
  for (const std::string& f : {a, b, c, d}) std::remove(f.c_str());
}

TEST_CASE("list, export and plot on a real dump") {
  const std::string h5 = scratch("tools.h5"), json = h5 + ".json";
  run_cpdrift(
      "--seq-len 16 --tp-world-sizes 1 --cp-world-sizes 2 --kv-chunk-sizes 4 --dump-inputs "
      "--include-backward --include-dlogp --modes chunked_prefill,paged_prefill,decode "
      "--page-size 4 --fixed-split-size 8",
      h5, json);
  const std::string kase = "qwen3_8b_tp1_cp2_chunk4_bf16";
  // list: the cases, their tensors and shapes; JSON with the same.
  const Result text = inspect("list " + h5);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("\ncase " + kase +
                      "  cp_world_size=2  layout=contiguous  protocol=ag_rs"
                      "  split=4  tp_world_size=1\n") != std::string::npos);
  CHECK(text.out.find("  candidate_bf16/out                 [1, 32, 16, 128]     bfloat16") !=
        std::string::npos);
  const Value list = cpd::json::parse(inspect("list " + h5 + " --json").out);
  const Value report = cpd::json::parse(slurp(json));
  CHECK(list.at("cases").size() == report.at("cases").size() + report.at("paged_cases").size());
  CHECK(list.at("inputs").size() == 3);
  CHECK(list.at("attributes").at("seed").as_int64() == 2355);
  // export: the .npy holds the dataset's values in its shape (each name form works).
  const std::string npy = scratch("out.npy");
  for (const std::string& name :
       {kase + "/candidate_bf16/out", "/cases/" + kase + "/candidate_bf16/out"}) {
    CAPTURE(name);
    const Result r = inspect("export " + h5 + " " + name + " -o " + npy);
    REQUIRE(r.status == 0);
    CHECK(r.out.rfind("wrote " + npy + ": /cases/" + kase + "/candidate_bf16/out [1, 32, 16, 128]",
                      0) == 0);
    const std::string bytes = inspect_test::file_bytes(npy);
    REQUIRE(bytes.size() > 128);
    CHECK(bytes.find("'shape': (1, 32, 16, 128)") != std::string::npos);
    const std::size_t header =
        10 + (static_cast<unsigned char>(bytes[8]) |
              static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    std::vector<float> want(32 * 16 * 128);
    const hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t d = H5Dopen2(f, ("/cases/" + kase + "/candidate_bf16/out").c_str(), H5P_DEFAULT);
    H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, want.data());
    H5Dclose(d);
    H5Fclose(f);
    REQUIRE(bytes.size() == header + want.size() * 4);
    CHECK(std::memcmp(bytes.data() + header, want.data(), want.size() * 4) == 0);
  }
  CHECK(inspect("export " + h5 + " inputs/q -o " + npy).status == 0);
  const Result unknown = inspect("export " + h5 + " nope/out -o " + npy);
  CHECK(unknown.status == 2);
  CHECK(unknown.err == "cpdrift-inspect: error: " + h5 +
                           ": no tensor nope/out (cpdrift-inspect list names them: /inputs/q, "
                           "CASE/LEG/NAME)\n");
  // plot: an SVG with the case and a strip per CP rank.
  const std::string svg = scratch("plot.svg");
  const Result plot = inspect("plot " + h5 + " -o " + svg);
  REQUIRE(plot.status == 0);
  CHECK(plot.out == "wrote " + svg + ": 1 case\n");
  const std::string drawn = slurp(svg);
  CHECK(drawn.rfind("<svg ", 0) == 0);
  CHECK(drawn.find(">" + kase + "<") != std::string::npos);
  CHECK(drawn.find(">rank 1<") != std::string::npos);
  for (const std::string& f : {h5, json, npy, svg}) std::remove(f.c_str());
}

TEST_CASE("truncated, corrupted, foreign, empty and missing files: one line, status 2") {
  const std::string good = scratch("good.h5");
  run_cpdrift("--seq-len 16 --tp-world-sizes 1 --cp-world-sizes 2 --kv-chunk-sizes 4", good, "", 1);
  const std::string bytes = inspect_test::file_bytes(good);
  const std::string truncated = scratch("truncated.h5"), corrupted = scratch("corrupted.h5"),
                    foreign = scratch("foreign.h5"), empty = scratch("empty.h5"),
                    text = scratch("text.h5"), missing = scratch("missing.h5"),
                    directory = scratch("dir.h5");
  inspect_test::write_bytes(truncated, bytes.substr(0, bytes.size() / 2));
  std::string broken = bytes;
  broken.replace(0, 8, "NOTHDF5!");
  inspect_test::write_bytes(corrupted, broken);
  inspect_test::write_foreign_file(foreign);
  inspect_test::write_bytes(empty, "");
  inspect_test::write_bytes(text, "schema_version: ws2_cp_attention_drift/v2\n");
  std::filesystem::create_directory(directory);
  const std::map<std::string, std::string> says = {
      {truncated, "truncated: the file has " + std::to_string(bytes.size() / 2) +
                      " bytes, its superblock says " + std::to_string(bytes.size())},
      {corrupted, "not an HDF5 file (no HDF5 superblock)"},
      {foreign, "not a cpdrift dump (no schema_version attribute on /)"},
      {empty, "empty file (0 bytes), not a dump"},
      {text, "not an HDF5 file (no HDF5 superblock)"},
      {missing, "no such file"},
      {directory, "is a directory, not a dump"},
  };
  const std::string out = scratch("never.out");
  for (const auto& [file, why] : says) {
    CAPTURE(file);
    for (const std::string& command :
         {"list " + file, "summary " + file + " --json", "plot " + file + " -o " + out,
          "export " + file + " inputs/q -o " + out, "diff " + file + " " + good,
          "diff " + good + " " + file}) {
      CAPTURE(command);
      const Result r = inspect(command);
      check_refused(r, file);
      CHECK(r.err == "cpdrift-inspect: error: " + file + ": " + why + "\n");
    }
  }
  CHECK_FALSE(std::filesystem::exists(out));
  for (const std::string& f : {good, truncated, corrupted, foreign, empty, text})
    std::remove(f.c_str());
  std::filesystem::remove(directory);
}

TEST_CASE("metadata HDF5 itself faults on is still one line and status 2") {
  // A dump whose attribute message was corrupted so that HDF5 1.10.8 faults (SIGSEGV) freeing
  // it: the fault guard names the file. On an HDF5 that survives it, the reader refuses it.
  const std::string file = scratch("hdf5_fault.h5");
  std::filesystem::copy_file(std::string(CPD_INSPECT_FIXTURES) + "/hdf5_fault.h5", file,
                             std::filesystem::copy_options::overwrite_existing);
  const Result r = inspect("summary " + file);
  check_refused(r, file);
  std::remove(file.c_str());
}

TEST_CASE("--help for the tool and every subcommand") {
  const Result tool = inspect("--help");
  CHECK(tool.status == 0);
  CHECK(tool.out.find("usage: cpdrift-inspect COMMAND") == 0);
  for (const char* command : {"list", "summary", "diff", "export", "plot"}) {
    CAPTURE(command);
    const Result r = inspect(std::string(command) + " --help");
    CHECK(r.status == 0);
    CHECK(r.out.find(std::string("usage: cpdrift-inspect ") + command) == 0);
  }
  const Result bad = inspect("summary");
  CHECK(bad.status == 2);
  CHECK(bad.err ==
        "cpdrift-inspect: error: summary: expects 1 file, got 0 (see cpdrift-inspect "
        "summary --help)\n");
}
