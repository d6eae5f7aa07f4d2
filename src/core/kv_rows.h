// Where one KV head's rows live, as a kernel reads them: contiguous ([keys][dim]), or paged the
// way a rollout engine's cache holds them (a pool of physical pages read through a block
// table). The kernels ask for row j and never see which; the bits cannot depend on it.
#pragma once

#include <cassert>
#include <cstdint>

namespace cpd {

class KvRows {
 public:
  KvRows() = default;
  /// Contiguous rows: row j at data + j·dim. Implicit: a plain pointer is the common case.
  KvRows(const float* data) : base_(data) {}  // NOLINT(google-explicit-constructor)
  /// Paged rows [0, rows): row j is slot j % page_size of physical page pages[j / page_size],
  /// whose first row sits at pool + page·page_stride (floats).
  static KvRows paged(const float* pool, const int* pages, std::int64_t page_size,
                      std::int64_t page_stride, std::int64_t rows) {
    KvRows r(pool);
    r.pages_ = pages;
    r.page_size_ = page_size;
    r.page_stride_ = page_stride;
    r.rows_ = rows;
    return r;
  }

  bool is_paged() const { return pages_ != nullptr; }
  /// Whether rows [0, n) of this view exist (always, for contiguous views: they carry no
  /// length). Past a sequence's last page its table holds padding, not a page.
  bool covers(std::int64_t n) const { return rows_ < 0 || first_ + n <= rows_; }
  /// Row j (0-based from this view's first row) of a head of `dim` floats.
  const float* row(std::int64_t j, int dim) const {
    j += first_;
    if (pages_ == nullptr) return base_ + j * dim;
    assert(j < rows_);
    return base_ + pages_[j / page_size_] * page_stride_ + (j % page_size_) * dim;
  }
  /// The end of the run of adjacent rows that holds row j: rows [j, run_end(j)) lie dim floats
  /// apart (all of them for contiguous views; up to the end of j's page for paged ones).
  std::int64_t run_end(std::int64_t j) const {
    if (pages_ == nullptr) return INT64_MAX;
    return j + page_size_ - (j + first_) % page_size_;
  }
  friend bool operator==(const KvRows&, const KvRows&) = default;

  /// The same rows from row j on.
  KvRows from(std::int64_t j) const {
    KvRows r = *this;
    r.first_ += j;
    return r;
  }

 private:
  const float* base_ = nullptr;
  const int* pages_ = nullptr;  // null: contiguous
  std::int64_t page_size_ = 0;
  std::int64_t page_stride_ = 0;
  std::int64_t first_ = 0;
  std::int64_t rows_ = -1;  // paged: rows the table maps; -1: contiguous, unknown
};

}  // namespace cpd
