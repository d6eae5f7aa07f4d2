// The paged tests' shared fixture: a small paged problem, its page tables and lanes on two KV
// heads, and the comparisons both test_paged.cpp and test_paged_invariances.cpp make.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "engine/paged/paged_attention.h"
#include "engine/paged/paged_case.h"
#include "kernels/input_store.h"

namespace cpd::testing {

// Three sequences of 10, 7 and 5 tokens, pages of 4, the first page a shared prompt.
inline PageTable small_table() {
  return make_page_table({10, 7, 5}, 4, 1, PageLayout::interleaved, 7);
}

inline void expect_invalid(const PageTable& t, const std::string& fragment) {
  const std::string error = validate(t);
  CAPTURE(error);
  CHECK(error.find(fragment) != std::string::npos);
  CHECK_THROWS_AS(PagedKvCache(t, Range{0, 1}, 64), UsageError);
}

// S = 48, B = 3: kv_lens 48, 43, 38; pages of 4; shared prompt of 8 tokens; q_len 15.
inline Problem paged_problem() {
  Problem p;
  p.seq_len = 48;
  p.batch = 3;
  return p;
}

inline std::size_t mismatches(const Shard& a, const Shard& b) {
  REQUIRE(a.data.size() == b.data.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i)
    n += std::memcmp(&a.data[i], &b.data[i], sizeof(float)) != 0;
  return n;
}

// Everything one lane needs on KV heads [0, 2) (query heads 0–7).
struct Fixture {
  Problem p = paged_problem();
  ThreadPool pool{2};
  InputStore inputs{p, pool};
  PagedWorkload w = make_paged_workload(p, 4, std::nullopt);
  Range heads{0, 2};
  int group = p.dims.group_size();
  float scale = p.dims.softmax_scale();
  std::vector<int> rows{0, 1, 2};

  Shard q(InputPrecision precision) {
    return inputs.shard(TensorId::q, ShardShape{p.batch, Range{0, 8}, {Range{0, p.seq_len}}, 128},
                        precision);
  }
  PagedKvCache cache(PageLayout layout, const LogicalKv& kv, std::uint64_t seed = 11) {
    PagedKvCache c(make_page_table(w.kv_lens, w.page_size, w.prefix_pages(), layout, seed), heads,
                   128);
    for (int s = 0; s < 3; ++s) {
      for (std::int64_t h = heads.begin; h < heads.end; ++h)
        c.write_sequence(s, h, kv.k.at(s, h, 0), kv.v.at(s, h, 0));
    }
    return c;
  }
  AttnShard lane(const Lane& l, const PagedKvCache& c, const Shard& queries) {
    return run_paged_lane(l, c, w.q_len, queries, rows, heads, group, scale, inputs.backend());
  }
};

inline const SplitKv kFixed8{SplitPolicy::fixed, 8};

// K (first) and V rows [0, len) of sequence `seq`, KV head h, read through the block table as a
// paged kernel reads them: [len][dim] each.
inline std::pair<std::vector<float>, std::vector<float>> read_back(const PagedKvCache& c, int seq,
                                                                   std::int64_t h, std::int64_t len,
                                                                   int dim) {
  const auto [k, v] = c.rows(seq, h);
  std::pair<std::vector<float>, std::vector<float>> rows;
  for (std::int64_t j = 0; j < len; ++j) {
    rows.first.insert(rows.first.end(), k.row(j, dim), k.row(j, dim) + dim);
    rows.second.insert(rows.second.end(), v.row(j, dim), v.row(j, dim) + dim);
  }
  return rows;
}

}  // namespace cpd::testing
