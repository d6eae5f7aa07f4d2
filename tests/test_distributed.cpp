// Under mpirun (2 and 4 processes): the MPI transport and collectives against the
// single-process run. Protocol equivalence and placement invariance (bitwise), reports
// identical apart from placement fields, exact distributed statistics, and the HDF5 dump read
// back bit for bit. Faults: test_distributed_faults.cpp; acceptance: test_distributed_accept.cpp.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "case_digests.h"
#include "comm/mpi_check.h"  // the check itself, white-box
#include "engine/case_runner.h"
#include "engine/paged/paged_case.h"
#include "engine/tensor_layout.h"
#include "metrics/digest.h"
#include "mpi_support.h"
#include "recorded_run.h"
#include "report/run_report.h"
#include "run_env.h"

#if defined(CPD_HAVE_HDF5)
#include <hdf5.h>
#endif

using namespace cpd;
using cpd::testing::comm;
using cpd::testing::recorded_case;
using cpd::testing::recorded_paged_cases;
using cpd::testing::RunEnv;

namespace {

using testing::Digests;
using testing::digests_of;
using testing::kBf16Kernel;
using testing::kFp32;
using testing::small_problem;

// This process alone, every logical rank in-process: the W = 1 result.
Digests single_process(const Problem& p, const CaseSpec& spec, const PathSpec& path) {
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, spec);
  return digests_of(grid, run_protocol(grid, path, transport, inputs, {}), LocalCollectives(), 1,
                    0);
}

Digests distributed(const Problem& p, const CaseSpec& spec, const PathSpec& path,
                    Transport& transport) {
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  const CaseGrid grid(p, spec);
  return digests_of(grid, run_protocol(grid, path, transport, inputs, {}), comm().collectives(),
                    comm().size(), comm().rank());
}

const std::vector<CaseSpec> kSpecs = {
    CaseSpec{1, 2, 4, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{2, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{1, 4, 8, CpLayout::zigzag, Protocol::ag_rs},
    CaseSpec{2, 4, 4, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{1, 1, 16, CpLayout::contiguous, Protocol::ag_rs},
    CaseSpec{8, 2, std::nullopt, CpLayout::zigzag, Protocol::ag_rs},
};

}  // namespace

TEST_CASE("every protocol over MPI equals the single-process run, bit for bit") {
  const Problem p = small_problem();
  const std::unique_ptr<Transport> transport = make_mpi_transport(comm());
  for (CaseSpec spec : kSpecs) {
    for (const PathSpec& path : {kFp32, kBf16Kernel}) {
      const Digests alone = comm().rank() == 0 ? single_process(p, spec, path) : Digests{};
      for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
        spec.protocol = protocol;
        const Digests d = distributed(p, spec, path, *transport);
        if (comm().rank() != 0) continue;
        CAPTURE(case_name(spec, testing::problem_in(DType::fp32)));
        CHECK(d.out == alone.out);
        CHECK(d.lse == alone.lse);
      }
    }
  }
  // Negative control: the distributed digests do see a different grid.
  const Digests a = distributed(
      p, CaseSpec{1, 2, std::nullopt, CpLayout::contiguous, Protocol::ring_kv}, kFp32, *transport);
  const Digests b = distributed(
      p, CaseSpec{1, 1, std::nullopt, CpLayout::contiguous, Protocol::ring_kv}, kFp32, *transport);
  if (comm().rank() == 0) CHECK(a.out != b.out);
}

TEST_CASE("shaped inputs: every protocol over MPI equals the single-process run, bit for bit") {
  // The sink and outlier shaping is a function of global coordinates, so each process's slice
  // is the whole tensor's: the same bits as one process, whatever the grid.
  const std::unique_ptr<Transport> transport = make_mpi_transport(comm());
  for (const InputDistribution dist : {InputDistribution::sink, InputDistribution::mix}) {
    Problem p = small_problem();
    p.distribution = dist;
    for (CaseSpec spec : {kSpecs[0], kSpecs[2], kSpecs[3]}) {
      const Digests alone = comm().rank() == 0 ? single_process(p, spec, kFp32) : Digests{};
      for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
        spec.protocol = protocol;
        const Digests d = distributed(p, spec, kFp32, *transport);
        if (comm().rank() != 0) continue;
        CAPTURE(to_string(dist));
        CAPTURE(case_name(spec, testing::problem_in(DType::fp32)));
        CHECK(d.out == alone.out);
        CHECK(d.lse == alone.lse);
      }
    }
  }
  // Negative control: the digests see the distribution.
  Problem shaped = small_problem();
  shaped.distribution = InputDistribution::mix;
  const Digests a = distributed(shaped, kSpecs[0], kFp32, *transport);
  const Digests b = distributed(small_problem(), kSpecs[0], kFp32, *transport);
  if (comm().rank() == 0) CHECK(a.out != b.out);
}

