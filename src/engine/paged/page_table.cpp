#include "engine/paged/page_table.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/util/sha256.h"
#include "cpdrift/philox.h"

namespace cpd {

std::string validate(const PageTable& t) {
  const auto seq = [](std::size_t s) { return "sequence " + std::to_string(s) + ": "; };
  if (t.page_size < 1) return "page size must be at least 1";
  if (t.num_pages < 0) return "negative page count";
  if (t.tables.size() != t.kv_lens.size()) {
    return std::to_string(t.kv_lens.size()) + " sequences but " + std::to_string(t.tables.size()) +
           " block tables";
  }
  if (t.shared_prefix_pages < 0) return "negative shared prefix";
  // page id → (sequence, logical page) of its first use
  std::map<int, std::pair<std::size_t, std::size_t>> first_use;
  for (std::size_t s = 0; s < t.tables.size(); ++s) {
    const std::vector<int>& row = t.tables[s];
    if (t.kv_lens[s] < 0) return seq(s) + "negative KV length";
    const auto needed = static_cast<std::size_t>(pages_for(t.kv_lens[s], t.page_size));
    if (row.size() < needed) {
      return seq(s) + "KV length " + std::to_string(t.kv_lens[s]) + " needs " +
             std::to_string(needed) + " pages, the block table has " + std::to_string(row.size());
    }
    for (std::size_t i = needed; i < row.size(); ++i) {
      if (row[i] != -1) {
        return seq(s) + "entry " + std::to_string(i) + " is page " + std::to_string(row[i]) +
               " past the " + std::to_string(needed) + " pages KV length " +
               std::to_string(t.kv_lens[s]) + " needs (only trailing -1 padding may follow)";
      }
    }
    for (std::size_t i = 0; i < needed; ++i) {
      const int id = row[i];
      if (id < 0 || id >= t.num_pages) {
        return seq(s) + "entry " + std::to_string(i) + " is page " + std::to_string(id) +
               (id == -1 ? ", padding inside the sequence"
                         : ", outside the pool of " + std::to_string(t.num_pages));
      }
      const auto [it, fresh] = first_use.try_emplace(id, s, i);
      if (fresh) continue;
      const auto [s0, i0] = it->second;
      if (s0 == s) {
        return seq(s) + "page " + std::to_string(id) + " appears twice (entries " +
               std::to_string(i0) + " and " + std::to_string(i) + ")";
      }
      const auto shared = static_cast<std::size_t>(t.shared_prefix_pages);
      if (i != i0 || i >= shared) {
        return seq(s) + "page " + std::to_string(id) + " (entry " + std::to_string(i) +
               ") is also sequence " + std::to_string(s0) + "'s entry " + std::to_string(i0) +
               "; pages may be shared only as the same page of the declared shared prefix (" +
               std::to_string(shared) + " pages)";
      }
    }
  }
  return "";
}

PageTable make_page_table(const std::vector<std::int64_t>& kv_lens, int page_size,
                          int shared_prefix_pages, PageLayout layout, std::uint64_t seed) {
  PageTable t;
  t.page_size = page_size;
  t.kv_lens = kv_lens;
  const bool share = layout != PageLayout::private_prefix && kv_lens.size() > 1;
  t.shared_prefix_pages = share ? shared_prefix_pages : 0;
  std::int64_t max_pages = 0;
  for (const std::int64_t len : kv_lens) max_pages = std::max(max_pages, pages_for(len, page_size));
  t.tables.assign(kv_lens.size(), std::vector<int>(static_cast<std::size_t>(max_pages), -1));
  int next = 0;
  if (share) {
    for (std::int64_t i = 0; i < shared_prefix_pages; ++i) {
      for (std::vector<int>& row : t.tables) row[static_cast<std::size_t>(i)] = next;
      ++next;
    }
  }
  // The rest round-robin by logical page, as an allocator hands pages to growing sequences.
  for (std::int64_t i = share ? shared_prefix_pages : 0; i < max_pages; ++i) {
    for (std::size_t s = 0; s < kv_lens.size(); ++s) {
      if (i < pages_for(kv_lens[s], page_size)) t.tables[s][static_cast<std::size_t>(i)] = next++;
    }
  }
  t.num_pages = next;
  if (layout == PageLayout::permuted) {
    // Fisher–Yates over the physical ids, each draw one Philox block keyed by `seed`.
    std::vector<int> perm(static_cast<std::size_t>(next));
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = next - 1; i > 0; --i) {
      const Philox4x32 r =
          philox4x32_10(Philox4x32{{static_cast<std::uint32_t>(i), 0x9A6Eu, 0, 0}},
                        static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
      std::swap(perm[static_cast<std::size_t>(i)],
                perm[r.v[0] % static_cast<std::uint32_t>(i + 1)]);
    }
    // A shuffle that happens to move nothing (likely in small pools) swaps two pages instead:
    // the layout the invariance compares against must differ.
    bool identity = true;
    for (int i = 0; i < next; ++i) identity = identity && perm[static_cast<std::size_t>(i)] == i;
    if (identity && next >= 2) std::swap(perm[0], perm[1]);
    for (std::vector<int>& row : t.tables) {
      for (int& id : row) id = id < 0 ? id : perm[static_cast<std::size_t>(id)];
    }
  }
  return t;
}

std::string page_table_digest(const PageTable& t) {
  Sha256 h;
  const auto put = [&](std::int64_t x) {
    std::uint8_t bytes[8];
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(x) >> (8 * i));
    h.update(bytes, 8);
  };
  put(t.page_size);
  put(t.num_pages);
  put(t.shared_prefix_pages);
  for (std::size_t s = 0; s < t.tables.size(); ++s) {
    put(t.kv_lens[s]);
    put(static_cast<std::int64_t>(t.tables[s].size()));
    for (const int id : t.tables[s]) put(id);
  }
  return Sha256::hex(h.finish());
}

}  // namespace cpd
