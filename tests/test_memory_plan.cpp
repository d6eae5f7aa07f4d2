// The plan's memory model (engine/memory_plan.h) term by term against the buffers' shapes worked
// out by hand, for a grid small enough to follow. Its total against a run's measured resident
// peak is tests/plan_memory.py's (under mpirun, S = 4096 and 16384).
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/float_buffer.h"
#include "core/util/process_memory.h"
#include "engine/memory_plan.h"

using namespace cpd;

namespace {

constexpr std::uint64_t kF = sizeof(float);

Problem problem_of(std::int64_t seq) {
  Problem p;
  p.seq_len = seq;
  return p;
}

CaseSpec tp2_cp2(std::int64_t split) {
  CaseSpec s;
  s.tp = 2;
  s.cp = 2;
  s.split = split;
  return s;
}

// A C string: a std::string temporary would make g++ 13 warn (-Wdangling-reference).
const PhaseMemory& phase(const ProcessMemory& m, const char* name) {
  for (const PhaseMemory& p : m.phases) {
    if (p.phase == name) return p;
  }
  FAIL("no phase " << name);
  throw;
}

std::uint64_t term(const PhaseMemory& p, const std::string& name) {
  for (const MemoryTerm& t : p.terms) {
    if (t.name == name) return t.bytes;
  }
  FAIL("phase " << p.phase << " has no term " << name);
  return 0;
}

ScheduleOptions full_case() {
  return ScheduleOptions{forward_paths(DType::bf16, false, false), true, false, 17};
}

// The memory of one case of a run through `plan`; `last`: the run's last case.
std::vector<ProcessMemory> add(RunMemoryPlan& plan, const CaseGrid& grid,
                               const ScheduleOptions& options, bool last = true) {
  return plan.add_case(schedule_case(grid, options), last);
}

}  // namespace

TEST_CASE("memory plan: TP=2 CP=2 S=4096 split 512 on 4 processes, by hand") {
  const Problem p = problem_of(4096);
  const CaseGrid grid(p, tp2_cp2(512));
  RunMemoryPlan plan(p, 4, 1);
  const std::vector<ProcessMemory> m = add(plan, grid, full_case());
  REQUIRE(m.size() == 4);
  // Rank r on process r: 16 query heads, 4 KV heads, 2048 tokens, D = 128.
  const std::uint64_t q = 16ull * 2048 * 128 * kF, lse = 16ull * 2048 * kF,
                      kv = 4ull * 2048 * 128 * kF, plane = 4096ull * 128 * kF;
  for (int proc = 0; proc < 4; ++proc) {
    const PhaseMemory& bwd = phase(m[proc], "backward");
    CHECK(term(bwd, "gradients (dq, dk, dv)") == q + 2 * kv);
    CHECK(term(bwd, "reference gradients") == q + 2 * kv);
    CHECK(term(bwd, "FP32 output kept") == q + lse);
    CHECK(term(bwd, "dK/dV totals per query head") == 2 * 4 * kv);  // 2 x group x KV
    // Planes: q of its 16 heads, k and v of its 4, and dO of its 16 (8 of them for the
    // reference backward of its 2 KV heads).
    CHECK(term(bwd, "input memo") == (16 + 4 + 4 + 16) * plane);
    CHECK(term(bwd, "CP=1 memos") == 0);  // the run's last case keeps nothing
    CHECK(term(bwd, "process baseline") == kProcessBaselineBytes);
    const PhaseMemory& fp32 = phase(m[proc], "forward: fp32");
    CHECK(term(fp32, "outputs, merge-order probe, FP64 oracle") == 3 * (q + lse));
    CHECK(term(fp32, "path inputs (q, k, v)") == q + 2 * kv);
    CHECK(term(fp32, "outputs of earlier paths") == 0);
    CHECK(term(fp32, "own query rows") == 0);  // ag_rs, one range: served in place
    const PhaseMemory& kernel = phase(m[proc], "forward: bf16_kernel");
    CHECK(term(kernel, "outputs of earlier paths") == 2 * (q + lse));
    CHECK(term(kernel, "outputs, production lanes") == 4 * (q + lse));  // its own and 3 lanes'
  }
  // The last backward round (rows 3584..4095, CP rank 1's): rank 2 packs its 512 rows (q, dO,
  // lse, delta), computes the partial dq of its 4 blocks, and receives CP rank 0's 4 partials.
  // Rank 0 receives rank 2's rows and computes and sends the 4 partials for them.
  const std::uint64_t rows = 16ull * 512 * (2 * 128 + 2) * kF, partial = 16ull * 512 * 128 * kF;
  CHECK(term(phase(m[2], "backward"), "one round's rows and partial dq") ==
        rows + 4 * partial + 4 * partial);
  CHECK(term(phase(m[0], "backward"), "one round's rows and partial dq") == rows + 4 * partial);
  // Where the peak is: the BF16-kernel path with its lanes on CP rank 0's processes; on CP
  // rank 1's, whose backward also serves the last round, the backward (by 3.4 MB, since ag_rs
  // serves a rank's own query rows in place).
  for (int proc = 0; proc < 2; ++proc) CHECK(m[proc].peak().phase == "forward: bf16_kernel");
  for (int proc = 2; proc < 4; ++proc) CHECK(m[proc].peak().phase == "backward");
  CHECK(phase(m[2], "backward").bytes() > phase(m[0], "backward").bytes());
}

