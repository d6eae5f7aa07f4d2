// The rollout side: page tables (validation, layouts), the paged cache, split plans and the paged
// lanes against an FP64 oracle (the invariances: test_paged_invariances.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/errors.h"
#include "engine/case_runner.h"
#include "engine/paged/paged_attention.h"
#include "engine/paged/paged_case.h"
#include "fp64_attention.h"
#include "kernels/cpu/attention.h"
#include "kernels/input_store.h"
#include "paged_fixture.h"
#include "random_rows.h"
#include "recorded_run.h"
#include "report/run_report.h"

using namespace cpd;

using namespace cpd::testing;

TEST_CASE("page tables: every malformed table is refused with one line naming the problem") {
  REQUIRE(validate(small_table()).empty());
  PageTable t = small_table();
  t.page_size = 0;
  expect_invalid(t, "page size");
  t = small_table();
  t.tables.pop_back();
  expect_invalid(t, "3 sequences but 2 block tables");
  t = small_table();
  t.tables[0].resize(2);
  expect_invalid(t, "needs 3 pages, the block table has 2");
  t = small_table();
  t.tables[1][1] = -1;
  expect_invalid(t, "padding inside the sequence");
  t = small_table();
  t.tables[2][2] = t.num_pages - 1;  // past the 2 pages 5 tokens need
  expect_invalid(t, "only trailing -1 padding");
  t = small_table();
  t.tables[0][1] = t.num_pages;
  expect_invalid(t, "outside the pool");
  t = small_table();
  t.tables[0][2] = t.tables[0][1];
  expect_invalid(t, "appears twice");
  t = small_table();
  t.tables[1][1] = t.tables[0][1];  // a private page shared
  expect_invalid(t, "shared only as the same page of the declared shared prefix");
  t = small_table();
  t.tables[1][1] = t.tables[0][0];  // the prompt page, at another logical index
  expect_invalid(t, "shared only as the same page");
  t = small_table();
  t.kv_lens[2] = -1;
  expect_invalid(t, "negative KV length");
}

TEST_CASE(
    "page layouts: the prompt is shared or copied, the shuffle moves pages, the digest tells them "
    "apart") {
  const PageTable shared = make_page_table({10, 7, 5}, 4, 1, PageLayout::interleaved, 7);
  const PageTable shuffled = make_page_table({10, 7, 5}, 4, 1, PageLayout::permuted, 7);
  const PageTable copied = make_page_table({10, 7, 5}, 4, 1, PageLayout::private_prefix, 7);
  for (const PageTable* t : {&shared, &shuffled, &copied}) CHECK(validate(*t).empty());
  CHECK(shared.num_pages == 1 + 2 + 1 + 1);  // the prompt, then 2, 1 and 1 private pages
  CHECK(shared.tables[0][0] == shared.tables[2][0]);
  CHECK(copied.num_pages == 3 + 2 + 2);
  CHECK(copied.tables[0][0] != copied.tables[1][0]);
  CHECK(shuffled.tables != shared.tables);
  CHECK(shuffled.num_pages == shared.num_pages);
  CHECK(page_table_digest(shared) != page_table_digest(shuffled));
  CHECK(page_table_digest(shared) ==
        page_table_digest(make_page_table({10, 7, 5}, 4, 1, PageLayout::interleaved, 7)));
}

TEST_CASE("a shuffle always moves pages, and shared pages are read-only") {
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    CHECK(make_page_table({3}, 2, 0, PageLayout::permuted, seed).tables !=
          make_page_table({3}, 2, 0, PageLayout::interleaved, seed).tables);
  }
  // Two sequences sharing their first page must agree on its rows.
  PagedKvCache c(make_page_table({6, 5}, 4, 1, PageLayout::interleaved, 1), Range{0, 1}, 64);
  std::vector<float> a(6 * 64, 1.0f), b(5 * 64, 1.0f);
  c.write_sequence(0, 0, a.data(), a.data());
  c.write_sequence(1, 0, b.data(), b.data());  // the same prompt rows: fine
  b[64 + 5] = 2.0f;                            // position 1, inside the shared page
  CHECK_THROWS_WITH_AS(c.write_sequence(1, 0, b.data(), b.data()), doctest::Contains("read-only"),
                       UsageError);
  // A shorter sequence fills only the first slot of the second shared page; a longer one
  // written after it fills the rest, and both read back their own rows.
  PagedKvCache partial(make_page_table({5, 10}, 4, 2, PageLayout::interleaved, 1), Range{0, 1}, 64);
  const std::vector<float> longer = testing::random_rows(10, 3, 64);
  partial.write_sequence(0, 0, longer.data(), longer.data());  // its first 5 rows
  partial.write_sequence(1, 0, longer.data(), longer.data());
  CHECK(testing::same_bits(read_back(partial, 1, 0, 10, 64).first, longer));
  const std::vector<float> k0 = read_back(partial, 0, 0, 5, 64).first;
  CHECK(testing::same_bits(k0.data(), longer.data(), k0.size()));
}

