#include "kernels/input_store.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/util/work_timers.h"
#include "cpdrift/bf16.h"
#include "kernels/attention_backend.h"
#include "kernels/layer_weights.h"

namespace cpd {

InputStore::InputStore(const Problem& problem, ThreadPool& pool)
    : problem_(with_layer_weights(problem)),
      pool_(pool),
      owned_(make_cpu_backend(pool)),
      backend_(owned_.get()) {}

InputStore::InputStore(const Problem& problem, ThreadPool& pool, AttentionBackend& backend)
    : problem_(with_layer_weights(problem)), pool_(pool), backend_(&backend) {}

InputStore::~InputStore() = default;

InputStore::Plane& InputStore::plane(TensorId tensor, int b, std::int64_t h) {
  Plane& p = planes_[{static_cast<int>(tensor), b, h}];
  if (!p.rows) {
    const std::int64_t n = problem_.seq_len * problem_.dims.head_dim;
    p.rows.reset(
        new float[static_cast<std::size_t>(n)]);  // uninitialised: untouched pages stay free
    p.generated.assign(static_cast<std::size_t>((problem_.seq_len + kBlockRows - 1) / kBlockRows),
                       false);
  }
  return p;
}

void InputStore::prepare(TensorId tensor, const ShardShape& shape) {
  // Missing blocks, in position order and grouped into runs of positions so one
  // generate_shard call fills them.
  std::vector<std::int64_t> wanted;
  for (const Range& t : shape.tokens) {
    for (std::int64_t blk = t.begin / kBlockRows; blk * kBlockRows < t.end; ++blk)
      wanted.push_back(blk);
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  std::vector<Range> missing;
  for (const std::int64_t blk : wanted) {
    bool absent = false;
    for (int b = 0; b < shape.batch && !absent; ++b) {
      for (std::int64_t h = shape.heads.begin; h < shape.heads.end && !absent; ++h) {
        absent = !plane(tensor, b, h).generated[static_cast<std::size_t>(blk)];
      }
    }
    if (!absent) continue;
    const Range r{blk * kBlockRows, std::min((blk + 1) * kBlockRows, problem_.seq_len)};
    if (!missing.empty() && missing.back().end == r.begin) {
      missing.back().end = r.end;
    } else {
      missing.push_back(r);
    }
  }
  if (missing.empty()) return;
  // Every head, a piece of the missing rows at a time: the generation buffer stays one head's
  // rows, as many as are missing, and a row's RoPE cos and sin are computed once for all the
  // heads (a head at a time, each head computed them again). Values do not depend on how the
  // rows are requested. The missing ranges start on blocks and end on them (or at seq_len), and
  // so do the pieces, which are whole blocks.
  const std::int64_t heads = shape.heads.size();
  std::int64_t total = 0;
  for (const Range& r : missing) total += r.size();
  const std::int64_t piece_rows = std::max(kBlockRows, total / heads / kBlockRows * kBlockRows);
  std::vector<Plane*> planes;  // [b][h]; the map is filled here, not on the pool
  for (int b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h)
      planes.push_back(&plane(tensor, b, h));
  }
  const int d = problem_.dims.head_dim;
  std::size_t next = 0;
  std::int64_t at = missing.front().begin;
  while (next < missing.size()) {
    std::vector<Range> piece;
    for (std::int64_t rows = 0; next < missing.size() && rows < piece_rows;) {
      const std::int64_t end = std::min(missing[next].end, at + (piece_rows - rows));
      piece.push_back(Range{at, end});
      rows += end - at;
      at = end;
      if (at == missing[next].end && ++next < missing.size()) at = missing[next].begin;
    }
    const ShardShape fill{shape.batch, shape.heads, piece, shape.width};
    const Shard fresh = backend_->generate_shard(problem_, tensor, fill, InputPrecision::fp32);
    pool_.parallel_for(static_cast<std::int64_t>(planes.size()), [&](std::int64_t i) {
      const int b = static_cast<int>(i / heads);
      const std::int64_t h = shape.heads.begin + i % heads;
      Plane& p = *planes[static_cast<std::size_t>(i)];
      for (const Range& r : piece) {
        std::memcpy(p.rows.get() + r.begin * d, fresh.at(b, h, fill.local_row(r.begin)),
                    static_cast<std::size_t>(r.size() * d) * sizeof(float));
        for (std::int64_t blk = r.begin / kBlockRows; blk * kBlockRows < r.end; ++blk)
          p.generated[static_cast<std::size_t>(blk)] = true;
      }
    });
  }
}

const float* InputStore::row(TensorId tensor, int b, std::int64_t h, std::int64_t position) {
  Plane& p = plane(tensor, b, h);
  if (position < 0 || position >= problem_.seq_len ||
      !p.generated[static_cast<std::size_t>(position / kBlockRows)]) {
    throw std::logic_error("InputStore::row: position " + std::to_string(position) +
                           " was not prepared");
  }
  return p.rows.get() + position * problem_.dims.head_dim;
}

Shard InputStore::shard(TensorId tensor, const ShardShape& shape, InputPrecision precision) {
  prepare(tensor, shape);
  Shard out(shape, Uninitialized{});  // every row copied below
  const int d = problem_.dims.head_dim;
  const std::int64_t heads = shape.heads.size();
  std::vector<const float*> planes;  // looked up first: plane() may add to the memo's map
  for (int b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h)
      planes.push_back(plane(tensor, b, h).rows.get());
  }
  pool_.parallel_for(shape.batch * heads, [&](std::int64_t i) {
    const int b = static_cast<int>(i / heads);
    const std::int64_t h = shape.heads.begin + i % heads;
    const float* src = planes[static_cast<std::size_t>(i)];
    for (const Range& t : shape.tokens) {
      float* dst = out.at(b, h, shape.local_row(t.begin));
      const float* from = src + t.begin * d;
      const std::size_t n = static_cast<std::size_t>(t.size() * d);
      if (precision == InputPrecision::bf16) {
        for (std::size_t k = 0; k < n; ++k) dst[k] = round_bf16(from[k]);
      } else {
        std::memcpy(dst, from, n * sizeof(float));
      }
    }
  });
  return out;
}

const std::vector<float>& InputStore::lm_head(int vocab, std::int64_t head) {
  std::vector<float>& w = lm_head_[{vocab, head}];
  if (w.empty()) {
    const WorkTimer t(WorkKind::inputs);
    w = lm_head_plane(problem_, vocab, head, pool_);
  }
  return w;
}

const std::vector<float>& InputStore::layer_lm_head(Range rows) {
  std::vector<float>& w = layer_lm_head_[{rows.begin, rows.end}];
  if (w.empty()) {
    const WorkTimer t(WorkKind::inputs);
    w = layer_lm_head_rows(problem_, rows, pool_);
  }
  return w;
}

}  // namespace cpd
