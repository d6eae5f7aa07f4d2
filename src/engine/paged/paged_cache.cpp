#include "engine/paged/paged_cache.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"

namespace cpd {

PagedKvCache::PagedKvCache(PageTable table, Range heads, int dim)
    : table_(std::move(table)), heads_(heads), dim_(dim) {
  if (const std::string error = validate(table_); !error.empty())
    throw UsageError("paged KV cache: " + error);
  const std::size_t floats = static_cast<std::size_t>(table_.num_pages) * heads_.size() *
                             table_.page_size * static_cast<std::size_t>(dim_);
  k_.assign(floats, 0.0f);
  v_.assign(floats, 0.0f);
  owner_.assign(floats / static_cast<std::size_t>(dim_), -1);
}

void PagedKvCache::retable(PageTable table) {
  if (const std::string error = validate(table); !error.empty())
    throw UsageError("paged KV cache: " + error);
  if (table.num_pages != table_.num_pages || table.page_size != table_.page_size) {
    throw UsageError("paged KV cache: a new block table must address the same pool (" +
                     std::to_string(table_.num_pages) + " pages of " +
                     std::to_string(table_.page_size) + ")");
  }
  table_ = std::move(table);
}

std::size_t PagedKvCache::slot_offset(int page, std::int64_t h, std::int64_t slot) const {
  return ((static_cast<std::size_t>(page) * heads_.size() +
           static_cast<std::size_t>(h - heads_.begin)) *
              table_.page_size +
          static_cast<std::size_t>(slot)) *
         dim_;
}

void PagedKvCache::write_sequence(int seq, std::int64_t h, const float* k, const float* v) {
  const std::int64_t len = table_.kv_lens[static_cast<std::size_t>(seq)];
  const auto bytes = static_cast<std::size_t>(dim_) * sizeof(float);
  for (std::int64_t pos = 0; pos < len; ++pos) {
    const int page = table_.page_of(seq, pos);
    const std::size_t at = slot_offset(page, h, pos % table_.page_size);
    float* kd = k_.data() + at;
    float* vd = v_.data() + at;
    // A slot another sequence already filled is a shared page's, read-only: it must already
    // hold exactly this row. (A shorter sequence may fill only the first slots of a shared
    // page; a longer one fills the rest.)
    const std::size_t mark = at / static_cast<std::size_t>(dim_);
    if (owner_[mark] >= 0 && owner_[mark] != seq) {
      if (std::memcmp(kd, k + pos * dim_, bytes) != 0 ||
          std::memcmp(vd, v + pos * dim_, bytes) != 0) {
        throw UsageError("paged KV cache: sequence " + std::to_string(seq) + " position " +
                         std::to_string(pos) + " differs from shared page " + std::to_string(page) +
                         " (written by sequence " + std::to_string(owner_[mark]) +
                         "; shared pages are read-only)");
      }
      continue;
    }
    owner_[mark] = seq;
    std::copy_n(k + pos * dim_, dim_, kd);
    std::copy_n(v + pos * dim_, dim_, vd);
  }
}

std::pair<KvRows, KvRows> PagedKvCache::rows(int seq, std::int64_t h) const {
  const int* pages = table_.tables[static_cast<std::size_t>(seq)].data();
  const std::size_t head = slot_offset(0, h, 0);
  const auto stride = static_cast<std::int64_t>(slot_offset(1, h, 0) - head);
  const std::int64_t len = table_.kv_lens[static_cast<std::size_t>(seq)];
  return {KvRows::paged(k_.data() + head, pages, table_.page_size, stride, len),
          KvRows::paged(v_.data() + head, pages, table_.page_size, stride, len)};
}

}  // namespace cpd