TEST_CASE("distributed statistics equal the single-process ones bit for bit") {
  std::mt19937_64 rng(42);
  std::lognormal_distribution<float> dist(-10.0f, 3.0f);
  const std::size_t n = 100003;
  std::vector<float> cand(n), ref(n);
  for (std::size_t i = 0; i < n; ++i) {
    ref[i] = dist(rng);
    cand[i] = i % 5 == 0 ? ref[i] : ref[i] + dist(rng);
  }
  const DiffPart whole{cand.data(), ref.data(), n};
  const DiffStats alone = compute_diff_stats(std::span<const DiffPart>(&whole, 1));
  const std::size_t w = static_cast<std::size_t>(comm().size()),
                    r = static_cast<std::size_t>(comm().rank());
  const std::size_t begin = n * r / w, end = n * (r + 1) / w;
  const DiffPart mine{cand.data() + begin, ref.data() + begin, end - begin};
  const DiffStats together =
      compute_diff_stats(std::span<const DiffPart>(&mine, 1), comm().collectives());
  CHECK(together.max_abs == alone.max_abs);
  CHECK(together.mean_abs == alone.mean_abs);
  CHECK(together.p95_abs == alone.p95_abs);
  CHECK(together.p99_abs == alone.p99_abs);
  CHECK(together.active_count == alone.active_count);
  CHECK(together.mismatch_count == alone.mismatch_count);
  CHECK(together.max_ulp == alone.max_ulp);
}

namespace {

// The case JSON without what legitimately depends on placement and time.
json::Value portable(json::Value c) {
  c.as_object().erase("execution");
  c.as_object().erase("distributed_p2p_reference");
  for (const char* k : {"placement", "physical_processes", "transport"})
    c["topology"].as_object().erase(k);
  c["provenance"]["deterministic_controls"].as_object().erase("threads");
  return c;
}

std::vector<json::Value> report_cases(const RunContext& ctx, const std::vector<CaseSpec>& specs) {
  RunReport r;
  r.problem = ctx.problem;
  r.provenance.world_size = ctx.collectives.size();
  std::vector<json::Value> out;
  for (const CaseSpec& s : specs) out.push_back(portable(case_json(r, recorded_case(ctx, s))));
  return out;
}

}  // namespace

TEST_CASE("reports are identical for one process and for all of them") {
  const Problem p = small_problem();
  std::vector<CaseSpec> specs;
  for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
    specs.push_back(CaseSpec{2, 2, 8, CpLayout::zigzag, protocol});
    specs.push_back(CaseSpec{1, 4, std::nullopt, CpLayout::contiguous, protocol});
  }
  const std::vector<json::Value> together = report_cases(RunEnv(p, true).ctx, specs);
  if (comm().rank() != 0) return;
  const std::vector<json::Value> alone = report_cases(RunEnv(p, false).ctx, specs);
  REQUIRE(alone.size() == together.size());
  for (std::size_t i = 0; i < alone.size(); ++i) {
    CAPTURE(i);
    CHECK(json::to_string(together[i]) == json::to_string(alone[i]));
  }
  // Across protocols only the names differ: the drift sections are the same bytes.
  CHECK(json::to_string(together[0].at("drift")) == json::to_string(together[2].at("drift")));
  CHECK(json::to_string(together[1].at("per_rank")) == json::to_string(together[5].at("per_rank")));
  CHECK(json::to_string(together[1].at("backward")) == json::to_string(together[3].at("backward")));
  CHECK(together[0].at("backward").at("status").as_string() == "available");
  CHECK(together[0].at("dlogp").at("status").as_string() == "available");
}