TEST_CASE("a backend without a paged kernel reads the pages out first and gets the same bits") {
  // The CUDA backend's adapter (contiguous_fold_jobs) against the CPU kernel reading the pages
  // in place: every row of every sequence and head, FP32 and BF16 probabilities.
  Fixture f;
  const LogicalKv kv = logical_kv(f.w, f.inputs, f.heads, InputPrecision::fp32);
  const PagedKvCache c = f.cache(PageLayout::permuted, kv);
  const Shard q = f.q(InputPrecision::fp32);
  std::vector<std::vector<Range>> blocks(3);
  for (int s = 0; s < 3; ++s) {
    const std::int64_t len = f.w.kv_lens[static_cast<std::size_t>(s)];
    for (std::int64_t b = 0; b < len; b += 8) blocks[s].push_back(Range{b, std::min(b + 8, len)});
  }
  const auto jobs = [&](std::vector<float>& out) {
    out.assign(3 * 8 * 48 * 129, NAN);
    std::vector<FoldJob> js;
    for (int s = 0; s < 3; ++s) {
      const std::int64_t len = f.w.kv_lens[static_cast<std::size_t>(s)];
      for (int h = 0; h < 8; ++h) {
        const auto [k, v] = c.rows(s, h / f.group);
        float* o = out.data() + (s * 8 + h) * 48 * 129;
        js.push_back(FoldJob{q.at(s, h, 0), 0, len, k, v, 0, blocks[s], o, o + 48 * 128});
      }
    }
    return js;
  };
  for (const ProbRounding rounding : {ProbRounding::none, ProbRounding::bf16}) {
    std::vector<float> in_place, copied;
    run_fold_jobs(jobs(in_place), 128, f.scale, rounding, f.pool);
    std::deque<std::vector<float>> storage;
    const std::vector<FoldJob> paged = jobs(copied);
    run_fold_jobs(contiguous_fold_jobs(paged, 128, storage), 128, f.scale, rounding, f.pool);
    // One copy per (sequence, KV head) and K or V, shared by the group's query heads.
    CHECK(storage.size() == 2 * 3 * 2);
    CHECK(testing::same_bits(in_place, copied));
  }
}

