#include "cpdrift/backend/input_store.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/numerics/bf16.h"
#include "cpdrift/util/work_timers.h"

namespace cpd {

InputStore::InputStore(const Problem& problem, ThreadPool& pool)
    : problem_(problem), pool_(pool), owned_(make_cpu_backend(pool)), backend_(owned_.get()) {}

InputStore::InputStore(const Problem& problem, ThreadPool& pool, AttentionBackend& backend)
    : problem_(problem), pool_(pool), backend_(&backend) {}

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

void InputStore::ensure(TensorId tensor, const ShardShape& shape) {
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
  {
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
  }
  if (missing.empty()) return;
  // One head at a time: the generation buffer stays a head's rows (values do not depend on how
  // the rows are requested).
  const int d = problem_.dims.head_dim;
  for (std::int64_t h = shape.heads.begin; h < shape.heads.end; ++h) {
    const ShardShape fill{shape.batch, Range{h, h + 1}, missing, shape.width};
    const Shard fresh = backend_->generate_shard(problem_, tensor, fill, InputPrecision::fp32);
    for (int b = 0; b < shape.batch; ++b) {
      Plane& p = plane(tensor, b, h);
      for (const Range& r : missing) {
        std::memcpy(p.rows.get() + r.begin * d, fresh.at(b, h, fill.local_row(r.begin)),
                    static_cast<std::size_t>(r.size() * d) * sizeof(float));
        for (std::int64_t blk = r.begin / kBlockRows; blk * kBlockRows < r.end; ++blk) {
          p.generated[static_cast<std::size_t>(blk)] = true;
        }
      }
    }
  }
}

void InputStore::prepare(TensorId tensor, const ShardShape& shape) { ensure(tensor, shape); }

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
  ensure(tensor, shape);
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

}  // namespace cpd
