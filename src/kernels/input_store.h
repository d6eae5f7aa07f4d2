// A process's memo of generated inputs: every (tensor, batch, head, position) row is generated
// at most once per run, however many cases, paths and reference computations read it.
#pragma once

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/cpu/inputs.h"

namespace cpd {

class AttentionBackend;

class InputStore {
 public:
  /// Generates with the CPU backend over `pool`.
  InputStore(const Problem& problem, ThreadPool& pool);
  /// Generates with `backend` (which computes everything else too); `pool` runs host-side work.
  InputStore(const Problem& problem, ThreadPool& pool, AttentionBackend& backend);
  ~InputStore();

  /// The same values as generate_shard(problem, tensor, shape, precision), served from the
  /// memo. BF16 rows are the rounding of the memoised FP32 rows (exactly what generation
  /// does), so each row's random numbers and RoPE are computed once.
  Shard shard(TensorId tensor, const ShardShape& shape, InputPrecision precision);

  /// Generates the FP32 rows of `shape` into the memo where missing, without copying them out;
  /// row() then reads them in place.
  void prepare(TensorId tensor, const ShardShape& shape);
  /// The memo's FP32 row of (tensor, b, h) at `position`: the rows of one (b, h) are
  /// consecutive, [S][D]. Valid while the store lives; std::logic_error if not prepared.
  const float* row(TensorId tensor, int b, std::int64_t h, std::int64_t position);

  /// Query head `head`'s columns of the synthetic lm_head for `vocab` entries, [vocab][D]
  /// (lm_head_plane): generated once per run and kept, vocab·D floats a head. Valid while the
  /// store lives.
  const std::vector<float>& lm_head(int vocab, std::int64_t head);
  /// Vocabulary rows `rows` of the layer's lm_head, [rows][hidden] (layer_lm_head_rows):
  /// generated once per run and kept.
  const std::vector<float>& layer_lm_head(Range rows);

  const Problem& problem() const { return problem_; }
  ThreadPool& pool() { return pool_; }
  /// The compute backend of the run: inputs, partial states, merges, gradients.
  AttentionBackend& backend() { return *backend_; }

 private:
  // Rows of one (tensor, batch, head), generated in blocks of kBlockRows positions; memory is
  // reserved for the whole sequence but pages are touched only where rows are generated.
  static constexpr std::int64_t kBlockRows = 64;
  struct Plane {
    std::unique_ptr<float[]> rows;
    std::vector<bool> generated;  // per block
  };
  Plane& plane(TensorId tensor, int b, std::int64_t h);

  Problem problem_;
  ThreadPool& pool_;
  std::unique_ptr<AttentionBackend> owned_;  // the CPU backend when none was given
  AttentionBackend* backend_;
  std::map<std::tuple<int, int, std::int64_t>, Plane> planes_;
  std::map<std::pair<int, std::int64_t>, std::vector<float>> lm_head_;  // (vocab, head)
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<float>> layer_lm_head_;
};

}  // namespace cpd
