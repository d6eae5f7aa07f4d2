// The HDF5 dump through the command line: a complete, self-describing file, no temporary left
// by a killed run, the same bits on 1, 2 and 4 processes, a refused write said in one line, and
// a build without HDF5 refusing --dump up front.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cli_support.h"
#include "random_rows.h"
#include "report/json.h"

#if defined(CPD_HAVE_HDF5)
#include <hdf5.h>
#endif

using namespace cli_test;

#if defined(CPD_HAVE_HDF5)
TEST_CASE("--dump writes a complete, self-describing file and no temporary") {
  const std::string dir = tmp_dir();
  const std::string h5 = dir + "/cpdrift_cli_dump_" + std::to_string(::getpid()) + ".h5";
  const std::string js = h5 + ".json";
  const std::string args = "--seq-len 16 --cp-world-sizes 2 --kv-chunk-sizes 4 --dump " + h5 +
                           " --dump-inputs --output " + js + " --quiet";
#if defined(CPD_HAVE_MPI)
  const Result r = run_mpi(2, args);  // rank 0 receives the other process's pieces
#else
  const Result r = run(args);
#endif
  REQUIRE(r.status == 0);
  const hid_t f = H5Fopen(h5.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  // The report inside the dump is the report written beside it.
  const hid_t d = H5Dopen2(f, "/report_json", H5P_DEFAULT);
  REQUIRE(d >= 0);
  const hid_t type = H5Dget_type(d);
  std::string text(H5Tget_size(type), '\0');
  REQUIRE(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()) >= 0);
  text.resize(std::strlen(text.c_str()));
  CHECK(text == slurp(js));
  for (const char* path : {"/inputs/q", "/inputs/k", "/inputs/v",
                           "/cases/qwen3_8b_tp1_cp2_chunk4_bf16/reference_fp32/out",
                           "/cases/qwen3_8b_tp1_cp2_chunk4_bf16/candidate_bf16/lse"}) {
    CAPTURE(path);
    CHECK(H5Oexists_by_name(f, path, H5P_DEFAULT) > 0);
  }
  CHECK(H5Aexists(f, "seed") > 0);
  H5Tclose(type);
  H5Dclose(d);
  H5Fclose(f);
  // No temporary is left behind.
  const Result ls = run_command("ls " + h5 + ".cpdrift-partial.* 2>/dev/null | wc -l");
  CHECK(ls.out == "0\n");
  std::remove(h5.c_str());
  std::remove(js.c_str());
}

TEST_CASE("a run killed while dumping leaves no temporary file behind") {
  // SIGTERM (what mpirun sends when it ends a job) once the temporary exists: the process dies
  // of the signal, and neither the temporary nor a partial dump remains. (Without the guard
  // the temporary stays: checked by hand against the previous build.)
  const std::string dir = tmp_dir();
  const std::string h5 = dir + "/cpdrift_cli_killed_" + std::to_string(::getpid()) + ".h5";
  const Result r = run_command(
      "( " + bin() + " --seq-len 4096 --kv-chunk-sizes 256 --quiet --dump " + h5 + " & p=$!; " +
      "seen=0; for i in $(seq 2400); do " +  // up to 120 s: a sanitized build is slow
      "ls " + h5 + ".cpdrift-partial.* >/dev/null 2>&1 && { seen=1; break; }; sleep 0.05; done; " +
      "kill -TERM $p; wait $p; s=$?; echo seen=$seen status=$s; ls " + h5 +
      "* 2>/dev/null | wc -l )");
  CHECK(r.out == "seen=1 status=143\n0\n");  // killed with its temporary; 128 + SIGTERM; no file
}

#if defined(CPD_HAVE_MPI)
namespace {

// Every float dataset of an HDF5 file, by path.
herr_t collect_dataset(hid_t group, const char* name, const H5L_info_t*, void* data) {
  auto& all = *static_cast<std::map<std::string, std::vector<float>>*>(data);
  const hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
  if (obj < 0) return -1;
  if (H5Iget_type(obj) == H5I_DATASET) {
    const hid_t type = H5Dget_type(obj), space = H5Dget_space(obj);
    if (H5Tget_class(type) == H5T_FLOAT) {
      std::vector<float> values(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
      // Case names carry a non-default protocol ("…_ring_kv"): compare across protocols.
      std::string key = name;
      for (const std::string suffix : {"_ring_kv/", "_allgather_kv/"}) {
        if (const std::size_t at = key.find(suffix); at != std::string::npos)
          key.erase(at, suffix.size() - 1);
      }
      if (H5Dread(obj, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0)
        all[key] = std::move(values);
    }
    H5Sclose(space);
    H5Tclose(type);
  }
  H5Oclose(obj);
  return 0;
}

std::map<std::string, std::vector<float>> float_datasets(const std::string& path) {
  std::map<std::string, std::vector<float>> all;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &all);
  H5Fclose(f);
  return all;
}

}  // namespace

TEST_CASE("dumps hold the same bits for 1, 2 and 4 processes and every protocol") {
  // Every tensor of the file — inputs, references, FP32/BF16/bf16_kernel candidates, the
  // gradients and the logprobs — bit for bit, whoever computed it and however states moved.
  // Negative control: another seed changes the inputs, and the comparison says so.
  const std::string dir = tmp_dir();
  const std::string base = dir + "/cpdrift_cli_same_" + std::to_string(::getpid());
  const std::string args =
      "--seq-len 32 --tp-world-sizes 2 --cp-world-sizes 2 --kv-chunk-sizes none,8 "
      "--include-backward "
      "--include-dlogp --dump-inputs --quiet";
  struct Run {
    int processes;
    std::string protocol, extra;
  };
  const std::vector<Run> runs = {{1, "ag_rs", ""},
                                 {2, "ring_kv", ""},
                                 {4, "allgather_kv", ""},
                                 {4, "ag_rs", ""},
                                 {4, "ag_rs", " --seed 7"}};
  std::vector<std::map<std::string, std::vector<float>>> dumps;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string h5 = base + "_" + std::to_string(i) + ".h5";
    const Result r = run_mpi(runs[i].processes, args + " --protocols " + runs[i].protocol +
                                                    runs[i].extra + " --dump " + h5);
    REQUIRE(r.status == 0);
    dumps.push_back(float_datasets(h5));
    std::remove(h5.c_str());
  }
  const auto& first = dumps.front();
  // q, k, v; per case 8 out/lse, 6 out/lse of the production lanes, 6 gradients, 2 logp
  CHECK(first.size() == 3 + 2 * 22);
  CHECK(first.count("cases/qwen3_8b_tp2_cp2_chunk8_bf16/te_p2p/out") == 1);
  CHECK(first.count("cases/qwen3_8b_tp2_cp2_chunk8_bf16/candidate/logp") == 1);
  CHECK(first.count("cases/qwen3_8b_tp2_cp2_chunk8_bf16/candidate_fp32/dk") == 1);
  for (std::size_t i = 1; i + 1 < dumps.size(); ++i) {
    CAPTURE(runs[i].processes);
    CAPTURE(runs[i].protocol);
    REQUIRE(dumps[i].size() == first.size());
    for (const auto& [name, values] : first) {
      CAPTURE(name);
      CHECK(cpd::testing::same_bits(dumps[i].at(name), values));
    }
  }
  CHECK_FALSE(cpd::testing::same_bits(dumps.back().at("inputs/q"), first.at("inputs/q")));
}

