// What a case costs, predicted from its grid alone: for every logical rank, the (row, key)
// pairs its kernels evaluate and the messages it sends and receives, per forward pass, for the
// backward and for dlogp. Counted in closed form per (range, block) rather than by listing the
// manifest's headers, so a plan of 1M tokens on 256 ranks takes moments; the tests hold the
// transports' and the kernels' counters to it exactly (`cpdrift plan` prints it).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/manifest.h"

namespace cpd {

/// Messages and bytes as TransportCounters counts them: header + payload of each.
struct Traffic {
  std::uint64_t messages = 0;
  std::uint64_t bytes = 0;
  Traffic& operator+=(const Traffic& t) {
    messages += t.messages;
    bytes += t.bytes;
    return *this;
  }
  friend bool operator==(const Traffic&, const Traffic&) = default;
};

/// One phase of a case (one forward pass, the backward, dlogp).
struct PhaseWork {
  /// Per logical rank: (batch, query head, row, key) pairs its kernels evaluate under the
  /// causal mask (kernel_work.h; a projection phase counts its own unit), and what it sends
  /// (messages to itself included, as the transports count them) and receives.
  std::vector<std::uint64_t> pairs;
  std::vector<Traffic> sent, received;
  /// Bytes from logical rank s to d at [s * ranks + d]: where the links are, the plan can cost.
  std::vector<std::uint64_t> bytes_between;

  explicit PhaseWork(int ranks = 0);
  void add(int src, int dst, std::uint64_t messages, std::uint64_t payload_floats);
  std::uint64_t total_pairs() const;
  Traffic total_sent() const;
};

/// Per CP rank, how many of its KV blocks start before each grid block (blocks sorted by
/// position): the blocks of CP rank `cp` that a query row before `end` can see.
struct BlockCounts {
  explicit BlockCounts(const CaseGrid& grid);
  std::int64_t seen_by(int cp, std::int64_t end) const;

  const CaseGrid& grid;
  std::vector<std::vector<std::int64_t>> owned_before;
};

/// The forward paths a case runs, in order, each one exchange of the protocol: the FP32 path,
/// the dtype path under bf16, the BF16 kernel, with a GPU backend (`gpu`) the cuBLAS path, and
/// with `cpu_check` (a GPU run's, by default) the FP32 path again on the host's CPU backend.
/// Each is a phase of the case's schedule. `bf16_rate`: its kernels run at the BF16 rate;
/// `host`: on the CPU.
enum class ForwardPathKind { fp32, bf16_inputs, bf16_kernel, cublas_unfused, cpu_fp32 };
struct ForwardPath {
  ForwardPathKind kind;
  const char* name;
  bool bf16_rate = false;
  bool host = false;
};
std::vector<ForwardPath> forward_paths(DType dtype, bool gpu, bool cpu_check);

/// Each phase's work, counted in closed form from the grid (case_schedule.h lists the phases).
/// One forward pass of the case's protocol: query rows or K/V shards, then the partial states.
PhaseWork forward_work(const CaseGrid& grid);
/// The backward, round by round: query rows (q, dO, lse, Δ) to the owners of the blocks that see
/// them, every block pair at its owner, partial dq back to the query owner.
PhaseWork backward_work(const CaseGrid& grid);
/// A fold along the TP ranks (manifest.h's TpChain): the planes it passes on.
PhaseWork chain_work(const CaseGrid& grid, const TpChain& chain);
/// The layer's o_proj: the chain's planes, and as "pairs" the (candidate or reference, batch,
/// token, hidden output, query head) dots of head_dim a rank's kernels compute (2·D FLOPs each).
PhaseWork o_proj_work(const CaseGrid& grid);
/// The layer's backward: its two token chains, the dX chain over the TP ranks, and per rank the
/// D-long dots of dX, q/k/v_proj's and o_proj's gradients, candidate and reference.
PhaseWork layer_backward_work(const CaseGrid& grid);
/// The selected-token logprobs' logit partials over a vocabulary of `vocab` (the layer's: its
/// output's rows out and the vocabulary ranges' logits back).
PhaseWork dlogp_work(const CaseGrid& grid, int vocab);
/// This tool's own CP=1 checks, computed where each rank lives (nothing moves), per logical rank,
/// as an upper bound (a memo may serve them from an earlier case): the FP32 reference forward of
/// its rows, again over the topology counterpart's grid when that differs from the reference's
/// one block ...
PhaseWork reference_forward_work(const CaseGrid& grid);
/// ... and the CP=1 backward of the KV heads the rank computes for its TP group
/// (shared_cp1_backward: whole sequence, from the reference forward's rows, gathered by KV head),
/// whose exchange the case's counts leave out.
PhaseWork reference_backward_work(const CaseGrid& grid);

/// (row, key) pairs of one head with key ≤ row, rows and keys global positions.
std::uint64_t causal_pairs(const Range& rows, const Range& keys);

}  // namespace cpd
