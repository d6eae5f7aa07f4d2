// What a run is asked to compute and where, and the cases that makes: the engine's input. The
// CLI fills it from the command line, `accept` from its required matrix.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/fault_injection.h"
#include "core/plan.h"
#include "engine/paged/paged_case.h"

namespace cpd {

enum class Device { auto_select, cpu, cuda };
enum class TransportChoice { auto_select, mpi, nccl, cuda_ipc };
/// What a run measures: the trainer's CP prefill (split disabled / fixed) and the rollout
/// side's paged prefill and decode.
enum class RunMode { prefill, chunked_prefill, paged_prefill, decode };

/// The command line's spellings of these choices.
inline constexpr EnumName<Device> kDeviceNames[] = {
    {Device::auto_select, "auto"}, {Device::cpu, "cpu"}, {Device::cuda, "cuda"}};
inline constexpr EnumName<TransportChoice> kTransportNames[] = {
    {TransportChoice::auto_select, "auto"},
    {TransportChoice::mpi, "mpi"},
    {TransportChoice::nccl, "nccl"},
    {TransportChoice::cuda_ipc, "cuda_ipc"}};
inline constexpr EnumName<RunMode> kRunModeNames[] = {{RunMode::prefill, "prefill"},
                                                      {RunMode::chunked_prefill, "chunked_prefill"},
                                                      {RunMode::paged_prefill, "paged_prefill"},
                                                      {RunMode::decode, "decode"}};
const char* to_string(Device);
const char* to_string(TransportChoice);
const char* to_string(RunMode);

struct RunRequest {
  Problem problem;
  // The case matrix: every combination is a case.
  std::vector<int> tp_sizes{1, 2};
  std::vector<int> cp_sizes{1, 2};
  std::vector<std::optional<std::int64_t>> splits{std::nullopt, 4};
  std::vector<CpLayout> layouts{CpLayout::contiguous};
  std::vector<Protocol> protocols{Protocol::ag_rs};
  std::vector<RunMode> modes{RunMode::prefill, RunMode::chunked_prefill};
  // The paged modes: the rollout's TP sizes, page size, split-KV policies (fixed at
  // fixed_split_size, default four pages), query tokens per sequence (default:
  // make_paged_workload's).
  std::vector<int> rollout_tp_sizes{1};
  int page_size = 16;
  std::vector<SplitPolicy> split_policies{SplitPolicy::disabled, SplitPolicy::fixed};
  std::optional<std::int64_t> fixed_split_size;
  std::optional<std::int64_t> q_len;
  // The legs.
  bool include_backward = false;
  bool include_lane_backward = false;  // the te_p2p lane's backward too (needs include_backward)
  bool include_dlogp = false;
  int vocab_size = 4096;
  bool cpu_check = true;  // GPU runs also run the FP32 path on the CPU and compare the bits
  // Where it runs.
  Device device = Device::auto_select;
  TransportChoice transport = TransportChoice::auto_select;
  double comm_timeout_seconds = 300.0;  // GPU transports: a wait longer than this is an error
  bool comm_timeout_given = false;      // MPI honours the timeout only when it was asked for
  int staging_mib = 64;                 // cuda_ipc: each process's receive window
  int threads = 0;                      // 0: the CPUs this process may use (default_threads)
  std::int64_t round_rows = 0;     // CaseGrid::round_rows (forward and backward); 0: by a budget
  std::optional<FaultSpec> fault;  // --inject-fault: a test aid (comm/fault_injection.h)

  /// Whether `mode` is asked for.
  bool runs(RunMode mode) const {
    return std::find(modes.begin(), modes.end(), mode) != modes.end();
  }
};

/// The cases of a run, in report order.
struct RunPlan {
  std::vector<CaseSpec> cases;       // tp → cp → split → layout → protocol
  std::vector<PagedCaseSpec> paged;  // split policy → mode (a plan's lanes serve both modes)
  PagedOptions paged_options;
};

/// Expands the request. Throws UsageError when nothing would run or a case cannot run on the
/// problem (e.g. CP larger than the sequence allows, a case listed twice, a paged workload the
/// problem is too short for, a fixed split that is not a multiple of the page size).
RunPlan plan_run(const RunRequest& request);

}  // namespace cpd
