// Under mpirun (2 and 4 processes): the MPI transport and collectives against the
// single-process run. Protocol equivalence and placement invariance (bitwise), reports
// identical apart from placement fields, manifest violations failing every rank alike,
// exact distributed statistics, and the HDF5 dump read back bit for bit.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>

#include "case_digests.h"
#include "cpdrift/accept/acceptance.h"
#include "cpdrift/core/errors.h"
#include "cpdrift/engine/backward.h"
#include "cpdrift/engine/case_runner.h"
#include "cpdrift/engine/dlogp.h"
#include "cpdrift/engine/merge_checks.h"
#include "cpdrift/engine/tensor_stream.h"
#include "cpdrift/paged/paged_case.h"
#include "cpdrift/report/run_report.h"
#include "fault_transport.h"
#include "mpi_support.h"

#if defined(CPD_HAVE_HDF5)
#include <hdf5.h>
#endif

using namespace cpd;
using cpd::testing::comm;

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
  return digests_of(grid, run_protocol(grid, path, transport, inputs, false), LocalCollectives(), 1,
                    0);
}

Digests distributed(const Problem& p, const CaseSpec& spec, const PathSpec& path,
                    Transport& transport) {
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  const CaseGrid grid(p, spec);
  return digests_of(grid, run_protocol(grid, path, transport, inputs, false), comm().collectives(),
                    comm().size(), comm().rank());
}