TEST_CASE(
    "the cache reads back the logical rows bit for bit through any layout; a stale table does "
    "not") {
  Fixture f;
  const LogicalKv kv = logical_kv(f.w, f.inputs, f.heads, InputPrecision::fp32);
  // Sequences 1 and 2 hold sequence 0's rows over the shared prompt (12 tokens: three pages
  // cached once), their own after it.
  const std::int64_t prompt = shared_prompt_len(f.p);
  REQUIRE(prompt == 12);
  CHECK(std::memcmp(kv.k.at(2, 1, 0), kv.k.at(0, 1, 0), prompt * 128 * sizeof(float)) == 0);
  CHECK(std::memcmp(kv.k.at(2, 1, prompt), kv.k.at(0, 1, prompt), 128 * sizeof(float)) != 0);
  for (const PageLayout layout :
       {PageLayout::interleaved, PageLayout::permuted, PageLayout::private_prefix}) {
    const PagedKvCache c = f.cache(layout, kv);
    for (int s = 0; s < 3; ++s) {
      const std::int64_t len = f.w.kv_lens[static_cast<std::size_t>(s)];
      const auto [k, v] = read_back(c, s, 1, len, 128);
      CHECK(std::memcmp(k.data(), kv.k.at(s, 1, 0), k.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(v.data(), kv.v.at(s, 1, 0), v.size() * sizeof(float)) == 0);
    }
  }
  // Negative control: pages written through the shuffled table, read through the unshuffled
  // one (a block table that did not follow its pages).
  PagedKvCache stale = f.cache(PageLayout::permuted, kv);
  stale.retable(make_page_table(f.w.kv_lens, 4, f.w.prefix_pages(), PageLayout::interleaved, 11));
  const std::vector<float> k = read_back(stale, 0, 0, f.w.kv_lens[0], 128).first;
  CHECK(std::memcmp(k.data(), kv.k.at(0, 0, 0), k.size() * sizeof(float)) != 0);
  CHECK_THROWS_AS(stale.retable(small_table()), UsageError);  // another pool's table
}

TEST_CASE("split plans tile the context; fixed decode grids are the prefill grid cut at the step") {
  for (const std::int64_t len : {1, 5, 8, 9, 43}) {
    for (const SplitKv s :
         {SplitKv{SplitPolicy::disabled, 0}, kFixed8, SplitKv{SplitPolicy::auto_select, 0}}) {
      CAPTURE(len);
      CHECK(coverage_error(split_blocks(s, len, 3, 4), len).empty());
    }
  }
  const std::vector<Range> full = split_blocks(kFixed8, 43, 3, 4);
  const std::vector<Range> step = split_blocks(kFixed8, 21, 3, 4);
  REQUIRE(step.size() == 3);
  CHECK(step[0] == full[0]);
  CHECK(step[1] == full[1]);
  CHECK(step[2] == Range{16, 21});
  // auto depends on the batch and the length: the reason it is only a diagnostic.
  CHECK(split_blocks(SplitKv{SplitPolicy::auto_select, 0}, 43, 1, 4) !=
        split_blocks(SplitKv{SplitPolicy::auto_select, 0}, 43, 4, 4));
  CHECK(split_blocks(SplitKv{SplitPolicy::auto_select, 0}, 43, 1, 4)[0] !=
        split_blocks(SplitKv{SplitPolicy::auto_select, 0}, 21, 1, 4)[0]);
  // The coverage check catches a gap, an overlap, a short plan and an empty block.
  CHECK_FALSE(coverage_error({{0, 4}, {5, 8}}, 8).empty());
  CHECK_FALSE(coverage_error({{0, 5}, {4, 8}}, 8).empty());
  CHECK_FALSE(coverage_error({{0, 4}}, 8).empty());
  CHECK_FALSE(coverage_error({{0, 4}, {4, 4}, {4, 8}}, 8).empty());
}

TEST_CASE(
    "paged workloads: lengths, the shared prompt and q_len; impossible ones are usage errors") {
  const PagedWorkload w = make_paged_workload(paged_problem(), 4, std::nullopt);
  CHECK(w.kv_lens == std::vector<std::int64_t>{48, 43, 38});
  CHECK(w.prefix_len == 12);  // the prompt: min(16, 38 / 3) tokens, three pages of 4
  CHECK(w.q_len == 13);       // (38 - 12) / 2
  CHECK(w.queries(1) == Range{30, 43});
  // A page size that does not divide the prompt: its last partial page stays private.
  CHECK(make_paged_workload(paged_problem(), 5, std::nullopt).prefix_len == 10);
  Problem one = paged_problem();
  one.batch = 1;
  CHECK(make_paged_workload(one, 4, std::nullopt).prefix_len == 0);
  CHECK_THROWS_WITH_AS(make_paged_workload(paged_problem(), 4, 27),
                       doctest::Contains("room for 1 to 26"), UsageError);
  Problem tiny = paged_problem();
  tiny.seq_len = 4;
  tiny.batch = 8;
  CHECK_THROWS_AS(make_paged_workload(tiny, 4, std::nullopt), UsageError);
}

TEST_CASE("paged lanes against an FP64 oracle of the full logical KV") {
  // The FP32 lanes (every call kind, every split) within 2e-5 of FP64 attention: 128-term FP32
  // dot products of O(1) normals and sums of at most 48 weights lose ~1e-6; 2e-5 leaves room
  // and is still 500x below the BF16 effects the paged thresholds are for. The BF16 lane
  // (BF16 inputs, BF16 P) against FP64 on the same BF16 inputs: P's rounding moves each
  // weight by ≤ 2^-9 relative, so out by ≤ 2^-9 · max|v| ≲ 1e-2; lse keeps FP32 P (≤ 2e-5).
  Fixture f;
  for (const bool bf16 : {false, true}) {
    const InputPrecision precision = bf16 ? InputPrecision::bf16 : InputPrecision::fp32;
    const Shard q = f.q(precision);
    const LogicalKv kv = logical_kv(f.w, f.inputs, f.heads, precision);
    const PagedKvCache c = f.cache(PageLayout::permuted, kv);
    for (const PagedCall call :
         {PagedCall::decode, PagedCall::paged_prefill, PagedCall::full_prefill}) {
      for (const SplitKv split : {SplitKv{SplitPolicy::disabled, 0}, kFixed8}) {
        const AttnShard a =
            f.lane(Lane{call, split, bf16 ? ProbRounding::bf16 : ProbRounding::none}, c, q);
        double worst_out = 0, worst_lse = 0;
        for (int s = 0; s < 3; ++s) {
          const std::int64_t len = f.w.kv_lens[static_cast<std::size_t>(s)];
          const Range rows = call == PagedCall::full_prefill ? Range{0, len} : f.w.queries(s);
          for (std::int64_t h = 0; h < 8; ++h) {
            for (std::int64_t pos = rows.begin; pos < rows.end; ++pos) {
              const std::int64_t row = call == PagedCall::full_prefill ? pos : pos - rows.begin;
              std::vector<double> out64;
              double lse64 = 0;
              testing::attention_fp64(q.at(s, h, pos), kv.k.at(s, h / 4, 0), kv.v.at(s, h / 4, 0),
                                      pos + 1, 128, f.scale, out64, lse64);
              for (int d = 0; d < 128; ++d)
                worst_out = std::max(worst_out, std::abs(a.out.at(s, h, row)[d] - out64[d]));
              worst_lse = std::max(worst_lse, std::abs(a.lse.at(s, h, row)[0] - lse64));
            }
          }
        }
        CAPTURE(bf16);
        CAPTURE(static_cast<int>(call));
        CHECK(worst_out <= (bf16 ? 1e-2 : 2e-5));
        CHECK(worst_lse <= 2e-5);
        CHECK(worst_out > 0);  // the oracle is independent: FP32 never matches it exactly
      }
    }
  }
}