TEST_CASE("memory plan: own query rows are copied unless ag_rs serves one range in place") {
  // The runs' copies (protocol_ag_rs.cpp, local_rounds' own_rows): ag_rs on a contiguous shard
  // reads it where it lies; a zigzag shard's two ranges, and ring_kv's and allgather_kv's own
  // rows, are copied.
  const Problem p = problem_of(4096);
  const std::uint64_t q = 16ull * 2048 * 128 * kF;
  const auto own_rows = [&](CpLayout layout, Protocol protocol) {
    CaseSpec spec = tp2_cp2(512);
    spec.layout = layout;
    spec.protocol = protocol;
    RunMemoryPlan plan(p, 4, 1);
    return term(phase(add(plan, CaseGrid(p, spec), full_case())[0], "forward: fp32"),
                "own query rows");
  };
  CHECK(own_rows(CpLayout::contiguous, Protocol::ag_rs) == 0);
  CHECK(own_rows(CpLayout::zigzag, Protocol::ag_rs) == q);
  CHECK(own_rows(CpLayout::contiguous, Protocol::ring_kv) == q);
  CHECK(own_rows(CpLayout::contiguous, Protocol::allgather_kv) == q);
}

TEST_CASE("memory plan: the te_p2p backward lane's per-rank sums and gradients") {
  // Contiguous TP=2 CP=2: CP rank 0's keys are seen by both CP ranks' queries (two sums per
  // KV block), CP rank 1's by its own only (one), each the size of the dK/dV totals; the lane's
  // gradients are one more set of the rank's gradients. Without the lane both terms are 0.
  const Problem p = problem_of(4096);
  const CaseGrid grid(p, tp2_cp2(512));
  ScheduleOptions lane = full_case();
  lane.lane_backward = true;
  RunMemoryPlan with(p, 4, 1), without(p, 4, 1);
  const std::vector<ProcessMemory> m = add(with, grid, lane);
  const std::vector<ProcessMemory> plain = add(without, grid, full_case());
  const std::uint64_t q = 16ull * 2048 * 128 * kF, kv = 4ull * 2048 * 128 * kF;
  const char* sums = "te_p2p lane: each query rank's dK/dV sums per query head";
  const char* grads = "te_p2p lane: its gradients";
  for (int proc = 0; proc < 4; ++proc) {
    const PhaseMemory& bwd = phase(m[proc], "backward");
    const std::uint64_t ranks = proc < 2 ? 2 : 1;  // processes 0, 1 host CP rank 0
    CHECK(term(bwd, sums) == ranks * 2 * 4 * kv);
    CHECK(term(bwd, grads) == q + 2 * kv);
    CHECK(term(phase(plain[proc], "backward"), sums) == 0);
    CHECK(term(phase(plain[proc], "backward"), grads) == 0);
  }
}

TEST_CASE("memory plan: one process hosting every rank holds the sum of their buffers") {
  const Problem p = problem_of(1024);
  const CaseGrid grid(p, tp2_cp2(256));
  RunMemoryPlan four(p, 4, 1), one(p, 1, 1);
  const std::vector<ProcessMemory> apart = add(four, grid, full_case());
  const std::vector<ProcessMemory> together = add(one, grid, full_case());
  REQUIRE(together.size() == 1);
  for (const char* name : {"gradients (dq, dk, dv)", "reference gradients", "FP32 output kept",
                           "dK/dV totals per query head"}) {
    std::uint64_t sum = 0;
    for (const ProcessMemory& m : apart) sum += term(phase(m, "backward"), name);
    CHECK_MESSAGE(term(phase(together[0], "backward"), name) == sum, name);
  }
  // The input memo is shared: every plane of the problem, once (q, dO of 32 heads, k, v of 8).
  CHECK(term(phase(together[0], "backward"), "input memo") ==
        (32 + 32 + 8 + 8) * 1024ull * 128 * kF);
}

