// The global block grid (design §1) and everything derived from a case's topology:
// CP owner ranges, KV blocks with their global indices, logical ranks and their placement.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/range.h"
#include "cpdrift/enum_names.h"

namespace cpd {

enum class CpLayout { contiguous, zigzag };
enum class Protocol { ag_rs, ring_kv, allgather_kv };
inline constexpr EnumName<CpLayout> kCpLayoutNames[] = {{CpLayout::contiguous, "contiguous"},
                                                        {CpLayout::zigzag, "zigzag"}};
inline constexpr EnumName<Protocol> kProtocolNames[] = {{Protocol::ag_rs, "ag_rs"},
                                                        {Protocol::ring_kv, "ring_kv"},
                                                        {Protocol::allgather_kv, "allgather_kv"}};
const char* to_string(CpLayout);
const char* to_string(Protocol);

/// One case: a (TP, CP, split, layout, protocol) point (design §4).
struct CaseSpec {
  int tp = 1;
  int cp = 1;
  std::optional<std::int64_t> split;  // fixed split-KV size in tokens; nullopt = disabled
  CpLayout layout = CpLayout::contiguous;
  Protocol protocol = Protocol::ag_rs;

  int num_logical_ranks() const { return tp * cp; }
};

/// Sequence positions owned by CP rank `cp_rank`, ascending: one range (contiguous) or two
/// (zigzag: chunks r and 2·CP-1-r of 2·CP equal chunks). Requires a valid seq_len (see
/// validate_case).
std::vector<Range> cp_owner_ranges(CpLayout layout, int cp, int cp_rank, std::int64_t seq_len);

/// An owner range cut into blocks of `split` from its start, the last possibly shorter; the
/// whole range when split is disabled.
std::vector<Range> split_range(Range owner, std::optional<std::int64_t> split);

/// A split plan as read off the blocks that ran (never from the request): `fixed` at size c
/// when every range is cut into blocks of c from its start (each range's last block at most
/// c); `fixed` at the requested size when every range is one block no longer than it (a fixed
/// split that never cuts); `disabled` when every range is one block otherwise; `irregular`
/// for anything else, blocks that do not tile their ranges included.
struct SplitReading {
  const char* policy = "irregular";
  std::optional<std::int64_t> size;
};
SplitReading read_split_plan(const std::vector<Range>& ranges, const std::vector<Range>& blocks,
                             std::optional<std::int64_t> requested_fixed);

/// A KV block of the global grid: its global index orders every merge.
struct KvBlock {
  int index = 0;
  Range range;
  int owner_cp_rank = 0;
};

/// Every KV block of a case, sorted by position; `index` is the position in this list.
std::vector<KvBlock> kv_block_grid(const CaseSpec& spec, std::int64_t seq_len);

/// The bounds of kv_block_grid in order (the report's `kv_block_bounds`).
std::vector<Range> kv_block_bounds(const CaseSpec& spec, std::int64_t seq_len);

/// First 16 hex digits of SHA-256 of the compact JSON `[[s,e],…]` of the bounds.
std::string block_metadata_hash(const std::vector<Range>& bounds);

/// The case spec with CP = 1 and the same split and layout (and the default protocol: at
/// CP = 1 they all compute alike): the reference the topology invariance check compares
/// against.
CaseSpec cp1_counterpart(const CaseSpec& spec);

/// Case name per the report contract ({model}: model_slug, e.g. qwen3_8b):
/// {model}_tp{TP}_cp{CP}_{prefill|chunk{c}}_{dtype}, plus
/// `_zigzag` and `_{protocol}` for non-default layout and protocol.
std::string case_name(const CaseSpec& spec, const Problem& problem);

/// "" when the case can run on this problem, else one line saying why not.
std::string validate_case(const CaseSpec& spec, const Problem& problem);

/// A logical rank of a case's TP×CP grid (TP rank fastest-varying) and what it owns.
struct LogicalRank {
  int id = 0;
  int tp_rank = 0;
  int cp_rank = 0;
  Range q_heads;              // global query heads
  Range kv_heads;             // global KV heads
  std::vector<Range> tokens;  // sequence positions: its query shard and its KV shard
};

LogicalRank logical_rank(const CaseSpec& spec, const Problem& problem, int id);

/// Logical rank ℓ runs on process ℓ mod W.
inline int process_of(int logical_rank, int world_size) { return logical_rank % world_size; }

}  // namespace cpd