// Whether `error` says one of the '|'-separated alternatives of `expect`, followed by `what`.
bool says(const std::string& error, const std::string& expect, const std::string& what = "") {
  for (std::size_t from = 0;;) {
    const std::size_t bar = expect.find('|', from);
    if (error.find(expect.substr(from, bar - from) + what) != std::string::npos) return true;
    if (bar == std::string::npos) return false;
    from = bar + 1;
  }
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
        CAPTURE(case_name(spec, DType::fp32));
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

TEST_CASE("a bad message on one process fails every rank with the same error, without a hang") {
  const Problem p = small_problem();
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  struct Fault {
    Protocol protocol;
    MessageKind kind;
    const char* expect;
    std::function<void(std::vector<Message>&)> tamper;
  };
  const std::vector<Fault> faults = {
      {Protocol::ag_rs, MessageKind::partial_state, "missing",
       [](std::vector<Message>& m) { m.pop_back(); }},
      {Protocol::ag_rs, MessageKind::partial_state, "duplicated",
       [](std::vector<Message>& m) { m.push_back(m.back()); }},
      // A short payload between processes is caught as a malformed buffer, within one as a
      // mis-shaped message: either way it names the message.
      {Protocol::ring_kv, MessageKind::kv_shard, "-shaped|malformed",
       [](std::vector<Message>& m) { m.back().payload.resize(m.back().payload.size() / 2); }},
      {Protocol::allgather_kv, MessageKind::kv_shard, "unexpected",
       [](std::vector<Message>& m) { m.back().header.token_begin += 1; }},
  };
  for (const Fault& f : faults) {
    CAPTURE(std::string(f.expect));
    // Only the last process tampers; everybody must hear about it.
    const bool tamper_here = comm().rank() == comm().size() - 1;
    testing::FaultInjectingTransport transport(*mpi, f.kind, [&](std::vector<Message>& m) {
      if (tamper_here && !m.empty()) f.tamper(m);
    });
    ThreadPool pool(1);
    InputStore inputs(p, pool);
    const CaseGrid grid(p, CaseSpec{2, 4, 8, CpLayout::contiguous, f.protocol});
    std::string error;
    try {
      run_protocol(grid, kFp32, transport, inputs, false);
    } catch (const ProtocolError& e) {
      error = e.what();
    }
    CAPTURE(error);
    CHECK(says(error, f.expect));
    CHECK(error.find("logical rank") != std::string::npos);
    CHECK(comm().same_everywhere(error));
  }
}

TEST_CASE("a bad backward or dlogp message fails every rank with an error naming it, no hang") {
  const Problem p = small_problem();
  const std::unique_ptr<Transport> mpi = make_mpi_transport(comm());
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  const CaseGrid grid(p, CaseSpec{2, 4, 8, CpLayout::contiguous, Protocol::ag_rs});
  const std::vector<RankOutput> forward = run_protocol(grid, kFp32, *mpi, inputs, false);
  std::vector<const AttnShard*> hidden;
  for (const RankOutput& o : forward) hidden.push_back(&o.merged);
  // A fault damages message i and returns the header the error must then name.
  using Messages = std::vector<Message>;
  struct Fault {
    const char* expect;
    std::function<MessageHeader(Messages&, std::size_t)> tamper;
  };
  const std::vector<Fault> faults = {
      {"missing",
       [](Messages& m, std::size_t i) {
         const MessageHeader h = m[i].header;
         m.erase(m.begin() + static_cast<std::ptrdiff_t>(i));
         return h;
       }},
      {"duplicated",
       [](Messages& m, std::size_t i) {
         m.push_back(m[i]);
         return m[i].header;
       }},
      {"mis-shaped|malformed",
       [](Messages& m, std::size_t i) {
         m[i].payload.resize(m[i].payload.size() / 2);
         return m[i].header;
       }},
      {"mis-shaped",
       [](Messages& m, std::size_t i) {
         m[i].header.head_end += 1;
         return m[i].header;
       }},
      {"unexpected",
       [](Messages& m, std::size_t i) {
         m[i].header.token_begin += 1;
         return m[i].header;
       }},
  };
  const int world = comm().size(), me = comm().rank();
  for (const MessageKind kind :
       {MessageKind::backward_rows, MessageKind::dq_partial, MessageKind::logit_partial}) {
    for (const Fault& f : faults) {
      CAPTURE(std::string(to_string(kind)));
      CAPTURE(std::string(f.expect));
      // Only the last process tampers, with its last message bound for another process (so a
      // short payload ends its buffer) or else its last message; everybody must hear about it.
      std::string named, at;  // the damaged message, and "process P: " of its destination
      testing::FaultInjectingTransport transport(*mpi, kind, [&](Messages& m) {
        if (me != world - 1 || m.empty()) return;
        std::size_t i = m.size() - 1;
        for (std::size_t j = 0; j < m.size(); ++j) {
          if (process_of(m[j].header.dst, world) != me) i = j;
        }
        const MessageHeader h = f.tamper(m, i);
        named = describe(h);
        at = "process " + std::to_string(process_of(h.dst, world)) + ": ";
      });
      std::string error;
      try {
        if (kind == MessageKind::logit_partial) {
          run_dlogp(grid, hidden, hidden, 17, transport, inputs.backend());
        } else {
          run_backward(grid, forward, transport, inputs);
        }
      } catch (const ProtocolError& e) {
        error = e.what();
      }
      named = comm().broadcast(named, world - 1);
      at = comm().broadcast(at, world - 1);
      CAPTURE(error);
      CAPTURE(named);
      CHECK(named.rfind(to_string(kind), 0) == 0);
      CHECK(error.rfind(at, 0) == 0);
      CHECK(says(error, f.expect, " " + named));
      CHECK(comm().same_everywhere(error));
    }
  }
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

// Everything a RunContext points at, over MPI (every process) or in this process alone, with
// the backward and dlogp legs on.
struct RunEnv {
  RunEnv(const Problem& p, bool over_mpi)
      : problem(p),
        inputs(problem, pool),
        transport(over_mpi ? make_mpi_transport(comm())
                           : std::unique_ptr<Transport>(std::make_unique<InProcessTransport>())),
        ctx{problem, pool, inputs, *transport, over_mpi ? comm().collectives() : one, cp1} {
    ctx.cp1_backward = &cp1_backward;
    ctx.vocab_size = 17;
  }
  Problem problem;
  ThreadPool pool{1};
  InputStore inputs;
  LocalCp1Results cp1;
  LocalCp1Backward cp1_backward;
  LocalCollectives one;
  std::unique_ptr<Transport> transport;
  RunContext ctx;
};

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
  r.provenance.transport = ctx.transport.name();
  std::vector<json::Value> out;
  for (const CaseSpec& s : specs) out.push_back(portable(case_json(r, run_case(ctx, s))));
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
    for (const PagedCaseResult& c : run_paged_cases(ctx, options, specs)) {
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
    const RunContext ctx{p, pool, inputs, *mpi, comm().collectives(), cp1, true, dump.get()};
    run_case(ctx, spec);
    if (dump) dump->commit();
  }
  if (comm().rank() != 0) return;
  ThreadPool pool(1);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  const CaseGrid grid(p, spec);
  const std::vector<RankOutput> fp32 = run_protocol(grid, kFp32, transport, inputs, false);
  const std::string base = "/cases/" + case_name(spec, p.dtype) + "/candidate_fp32/";
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
      read_dataset(path, "/cases/" + case_name(spec, p.dtype) + "/bf16_kernel/out");
  CHECK(std::memcmp(kernel.data(), want_out.data(), out.size() * sizeof(float)) != 0);
  std::remove(path.c_str());
}
#endif

namespace {

// The accept command's evidence, run here: TP=2 CP=2 BF16, full and chunked prefill, every
// protocol, backward and dlogp.
json::Value evidence_report() {
  Problem p;
  p.seq_len = 16;
  p.batch = 2;
  RunEnv env(p, true);
  const RunContext& ctx = env.ctx;
  RunReport r;
  r.problem = p;
  r.vocab_size = 17;
  r.provenance.world_size = comm().size();
  r.provenance.transport = env.transport->name();
  for (const std::optional<std::int64_t> split :
       {std::optional<std::int64_t>{}, std::optional<std::int64_t>{4}}) {
    for (Protocol protocol : {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv}) {
      r.cases.push_back(run_case(ctx, CaseSpec{2, 2, split, CpLayout::contiguous, protocol}));
    }
  }
  std::vector<PagedCaseSpec> paged;
  for (const SplitKv split :
       {SplitKv{SplitPolicy::disabled, 0}, SplitKv{SplitPolicy::fixed, kAcceptFixedSplit}}) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode})
      paged.push_back(PagedCaseSpec{m, split});
  }
  r.paged_cases = run_paged_cases(ctx, PagedOptions{kAcceptPageSize, std::nullopt, 17}, paged);
  return report_json(r);
}