TEST_CASE("memory plan: phases follow the case's legs; memos carry into later cases") {
  const Problem p = problem_of(256);
  const CaseGrid grid(p, tp2_cp2(64));
  RunMemoryPlan plan(p, 4, 1);
  const ScheduleOptions forward_only{forward_paths(DType::bf16, false, false), false, false, 0};
  const std::vector<ProcessMemory> first = add(plan, grid, forward_only, false);
  std::vector<std::string> names;
  for (const PhaseMemory& ph : first[0].phases) names.push_back(ph.phase);
  CHECK(names == std::vector<std::string>{"CP=1 reference forward", "forward: fp32",
                                          "forward: bf16_inputs", "forward: bf16_kernel"});
  // Not the last case: the CP=1 reference (16 heads x 128 tokens, out and lse) is memoised, and
  // the next case starts with it held.
  const std::vector<ProcessMemory> second = add(plan, grid, full_case());
  CHECK(term(second[0].phases.front(), "CP=1 memos") == 16ull * 128 * (128 + 1) * kF);
  CHECK(phase(second[0], "dlogp").bytes() > 0);
  CHECK(second[0].peak().bytes() >= first[0].peak().bytes());
}

TEST_CASE("memory plan: the model grows with S as its buffers do (negative control: S/2)") {
  const Problem p = problem_of(4096), half = problem_of(2048);
  RunMemoryPlan a(p, 4, 1), b(half, 4, 1);
  const std::uint64_t full =
      phase(add(a, CaseGrid(p, tp2_cp2(512)), full_case())[2], "backward").bytes();
  const std::uint64_t smaller =
      phase(add(b, CaseGrid(half, tp2_cp2(512)), full_case())[2], "backward").bytes();
  // Every tensor of the backward is linear in S (the split fixed): twice the tokens, twice the
  // bytes beyond the baseline, to within the blocks' rounding. (The forward's round of states
  // is capped at kRoundStateBytes, so its phases are not.)
  const double ratio = static_cast<double>(full - kProcessBaselineBytes) /
                       static_cast<double>(smaller - kProcessBaselineBytes);
  CHECK(ratio > 1.9);
  CHECK(ratio < 2.1);
}

TEST_CASE("memory budget: the least of what the node, the cgroup and ulimit -v allow") {
  const MemoryBudget node = memory_budget(1);
  REQUIRE(node.bytes > 0);  // /proc/meminfo at least
  // Shared by four processes: each counts on a quarter (or less, if ulimit -v binds).
  CHECK(memory_budget(4).bytes <= node.bytes / 4 + 1);
  // An address-space limit below everything else binds, and says so. Not under AddressSanitizer:
  // its shadow memory is reserved address space, so any limit below the node's memory makes its
  // own next mapping fail (the plain build runs this; .ci/run runs both).
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("the ulimit -v part is left to the build without AddressSanitizer");
  return;
#endif
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_AS, &old) == 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_max, node.bytes / 2);  // below the node's share
  REQUIRE(low.rlim_cur < node.bytes);
  REQUIRE(setrlimit(RLIMIT_AS, &low) == 0);
  const MemoryBudget limited = memory_budget(1);
  setrlimit(RLIMIT_AS, &old);
  CHECK(limited.bytes == low.rlim_cur);
  CHECK(limited.source.find("ulimit -v") != std::string::npos);
}

TEST_CASE("huge pages: only whole 2 MiB pages inside the buffer are advised") {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  // Below two huge pages nothing is advised, however the buffer lies.
  CHECK(huge_page_span(0, 2 * kHuge - 1).end == 0);
  CHECK(huge_page_span(kHuge + 16, 2 * kHuge - 16).end == 0);
  for (const std::uintptr_t address : {8 * kHuge, 8 * kHuge + 16, 8 * kHuge + kHuge - 4096}) {
    for (const std::size_t bytes : {2 * kHuge, 2 * kHuge + 16, 5 * kHuge + 4096}) {
      CAPTURE(address);
      CAPTURE(bytes);
      const HugePageSpan s = huge_page_span(address, bytes);
      CHECK(s.begin % kHuge == 0);
      CHECK(s.end % kHuge == 0);
      CHECK(s.begin >= address);        // never before the buffer
      CHECK(s.end <= address + bytes);  // never past it
      // Every whole huge page inside is in the span: less than one page is left at each end.
      CHECK(s.begin - address < kHuge);
      CHECK(address + bytes - s.end < kHuge);
      CHECK(s.end > s.begin);
    }
  }
  // A FloatBuffer of 8 MiB is advised: the kernel marks the mapping holding its whole huge
  // pages VM_HUGEPAGE ("hg" in /proc/self/smaps), whatever the system's THP policy.
  FloatBuffer b(4 * kHuge / sizeof(float));
  const HugePageSpan s =
      huge_page_span(reinterpret_cast<std::uintptr_t>(b.data()), b.size() * sizeof(float));
  REQUIRE(s.end > s.begin);
  std::ifstream smaps("/proc/self/smaps");
  REQUIRE(smaps.good());
  std::string line, flags;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = lo <= s.begin && s.begin < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      flags = line;
    }
  }
  CAPTURE(flags);
  CHECK(flags.find(" hg") != std::string::npos);
}
