// Fault injection (`--inject-fault KIND@RANK[:WHEN]`), a test aid that is always compiled: it
// breaks one partial-state exchange on purpose, to show that every such failure ends the whole
// job with one message naming the message and its ranks, and nothing written under a final
// name (docs/reliability.md). The faults sit in a transport that wraps the real one, so the
// protocols, the manifest checks and the agreement run exactly as in production.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/transport.h"
#include "cpdrift/enum_names.h"

namespace cpd {

enum class FaultKind : std::uint8_t {
  drop_state,         // the state message never leaves
  duplicate_state,    // it leaves twice
  corrupt_lse,        // its last LSE value becomes NaN
  wrong_block_index,  // its header names the next KV block
  short_message,      // its payload loses its last value
  rank_exit,          // the process exits in the middle of the exchange
  slow_rank,          // the process sleeps past --comm-timeout before the exchange
  dump_write_error,   // rank 0's `when`-th write of a piece into --dump fails (not a message)
};

/// Which process breaks which exchange: the `when`-th superstep (from 1) in which process
/// `rank` sends a partial state; the fault applies to the first partial state it sends then.
struct FaultSpec {
  FaultKind kind = FaultKind::drop_state;
  int rank = 0;
  int when = 1;
  double slow_seconds = 0;  // slow_rank: how long it sleeps (set from --comm-timeout)
};

inline constexpr EnumName<FaultKind> kFaultKindNames[] = {
    {FaultKind::drop_state, "drop-state"},
    {FaultKind::duplicate_state, "duplicate-state"},
    {FaultKind::corrupt_lse, "corrupt-lse"},
    {FaultKind::wrong_block_index, "wrong-block-index"},
    {FaultKind::short_message, "short-message"},
    {FaultKind::rank_exit, "rank-exit"},
    {FaultKind::slow_rank, "slow-rank"},
    {FaultKind::dump_write_error, "dump-write-error"},
};
inline const char* to_string(FaultKind kind) { return name_of(kFaultKindNames, kind); }

/// True for the faults that break a partial-state exchange (the transport's), false for the
/// dump's.
inline bool breaks_an_exchange(FaultKind kind) { return kind != FaultKind::dump_write_error; }

/// `inner` with the fault applied on process `process_rank` (a no-op wrapper elsewhere);
/// `*fired` becomes true once it has been (it must outlive the transport).
std::unique_ptr<Transport> with_fault(std::unique_ptr<Transport> inner, const FaultSpec& fault,
                                      int process_rank, bool* fired);

}  // namespace cpd