TEST_CASE("--inputs reads a --dump-inputs file back: every forward tensor bit for bit") {
  // Run 1 generates (seed 2355) and dumps its inputs; run 2 reads them (--inputs) on another
  // process count with --seed 7. Its q, k, v are the file's, so every forward tensor equals run
  // 1's; its dO and lm_head come from seed 7, so the gradients and logprobs differ: the control
  // that run 2 did not just generate again.
  const std::string base = tmp_dir() + "/cpdrift_cli_inputs_" + std::to_string(::getpid());
  const std::string args =
      "--tp-world-sizes 2 --cp-world-sizes 2 --kv-chunk-sizes none,8 --include-backward "
      "--include-dlogp --dump-inputs --quiet";
  const std::string h1 = base + "_1.h5", h2 = base + "_2.h5", js = base + "_2.json";
  REQUIRE(run_mpi(4, "--seq-len 32 --batch 2 " + args + " --dump " + h1).status == 0);
  const Result r =
      run_mpi(2, "--inputs " + h1 + " --seed 7 " + args + " --dump " + h2 + " --output " + js);
  REQUIRE_MESSAGE(r.status == 0, r.err);
  const auto one = float_datasets(h1), two = float_datasets(h2);
  REQUIRE(one.size() == two.size());
  int forward = 0, other = 0;
  for (const auto& [name, values] : one) {
    CAPTURE(name);
    const bool gradient_or_logp = name.ends_with("/dq") || name.ends_with("/dk") ||
                                  name.ends_with("/dv") || name.ends_with("/logp");
    const bool same = cpd::testing::same_bits(two.at(name), values);
    CHECK(same != gradient_or_logp);
    ++(gradient_or_logp ? other : forward);
  }
  CHECK(forward > 20);
  CHECK(other > 4);
  // The report says where the inputs came from, with the file's digest.
  const cpd::json::Value report = cpd::json::parse(slurp(js));
  const cpd::json::Value& in = report.at("target").at("inputs");
  CHECK(report.at("target").at("input_distribution").as_string() == "file");
  CHECK(in.at("format").as_string() == "hdf5");
  CHECK(in.at("rope_applied").as_bool());
  CHECK(in.at("sha256").as_string() + "  " + h1 + "\n" == run_command("sha256sum " + h1).out);
  CHECK(report.at("target").at("batch").as_int64() == 2);
  CHECK(report.at("target").at("seq_len").as_int64() == 32);
  for (const std::string& f : {h1, h2, js}) std::remove(f.c_str());
}
#endif

TEST_CASE("a dump the file system refuses says why, with its path, and leaves no file") {
  // `ulimit -f` (20 MB, below the dump's size) makes the writes past it fail with EFBIG, as a
  // full disk fails them with ENOSPC: the same path through HDF5's error stack to one line.
  const std::string h5 = tmp_dir() + "/cpdrift_cli_full_" + std::to_string(::getpid()) + ".h5";
  const std::string args = "--seq-len 1024 --cp-world-sizes 2 --kv-chunk-sizes 64 --quiet --dump ";
  const Result r = run_command("( ulimit -f 20000; " + bin() + " " + args + h5 + " )");
  CHECK(r.status == 3);
  CHECK(r.err.rfind("cpdrift: error: cannot write dump \"" + h5 + "\": File too large (", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(run_command("ls " + h5 + "*").status != 0);  // neither the dump nor its temporary
}
#else
TEST_CASE("--dump without HDF5 is refused up front") {
  const Result r = run("--dump x.h5");
  CHECK(r.status == 2);
  CHECK(r.err.find("built without HDF5") != std::string::npos);
}
#endif