TEST_CASE("paged cases: the report section is the same for one process and for all of them") {
  Problem p = small_problem();
  p.seq_len = 40;
  p.batch = 3;
  std::vector<PagedCaseSpec> specs;
  for (const SplitKv split : {SplitKv{SplitPolicy::disabled, 0}, SplitKv{SplitPolicy::fixed, 8}}) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode})
      specs.push_back(PagedCaseSpec{m, split});
  }
  const PagedOptions options{4, std::nullopt, 17};
  const auto section = [&](const RunContext& ctx) {
    RunReport r;
    r.problem = p;
    std::vector<std::string> out;
    for (const PagedCaseResult& c : recorded_paged_cases(ctx, options, specs)) {
      json::Value v = paged_case_json(r, c);
      v.as_object().erase("execution");  // time and process count
      out.push_back(json::to_string(v));
    }
    return out;
  };
  const std::vector<std::string> together = section(RunEnv(p, true).ctx);
  if (comm().rank() != 0) return;
  const std::vector<std::string> alone = section(RunEnv(p, false).ctx);
  REQUIRE(alone.size() == together.size());
  for (std::size_t i = 0; i < alone.size(); ++i) {
    CAPTURE(i);
    CHECK(together[i] == alone[i]);
    const json::Value v = json::parse(together[i]);
    for (const auto& [name, inv] : v.at("paged").at("invariance").as_object()) {
      CAPTURE(name);
      CHECK(inv.at("passed").as_bool());
    }
  }
}

#if defined(CPD_HAVE_HDF5)
namespace {

std::vector<float> read_dataset(const std::string& file, const std::string& path) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const hid_t space = H5Dget_space(d);
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space));
  std::vector<float> data(n);
  REQUIRE(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  return data;
}

// The single-process tensor in global order, gathered through the same stream.
std::vector<float> global_values(const CaseGrid& grid, const std::vector<RankOutput>& outs,
                                 bool out) {
  std::vector<const Shard*> shards;
  for (const RankOutput& r : outs) shards.push_back(out ? &r.merged.out : &r.merged.lse);
  const GlobalTensor t = global_tensor(grid, 1, 0, out ? grid.problem.dims.head_dim : 1, shards);
  std::vector<float> values;
  stream_digest(LocalCollectives(), t, DigestFormat::fp32,
                [&](const GlobalPiece& piece, const float* rows) {
                  values.insert(values.end(), rows, rows + piece.tokens.size() * t.width);
                });
  return values;
}

}  // namespace

TEST_CASE("the HDF5 dump, written by rank 0 piece by piece, reads back bit for bit") {
  const Problem p = small_problem();
  const CaseSpec spec{2, 2, 8, CpLayout::zigzag, Protocol::ring_kv};
  const std::string path =
      comm().broadcast("/tmp/cpdrift_test_dump_" + std::to_string(::getpid()) + ".h5", 0);
  {
    ThreadPool pool(1);
    InputStore inputs(p, pool);
    LocalCp1Results cp1;
    const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
    std::unique_ptr<TensorDump> dump = comm().rank() == 0 ? open_tensor_dump(path) : nullptr;
    const RunContext ctx{p, pool, inputs, *mpi, comm().collectives(), cp1};
    recorded_case(ctx, spec, dump.get(), true);
    if (dump) dump->commit();
  }
  if (comm().rank() != 0) return;
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, spec);
  const std::vector<RankOutput> fp32 = run_protocol(grid, kFp32, transport, inputs, {});
  const std::string base = "/cases/" + case_name(spec, p) + "/candidate_fp32/";
  const std::vector<float> out = read_dataset(path, base + "out"),
                           lse = read_dataset(path, base + "lse");
  const std::vector<float> want_out = global_values(grid, fp32, true),
                           want_lse = global_values(grid, fp32, false);
  REQUIRE(out.size() == want_out.size());
  REQUIRE(lse.size() == want_lse.size());
  CHECK(std::memcmp(out.data(), want_out.data(), out.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(lse.data(), want_lse.data(), lse.size() * sizeof(float)) == 0);
  // Negative control: another tensor of the same file differs.
  const std::vector<float> kernel =
      read_dataset(path, "/cases/" + case_name(spec, p) + "/bf16_kernel/out");
  CHECK(std::memcmp(kernel.data(), want_out.data(), out.size() * sizeof(float)) != 0);
  std::remove(path.c_str());
}
#endif

TEST_CASE("CPD_MPI_CHECK: MPI's own failure becomes a LibraryError naming host, rank and call") {
  // cpdrift's communicators return errors instead of aborting (CommContext sets
  // MPI_ERRORS_RETURN), so an invalid call comes back as a code for the check to decode.
  int rank = -1;
  try {
    CPD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_NULL, &rank));
    FAIL("MPI_Comm_rank(MPI_COMM_NULL) succeeded");
  } catch (const LibraryError& e) {
    const std::string what = e.what();
    CHECK(e.library() == "MPI");
    CHECK(what.find(" rank " + std::to_string(comm().rank()) + " ") != std::string::npos);
    CHECK(what.find("test_distributed.cpp:") != std::string::npos);
    CHECK(what.find("MPI_Comm_rank(MPI_COMM_NULL, &rank) failed: ") != std::string::npos);
  }
}