json::Value& case_named(json::Value& report, const std::string& name) {
  for (json::Value& c : report.at("cases").as_array()) {
    if (c.at("case_name").as_string() == name) return c;
  }
  FAIL("no case " << name);
  return report;
}

// The row fails on the doctored report, and one of its errors says `expect`.
void expect_failure(const AcceptanceRow& row, const json::Value& report, int world,
                    const char* expect) {
  const RowVerdict v = evaluate_row(row, report, AcceptanceThresholds{}, world, "report.json");
  CAPTURE(std::string(expect));
  CHECK(v.status == "failed");
  bool named = false;
  for (const std::string& e : v.errors) named = named || e.find(expect) != std::string::npos;
  CHECK(named);
}

AcceptanceRow row_named(const std::string& name) {
  for (const AcceptanceRow& r : required_matrix()) {
    if (r.name == name) return r;
  }
  FAIL("no row " << name);
  return {};
}

}  // namespace

TEST_CASE("acceptance: executed CPU rows pass, and every kind of bad evidence fails closed") {
  const json::Value report = evidence_report();
  if (comm().rank() != 0) return;
  const AcceptanceThresholds t;
  const int world = comm().size();
  const std::string chunked = "qwen3_8b_tp2_cp2_chunk4_bf16";
  for (const char* name : {"qwen3_8b_tp2_cp2_prefill_bf16", "qwen3_8b_tp2_cp2_chunk4_bf16",
                           "cp_protocol_equivalence_tp2_cp2_chunk4"}) {
    const RowVerdict v = evaluate_row(row_named(name), report, t, world, "report.json");
    CAPTURE(name);
    CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
    // With fewer processes than logical ranks the row is unavailable, never passed.
    CHECK(v.status == (world >= 4 ? "passed" : "unavailable"));
  }
  // The paged rows run at any job size.
  const char* paged_rows[] = {"paged_prefill_split_kv_disabled", "paged_prefill_split_kv_fixed",
                              "paged_decode_split_kv_disabled",  "paged_decode_split_kv_fixed",
                              "batch_invariance_paged",          "page_layout_invariance"};
  for (const char* name : paged_rows) {
    const RowVerdict v = evaluate_row(row_named(name), report, t, world, "report.json");
    CAPTURE(name);
    CAPTURE(v.errors.empty() ? std::string() : v.errors.front());
    CHECK(v.status == "passed");
  }
  struct PagedFault {
    const char* row;
    const char* expect;
    std::function<void(json::Value&)> apply;
  };
  const std::string fixed_decode = "qwen3_8b_tp1_decode_split_kv_fixed8_bf16";
  const std::vector<PagedFault> paged_faults = {
      {"paged_decode_split_kv_fixed", "passed is not true",
       [](json::Value& c) { c["paged"]["invariance"]["prefix_cache"]["passed"] = false; }},
      {"paged_decode_split_kv_fixed", "exceeds",
       [](json::Value& c) { c["paged"]["drift"]["candidate"]["lse"]["max_abs"] = 3e-3; }},
      {"paged_decode_split_kv_fixed", "exceeds",
       [](json::Value& c) {
         c["paged"]["invariance"]["decode_vs_prefill"]["out"]["max_abs"] = 1e-9;
       }},
      {"paged_decode_split_kv_fixed", "not run as requested",
       [](json::Value& c) { c["paged"]["split_kv"]["plans"].at(1)["actual_split_size"] = 4; }},
      {"paged_decode_split_kv_fixed", "do not cover",
       [](json::Value& c) { c["paged"]["split_kv"]["coverage_complete"] = false; }},
      {"paged_decode_split_kv_fixed", "fewer than 2 sequences",
       [](json::Value& c) { c["paged"]["shape"]["batch"] = 1; }},
      {"paged_decode_split_kv_fixed", "never cut",
       [](json::Value& c) {
         for (json::Value& plan : c["paged"]["split_kv"]["plans"].as_array()) {
           plan["blocks"] = json::parse("[[0, 1]]");
         }
       }},
      {"batch_invariance_paged", "applicable is not true",
       [](json::Value& c) { c["paged"]["invariance"]["batch_composition"]["applicable"] = false; }},
      {"page_layout_invariance", "missing invariance",
       [](json::Value& c) { c["paged"]["invariance"].as_object().erase("page_layout"); }},
  };
  for (const PagedFault& f : paged_faults) {
    json::Value bad = report;
    for (json::Value& c : bad.at("paged_cases").as_array()) {
      if (c.at("case_name").as_string() == fixed_decode) f.apply(c);
    }
    CAPTURE(std::string(f.row));
    expect_failure(row_named(f.row), bad, world, f.expect);
  }
  json::Value no_paged = report;
  no_paged["paged_cases"] = json::Value::array();
  CHECK(evaluate_row(row_named("page_layout_invariance"), no_paged, t, world, "r").status ==
        "not_run");
  if (world < 4) return;
  struct Fault {
    const char* expect;
    std::function<void(json::Value&)> apply;
  };
  const std::vector<Fault> faults = {
      {"missing metric",
       [](json::Value& c) { c["drift"]["cp_merge_fp32"]["out"].as_object().erase("max_abs"); }},
      {"non-finite",
       [](json::Value& c) { c["backward"]["report"]["drifts"].at(0)["dk"]["max_abs"] = nullptr; }},
      {"negative metric", [](json::Value& c) { c["dlogp"]["drift"]["max_abs"] = -1.0; }},
      // In memory a metric can be NaN or infinite (no comparison with the limit catches NaN).
      {"non-finite metric",
       [](json::Value& c) {
         c["dlogp"]["drift"]["max_abs"] = std::numeric_limits<double>::quiet_NaN();
       }},
      {"non-finite metric",
       [](json::Value& c) {
         c["drift"]["cp_merge_fp32"]["out"]["max_abs"] = std::numeric_limits<double>::infinity();
       }},
      {"exceeds", [](json::Value& c) { c["drift"]["cp_merge_fp32"]["lse"]["max_abs"] = 3e-4; }},
      {"not run as requested",
       [](json::Value& c) {
         c["provenance"]["actual_split_kv_plans"].at(1)["actual_split_kv_size"] = 8;
       }},
      {"incomplete plan-set coverage",
       [](json::Value& c) {
         c["provenance"]["actual_split_kv_plan_set"]["entries"].as_array().pop_back();
       }},
      {"emulated transport",
       [](json::Value& c) { c["distributed_p2p_reference"]["status"] = "skipped"; }},
      {"emulated transport",
       [](json::Value& c) { c["distributed_p2p_reference"]["transport"] = "inprocess"; }},
      {"bitwise",
       [](json::Value& c) { c["drift"]["topology_invariance"]["bitwise_equal"] = false; }},
  };
  for (const Fault& f : faults) {
    json::Value bad = report;
    f.apply(case_named(bad, chunked));
    expect_failure(row_named(chunked), bad, world, f.expect);
  }
  // A protocol that disagrees breaks the equivalence row.
  json::Value bad = report;
  case_named(bad, chunked + "_ring_kv")["drift"]["cp_merge_fp32"]["out"]["digest"] = "0000";
  CHECK(evaluate_row(row_named("cp_protocol_equivalence_tp2_cp2_chunk4"), bad, t, world, "r")
            .status == "failed");
  // A case that never ran, and rows cpdrift cannot execute yet, fail closed too.
  json::Value empty = report;
  empty["cases"] = json::Value::array();
  CHECK(evaluate_row(row_named(chunked), empty, t, world, "r").status == "not_run");
  CHECK(evaluate_row(row_named("p2p_nccl_reference_np2"), report, t, world, "r").status ==
        "unavailable");
  std::vector<RowVerdict> all;
  for (const AcceptanceRow& r : required_matrix())
    all.push_back(evaluate_row(r, report, t, world, "r"));
  const json::Value doc = acceptance_json("run", all, t, json::Value::object(), "now");
  CHECK_FALSE(doc.at("passed").as_bool());  // the GPU transport rows are required and unavailable
  CHECK(doc.at("failed_required_cases").size() == all.size() - 9);
}
