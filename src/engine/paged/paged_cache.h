// K and V stored by physical page, read only through the block table (the rollout engine's
// KV cache).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/kv_rows.h"
#include "core/range.h"
#include "engine/paged/page_table.h"

namespace cpd {

class PagedKvCache {
 public:
  /// A pool for KV heads `heads`, laid out [page][head][slot][dim]. Throws UsageError naming
  /// the problem when the table is invalid (validate()).
  PagedKvCache(PageTable table, Range heads, int dim);

  /// Stores positions [0, kv_len) of sequence `seq`, KV head h, from k and v ([kv_len][dim]).
  /// A page another sequence filled first is shared and read-only: the rows must match it bit
  /// for bit (UsageError otherwise) and are not written again.
  void write_sequence(int seq, std::int64_t h, const float* k, const float* v);

  /// What a paged kernel reads: sequence `seq`'s K and V rows [0, kv_len) of KV head h in
  /// place, through its block table (valid until the cache is destroyed or retabled).
  std::pair<KvRows, KvRows> rows(int seq, std::int64_t h) const;

  /// Reads the same pool through `table` from now on (what an engine does after moving
  /// pages: the block tables must follow). Throws UsageError when `table` is invalid or
  /// addresses a different pool size.
  void retable(PageTable table);

  const PageTable& table() const { return table_; }
  const Range& heads() const { return heads_; }

 private:
  std::size_t slot_offset(int page, std::int64_t h, std::int64_t slot) const;

  PageTable table_;
  Range heads_;
  int dim_;
  std::vector<float> k_, v_;
  std::vector<int> owner_;  // per (page, head, slot): the sequence that filled it, -1 before
};

}  // namespace cpd
