// A process's memo of generated inputs: every (tensor, batch, head, position) row is generated
// at most once per run, however many cases, paths and reference computations read it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "cpdrift/cpu/inputs.h"

namespace cpd {

class InputStore {
 public:
  InputStore(const Problem& problem, ThreadPool& pool) : problem_(problem), pool_(pool) {}

  /// The same values as generate_shard(problem, tensor, shape, precision), served from the
  /// memo. BF16 rows are the rounding of the memoised FP32 rows (exactly what generation
  /// does), so each row's random numbers and RoPE are computed once.
  Shard shard(TensorId tensor, const ShardShape& shape, InputPrecision precision);

  const Problem& problem() const { return problem_; }
  ThreadPool& pool() { return pool_; }

 private:
  // Rows of one (tensor, batch, head), generated in blocks of kBlockRows positions; memory is
  // reserved for the whole sequence but pages are touched only where rows are generated.
  static constexpr std::int64_t kBlockRows = 64;
  struct Plane {
    std::unique_ptr<float[]> rows;
    std::vector<bool> generated;  // per block
  };
  Plane& plane(TensorId tensor, int b, std::int64_t h);
  void ensure(TensorId tensor, const ShardShape& shape);

  Problem problem_;
  ThreadPool& pool_;
  std::map<std::tuple<int, int, std::int64_t>, Plane> planes_;
};

}  // namespace cpd
