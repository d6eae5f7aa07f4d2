// What both sides of the installed-header test compute from states.h, as bits: the ordered merge
// (done by `merge`: the public header's on the consumer's side, the CPU backend's on cpdrift's),
// every production lane's merge over the first kCp states, and the BF16 rounding of each value.
// Includes only the public headers.
#pragma once

#include <cpdrift/bf16.h>
#include <cpdrift/block_merge.h>
#include <cpdrift/production_lanes.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "states.h"

namespace consumer {

inline std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

/// `merge(states, rows, dim, out, lse)` merges a std::vector<cpd::BlockState> in block order.
template <class Merge>
std::vector<std::uint32_t> results(const States& st, Merge merge) {
  std::vector<cpd::BlockState> states;
  for (int i = 0; i < kStates; ++i)
    states.push_back(cpd::BlockState{st.block_index[i], st.out[i].data(), st.lse[i].data()});
  std::vector<float> values(kRows * kDim), lse(kRows);
  merge(states, kRows, kDim, values.data(), lse.data());
  values.insert(values.end(), lse.begin(), lse.end());
  for (const cpd::ProductionLane lane : cpd::kProductionLanes) {
    for (int r = 0; r < kRows; ++r) {
      cpd::RankState by_rank[kCp];
      for (int s = 0; s < kCp; ++s)
        by_rank[s] = cpd::RankState{st.out[s].data() + r * kDim, st.lse[s][r]};
      float row[kDim], l = 0;
      cpd::production_row(lane, cpd::RankStates(by_rank, kCp), r % kCp, kDim, row, &l);
      values.insert(values.end(), row, row + kDim);
      values.push_back(l);
    }
  }
  std::vector<std::uint32_t> out;
  for (const float x : values) {
    out.push_back(bits(x));
    out.push_back(bits(cpd::round_bf16(x)));
  }
  return out;
}

}  // namespace consumer
