// A case's global tensors as the pieces its logical ranks hold, in global [B, H, S, W] order.
#pragma once

#include <string>
#include <vector>

#include "comm/global_tensor.h"
#include "comm/transport.h"
#include "core/shard.h"
#include "engine/comparison.h"
#include "engine/manifest.h"

namespace cpd {

/// Whose heads a tensor's shards are laid out over; `token` is a per-token tensor ([B, 1, S]:
/// one value per token, held by the TP rank 0 of each CP rank; `hosted` lists only those).
enum class HeadKind { query, kv, token };

/// The global tensor made of the logical ranks' shards of width `width` (head_dim for out, 1 for
/// lse). `hosted` are this process's shards, in the order of hosted_ranks(); every process
/// builds the same piece list. Throws std::logic_error when the shards do not tile [0, S).
GlobalTensor global_tensor(const CaseGrid& grid, int world_size, int process, int width,
                           const std::vector<const Shard*>& hosted,
                           HeadKind heads = HeadKind::query);

/// The tensor `path` of a case made of this process's shards `hosted` (as global_tensor), with
/// the attributes that say what its axes are.
CaseTensor case_tensor(const CaseGrid& grid, const Transport& transport, std::string path,
                       const std::vector<const Shard*>& hosted, int width, HeadKind heads,
                       bool bf16, bool digest);

}  // namespace cpd
