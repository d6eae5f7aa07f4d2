// The job helpers every backend shares: how far a fold reads, and paged views made contiguous.
#include "core/attention_jobs.h"

#include <algorithm>
#include <stdexcept>

namespace cpd {

std::int64_t fold_reach(const FoldJob& job) {
  std::int64_t end = job.kv_begin;
  for (const Range& b : job.blocks) end = std::max(end, std::min(b.end, job.first_pos + job.rows));
  return end - job.kv_begin;
}

std::vector<FoldJob> contiguous_fold_jobs(std::span<const FoldJob> jobs, int dim,
                                          std::deque<std::vector<float>>& storage) {
  // One copy per distinct paged view, as long as the longest reach of the jobs reading it:
  // the query heads of a group and the steps of a decode share it (and the backend's upload).
  struct Copy {
    KvRows view;
    std::int64_t rows = 0;
    const float* data = nullptr;
  };
  std::vector<Copy> copies;
  const auto copy_of = [&](const KvRows& view) {
    return std::find_if(copies.begin(), copies.end(),
                        [&](const Copy& c) { return c.view == view; });
  };
  for (const FoldJob& j : jobs) {
    for (const KvRows& view : {j.k, j.v}) {
      if (!view.is_paged()) continue;
      if (!view.covers(fold_reach(j)))
        throw std::invalid_argument("contiguous_fold_jobs: a block reaches past the paged rows");
      auto c = copy_of(view);
      if (c == copies.end()) c = copies.insert(copies.end(), Copy{view});
      c->rows = std::max(c->rows, fold_reach(j));
    }
  }
  for (Copy& c : copies) {
    std::vector<float>& rows = storage.emplace_back(static_cast<std::size_t>(c.rows) * dim);
    for (std::int64_t r = 0; r < c.rows; ++r)
      std::copy_n(c.view.row(r, dim), dim, rows.data() + r * dim);
    c.data = rows.data();
  }
  std::vector<FoldJob> out(jobs.begin(), jobs.end());
  for (FoldJob& j : out) {
    for (KvRows* view : {&j.k, &j.v}) {
      if (view->is_paged()) *view = KvRows(copy_of(*view)->data);
    }
  }
  return out;
}

}  // namespace cpd
