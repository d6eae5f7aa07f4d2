// The global block grid, split plans, the plan set and the block metadata hash.
#include <doctest/doctest.h>

#include <set>
#include <tuple>

#include "core/models.h"
#include "core/plan.h"
#include "report/plan_json.h"

using namespace cpd;

namespace {

std::vector<Range> bounds(int cp, std::optional<std::int64_t> split, CpLayout layout,
                          std::int64_t s) {
  return kv_block_bounds(CaseSpec{1, cp, split, layout, Protocol::ag_rs}, s);
}

}  // namespace

TEST_CASE("block metadata hashes match the contract's examples") {
  CHECK(block_metadata_hash({{0, 8}, {8, 16}}) == "c7b6a36e348bc195");
  CHECK(block_metadata_hash({{0, 4}, {4, 8}, {8, 12}, {12, 16}}) == "bae9b987400665a4");
  CHECK(block_metadata_hash(bounds(2, std::nullopt, CpLayout::contiguous, 16)) ==
        "c7b6a36e348bc195");
  CHECK(block_metadata_hash(bounds(1, 4, CpLayout::contiguous, 16)) == "bae9b987400665a4");
  CHECK(block_metadata_hash(bounds(2, 4, CpLayout::contiguous, 16)) == "bae9b987400665a4");
}

TEST_CASE("CP owner ranges: contiguous and zigzag") {
  CHECK(cp_owner_ranges(CpLayout::contiguous, 2, 1, 16) == std::vector<Range>{{8, 16}});
  CHECK(cp_owner_ranges(CpLayout::zigzag, 2, 0, 16) == std::vector<Range>{{0, 4}, {12, 16}});
  CHECK(cp_owner_ranges(CpLayout::zigzag, 2, 1, 16) == std::vector<Range>{{4, 8}, {8, 12}});
  CHECK(cp_owner_ranges(CpLayout::zigzag, 1, 0, 16) == std::vector<Range>{{0, 8}, {8, 16}});
}

TEST_CASE("blocks: cut from each owner's start, last one shorter, sorted by position") {
  CHECK(split_range({0, 10}, 4) == std::vector<Range>{{0, 4}, {4, 8}, {8, 10}});
  CHECK(split_range({3, 5}, std::nullopt) == std::vector<Range>{{3, 5}});
  CHECK(bounds(2, 3, CpLayout::contiguous, 12) ==
        std::vector<Range>{{0, 3}, {3, 6}, {6, 9}, {9, 12}});
  // Unaligned: 12/2 = 6 is not a multiple of 4, so the grid depends on CP.
  CHECK(bounds(2, 4, CpLayout::contiguous, 12) ==
        std::vector<Range>{{0, 4}, {4, 6}, {6, 10}, {10, 12}});
  CHECK(bounds(1, 4, CpLayout::contiguous, 12) == std::vector<Range>{{0, 4}, {4, 8}, {8, 12}});
  // Zigzag blocks interleave owners but are indexed by position.
  const std::vector<KvBlock> z =
      kv_block_grid(CaseSpec{1, 2, std::nullopt, CpLayout::zigzag, Protocol::ag_rs}, 16);
  REQUIRE(z.size() == 4);
  CHECK(z[0].owner_cp_rank == 0);
  CHECK(z[1].owner_cp_rank == 1);
  CHECK(z[2].owner_cp_rank == 1);
  CHECK(z[3].owner_cp_rank == 0);
  for (int i = 0; i < 4; ++i) CHECK(z[i].index == i);
  // With an aligned split every layout and CP gives the same global grid.
  const auto g = bounds(1, 4, CpLayout::contiguous, 64);
  for (int cp : {1, 2, 4}) {
    for (CpLayout l : {CpLayout::contiguous, CpLayout::zigzag}) CHECK(bounds(cp, 4, l, 64) == g);
  }
}

TEST_CASE("plan set: B·TP·CP·CP sorted entries with complete coverage") {
  Problem p;
  p.batch = 2;
  p.seq_len = 24;
  for (CpLayout layout : {CpLayout::contiguous, CpLayout::zigzag}) {
    const CaseSpec spec{2, 3, 4, layout, Protocol::ag_rs};
    // Every block of the grid merged by every TP rank's query owners, as a run records it.
    CaseExecution e;
    e.backend = "cpu";
    for (int t = 0; t < spec.tp; ++t) {
      std::vector<ExecutedBlock>& blocks = e.merged_blocks.emplace_back();
      for (const KvBlock& b : kv_block_grid(spec, p.seq_len))
        blocks.push_back(ExecutedBlock{b.index, b.range, b.owner_cp_rank});
    }
    const json::Value set = plan_set_json(p, spec, e);
    const json::Array& entries = set.at("entries").as_array();
    CHECK(entries.size() == static_cast<std::size_t>(2 * 2 * 3 * 3));
    CHECK(set.at("coverage").as_string() == "complete_batch_tp_cp_owner_cartesian_product");
    std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> keys;
    std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> previous{-1, -1, -1, -1};
    for (const json::Value& e : entries) {
      const auto key =
          std::make_tuple(e.at("batch_index").as_int64(), e.at("tp_rank").as_int64(),
                          e.at("cp_rank").as_int64(), e.at("owner_cp_rank").as_int64());
      CHECK(previous < key);  // sorted, hence unique
      previous = key;
      keys.insert(key);
      // The owner's split boundaries tile its ranges with no gap.
      std::int64_t covered = 0;
      for (const json::Value& r : e.at("actual_split_boundaries").as_array()) {
        covered += r.at(1).as_int64() - r.at(0).as_int64();
      }
      std::int64_t owned = 0;
      for (const json::Value& r : e.at("expected_kv_ranges").as_array())
        owned += r.at(1).as_int64() - r.at(0).as_int64();
      CHECK(covered == owned);
    }
    CHECK(keys.size() == entries.size());
    // Owner ranges (one entry per owner) tile [0, S).
    std::vector<Range> all;
    for (int owner = 0; owner < 3; ++owner) {
      for (const Range& r : cp_owner_ranges(layout, 3, owner, p.seq_len)) all.push_back(r);
    }
    std::sort(all.begin(), all.end());
    std::int64_t next = 0;
    for (const Range& r : all) {
      CHECK(r.begin == next);
      next = r.end;
    }
    CHECK(next == p.seq_len);
  }
}

