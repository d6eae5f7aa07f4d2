// The fold along each CP rank's TP ranks (manifest.h's TpChain), shared by dlogp's logits and
// the layer's o_proj: one plane travels a hop at a time, never every rank's partial.
#pragma once

#include <functional>
#include <vector>

#include "engine/manifest.h"

namespace cpd {

class Transport;

/// `fold(i, chunk, plane, continues)`: hosted rank i's step on `chunk`: it starts the plane
/// (`continues` false; `plane` is a spare buffer or empty, every element to be written) or
/// continues the one the TP rank before it sent, and returns it.
using ChainFold = std::function<FloatBuffer(std::size_t, const Range&, FloatBuffer, bool)>;
/// `finish(i, chunk, plane)`: the owner (TP rank 0), hosted rank i, with the finished plane.
using ChainFinish = std::function<void(std::size_t, const Range&, const FloatBuffer&)>;

/// Runs the chain for the `hosted` ranks: in step s, TP rank t folds its chunk s − t into the
/// plane and sends it on, the last back to the owner, which finishes the chunk at the end of the
/// step. Collective over the run's processes.
void run_tp_chain(const CaseGrid& grid, const TpChain& chain, Transport& transport,
                  const std::vector<LogicalRank>& hosted, const ChainFold& fold,
                  const ChainFinish& finish);

}  // namespace cpd
