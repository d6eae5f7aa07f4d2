// The rollout side's paged KV cache layout (design §1, §7): a pool of physical pages, one block
// table per sequence, per-sequence KV lengths, and an optional read-only shared prefix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cpd {

/// Where each sequence's KV lives: logical page i of sequence s (positions [i·page_size,
/// (i+1)·page_size)) is physical page tables[s][i]; entries past the last needed page are
/// padding (-1).
struct PageTable {
  int page_size = 16;
  int num_pages = 0;                     // physical pages in the pool
  std::vector<std::int64_t> kv_lens;     // per sequence
  std::vector<std::vector<int>> tables;  // per sequence
  int shared_prefix_pages = 0;           // leading logical pages sequences may share, read-only

  int sequences() const { return static_cast<int>(kv_lens.size()); }
  /// Physical page holding position `pos` of sequence `seq`, and the slot within it.
  int page_of(int seq, std::int64_t pos) const {
    return tables[static_cast<std::size_t>(seq)][static_cast<std::size_t>(pos / page_size)];
  }
};

/// Pages needed for `kv_len` tokens.
inline std::int64_t pages_for(std::int64_t kv_len, int page_size) {
  return (kv_len + page_size - 1) / page_size;
}

/// "" when the table is valid, else one line saying what is wrong: page size ≥ 1; one table per
/// sequence; every sequence maps exactly pages_for(kv_len) pages, then only padding (-1);
/// ids in [0, num_pages); no page twice within a sequence; a page two sequences use only as
/// the same logical page inside the declared shared prefix of both.
std::string validate(const PageTable& table);

/// How a batch's pages are laid out (the page-layout and prefix-cache invariances compare
/// them; the bits must not depend on it).
enum class PageLayout {
  interleaved,     // shared prefix first, then pages handed out round-robin as sequences grow
  permuted,        // interleaved, with the physical ids shuffled (the block tables follow)
  private_prefix,  // interleaved, but every sequence holds its own copy of the prefix pages
};

/// A valid table for `kv_lens` whose first `shared_prefix_pages` logical pages are shared by
/// every sequence (except under private_prefix). `seed` drives the permutation.
PageTable make_page_table(const std::vector<std::int64_t>& kv_lens, int page_size,
                          int shared_prefix_pages, PageLayout layout, std::uint64_t seed);

/// SHA-256 (hex) of the table: page size, kv_lens and every entry as little-endian int64.
std::string page_table_digest(const PageTable& table);

}  // namespace cpd