TEST_CASE("case names and validation") {
  Problem fp32;
  fp32.dtype = DType::fp32;
  CHECK(case_name(CaseSpec{2, 2, std::nullopt, CpLayout::contiguous, Protocol::ag_rs}, Problem{}) ==
        "qwen3_8b_tp2_cp2_prefill_bf16");
  CHECK(case_name(CaseSpec{1, 2, 4, CpLayout::zigzag, Protocol::ag_rs}, fp32) ==
        "qwen3_8b_tp1_cp2_chunk4_fp32_zigzag");
  Problem llama;
  llama.dims = *find_model("llama-3.1-8b");
  CHECK(case_name(CaseSpec{2, 1, 8, CpLayout::contiguous, Protocol::ag_rs}, llama) ==
        "llama_3_1_8b_tp2_cp1_chunk8_bf16");
  Problem p;
  p.seq_len = 16;
  CHECK(validate_case(CaseSpec{2, 2, 4, CpLayout::contiguous, Protocol::ag_rs}, p).empty());
  CHECK_FALSE(validate_case(CaseSpec{3, 1, 4, CpLayout::contiguous, Protocol::ag_rs}, p).empty());
  CHECK_FALSE(validate_case(CaseSpec{16, 1, 4, CpLayout::contiguous, Protocol::ag_rs}, p)
                  .empty());  // 8 KV heads
  CHECK_FALSE(validate_case(CaseSpec{1, 32, 4, CpLayout::contiguous, Protocol::ag_rs}, p).empty());
  CHECK_FALSE(validate_case(CaseSpec{1, 16, 4, CpLayout::zigzag, Protocol::ag_rs}, p).empty());
  CHECK_FALSE(validate_case(CaseSpec{1, 1, 0, CpLayout::contiguous, Protocol::ag_rs}, p).empty());
}

TEST_CASE("split plans are read off the blocks that ran, never from the request") {
  const std::vector<Range> one{Range{0, 10}}, zigzag{Range{0, 4}, Range{12, 16}};
  const auto read = [](const std::vector<Range>& ranges, const std::vector<Range>& blocks,
                       std::optional<std::int64_t> asked) {
    const SplitReading r = read_split_plan(ranges, blocks, asked);
    return std::make_pair(std::string(r.policy), r.size);
  };
  using Reading = std::pair<std::string, std::optional<std::int64_t>>;
  // Cut at 4 from each range's start, the last block shorter: fixed 4, whatever was asked.
  CHECK(read(one, {{0, 4}, {4, 8}, {8, 10}}, 4) == Reading{"fixed", 4});
  CHECK(read(one, {{0, 4}, {4, 8}, {8, 10}}, std::nullopt) == Reading{"fixed", 4});
  CHECK(read(zigzag, {{0, 2}, {2, 4}, {12, 14}, {14, 16}}, 2) == Reading{"fixed", 2});
  // One block per range: disabled, or a fixed split too long to cut.
  CHECK(read(one, {{0, 10}}, std::nullopt) == Reading{"disabled", std::nullopt});
  CHECK(read(one, {{0, 10}}, 16) == Reading{"fixed", 16});
  CHECK(read(one, {{0, 10}}, 8) == Reading{"disabled", std::nullopt});
  CHECK(read(zigzag, {{0, 4}, {12, 16}}, 4) == Reading{"fixed", 4});
  // Anything else is irregular: uneven cuts, gaps, overlaps, a block outside every range.
  CHECK(read(one, {{0, 4}, {4, 6}, {6, 10}}, 4).first == "irregular");
  CHECK(read(one, {{0, 4}, {4, 9}}, 4).first == "irregular");
  CHECK(read(one, {{0, 4}, {5, 10}}, 4).first == "irregular");
  CHECK(read(one, {{0, 4}, {2, 10}}, 4).first == "irregular");
  CHECK(read(one, {{0, 4}, {4, 8}, {8, 12}}, 4).first == "irregular");
  CHECK(read(zigzag, {{0, 2}, {2, 4}, {12, 13}, {13, 16}}, 2).first == "irregular");
  CHECK(read(one, {}, 4).first == "irregular");  // nothing ran
}
