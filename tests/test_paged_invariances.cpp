// The rollout side's invariances — batch, page layout, prefix cache, decode vs prefill, query
// position — each bitwise with a negative control that shows the comparison can fail, and the
// paged cases end to end.
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

TEST_CASE("the rollout invariances hold bitwise, and each negative control breaks its comparison") {
  Fixture f;
  const Shard q = f.q(InputPrecision::bf16);
  const LogicalKv kv = logical_kv(f.w, f.inputs, f.heads, InputPrecision::bf16);
  const PagedKvCache main = f.cache(PageLayout::interleaved, kv);
  const Lane decode{PagedCall::decode, kFixed8, ProbRounding::bf16};
  const Lane prefill{PagedCall::paged_prefill, kFixed8, ProbRounding::bf16};
  const AttnShard d = f.lane(decode, main, q);

  SUBCASE("page layout: shuffled pages give the same bits; a stale block table does not") {
    CHECK(mismatches(d.out, f.lane(decode, f.cache(PageLayout::permuted, kv), q).out) == 0);
    PagedKvCache stale = f.cache(PageLayout::permuted, kv);
    stale.retable(main.table());
    CHECK(mismatches(d.out, f.lane(decode, stale, q).out) > 0);
  }

  SUBCASE("page layout: a kernel that merges pages in physical order is caught") {
    // A deliberately layout-dependent decode: one block per page, merged in physical page id
    // order instead of position order. The comparison the report makes must tell the layouts
    // apart for it, while the real lanes agree.
    const auto physical_order = [&](const PagedKvCache& c) {
      std::vector<float> out;
      for (int s = 0; s < 3; ++s) {
        const std::int64_t t =
            f.w.kv_lens[static_cast<std::size_t>(s)] - 1;  // the last decode step
        const auto [k, v] = read_back(c, s, 0, t + 1, 128);
        std::vector<std::vector<float>> outs, lses;
        std::vector<StateRef> states;
        for (std::int64_t p0 = 0; p0 <= t; p0 += 4) {
          const Range keys{p0, std::min(p0 + 4, t + 1)};
          outs.emplace_back(128);
          lses.emplace_back(1);
          const BlockJob job{q.at(s, 0, t),
                             t,
                             1,
                             k.data() + p0 * 128,
                             v.data() + p0 * 128,
                             keys,
                             outs.back().data(),
                             lses.back().data()};
          f.inputs.backend().run_block_jobs(std::span<const BlockJob>(&job, 1), 128, f.scale,
                                            ProbRounding::bf16);
          states.push_back(StateRef{c.table().page_of(s, p0), nullptr, nullptr});
        }
        for (std::size_t i = 0; i < states.size(); ++i) {
          states[i].out = outs[i].data();
          states[i].lse = lses[i].data();
        }
        std::vector<float> o(128), l(1);
        merge_in_block_order(states, 1, 128, o.data(), l.data());  // "block index" = physical id
        out.insert(out.end(), o.begin(), o.end());
      }
      return out;
    };
    const PagedKvCache shuffled = f.cache(PageLayout::permuted, kv);
    CHECK(physical_order(main) != physical_order(shuffled));
    CHECK(mismatches(d.out, f.lane(decode, shuffled, q).out) == 0);
  }

  SUBCASE(
      "prefix cache: private copies of the prompt give the same bits; a different prompt does "
      "not") {
    CHECK(mismatches(d.out, f.lane(decode, f.cache(PageLayout::private_prefix, kv), q).out) == 0);
    LogicalKv own{Shard(kv.k), Shard(kv.v)};  // sequence 1's first prompt key differs
    for (std::int64_t h = f.heads.begin; h < f.heads.end; ++h) own.k.at(1, h, 0)[0] += 0.5f;
    const AttnShard other = f.lane(decode, f.cache(PageLayout::private_prefix, own), q);
    CHECK(mismatches(d.out, other.out) > 0);
  }

  SUBCASE(
      "batch composition: each sequence alone gives its batch rows; a batch-sized plan does not") {
    const Lane auto_decode{PagedCall::decode, SplitKv{SplitPolicy::auto_select, 0},
                           ProbRounding::bf16};
    const AttnShard batched = f.lane(auto_decode, main, q);
    for (int s = 0; s < 3; ++s) {
      PagedKvCache alone(make_page_table({f.w.kv_lens[static_cast<std::size_t>(s)]}, 4, 0,
                                         PageLayout::interleaved, 3),
                         f.heads, 128);
      for (std::int64_t h = 0; h < 2; ++h)
        alone.write_sequence(0, h, kv.k.at(s, h, 0), kv.v.at(s, h, 0));
      const std::vector<int> only{s};
      const AttnShard a = run_paged_lane(decode, alone, f.w.q_len, q, only, f.heads, f.group,
                                         f.scale, f.inputs.backend());
      const std::size_t n = static_cast<std::size_t>(f.w.q_len) * 128;
      for (std::int64_t h = 0; h < 8; ++h) {
        CHECK(std::memcmp(a.out.at(0, h, 0), d.out.at(s, h, 0), n * sizeof(float)) == 0);
      }
      // auto picks its split from the batch size: alone (batch 1) it cuts differently.
      const AttnShard a_auto = run_paged_lane(auto_decode, alone, f.w.q_len, q, only, f.heads,
                                              f.group, f.scale, f.inputs.backend());
      bool differs = false;
      for (std::int64_t h = 0; h < 8; ++h) {
        differs |=
            std::memcmp(a_auto.out.at(0, h, 0), batched.out.at(s, h, 0), n * sizeof(float)) != 0;
      }
      CHECK(differs);
    }
  }

  SUBCASE(
      "decode vs prefill and query position: one grid gives one set of bits; another grid does "
      "not") {
    const AttnShard full =
        f.lane(Lane{PagedCall::full_prefill, kFixed8, ProbRounding::bf16}, main, q);
    const AttnShard pre = f.lane(prefill, main, q);
    const AttnShard chunked = run_contiguous_lane(prefill, f.w, kv.k, kv.v, q, f.heads, f.group,
                                                  f.scale, f.inputs.backend());
    const std::size_t n = static_cast<std::size_t>(f.w.q_len) * 128;
    for (int s = 0; s < 3; ++s) {
      for (std::int64_t h = 0; h < 8; ++h) {
        CHECK(std::memcmp(d.out.at(s, h, 0), full.out.at(s, h, f.w.queries(s).begin),
                          n * sizeof(float)) == 0);
        CHECK(std::memcmp(d.lse.at(s, h, 0), full.lse.at(s, h, f.w.queries(s).begin),
                          static_cast<std::size_t>(f.w.q_len) * sizeof(float)) == 0);
      }
    }
    CHECK(mismatches(d.out, pre.out) == 0);
    CHECK(mismatches(d.out, chunked.out) == 0);
    // The trainer's chunked prefill: query chunks of 3 pages, each attending [0, chunk end).
    const AttnShard trainer =
        run_contiguous_lane(Lane{PagedCall::chunked_prefill, kFixed8, ProbRounding::bf16}, f.w,
                            kv.k, kv.v, q, f.heads, f.group, f.scale, f.inputs.backend());
    CHECK(mismatches(d.out, trainer.out) == 0);
    CHECK(mismatches(d.lse, trainer.lse) == 0);
    // The same rows from a prefill on a grid of 16: the merge differs, so do the bits.
    const AttnShard coarse =
        f.lane(Lane{PagedCall::paged_prefill, SplitKv{SplitPolicy::fixed, 16}, ProbRounding::bf16},
               main, q);
    CHECK(mismatches(d.out, coarse.out) > 0);
    const AttnShard chunked16 = run_contiguous_lane(
        Lane{PagedCall::paged_prefill, SplitKv{SplitPolicy::fixed, 16}, ProbRounding::bf16}, f.w,
        kv.k, kv.v, q, f.heads, f.group, f.scale, f.inputs.backend());
    CHECK(mismatches(d.out, chunked16.out) > 0);
  }
}

TEST_CASE(
    "paged cases end to end: within the paged thresholds, every invariance bitwise, auto "
    "diagnostic") {
  const Problem p = paged_problem();
  ThreadPool pool(2);
  InputStore inputs(p, pool);
  InProcessTransport transport;
  LocalCp1Results cp1;
  const LocalCollectives local;
  const RunContext ctx{p, pool, inputs, transport, local, cp1};
  std::vector<PagedCaseSpec> specs;
  for (const SplitKv split :
       {SplitKv{SplitPolicy::disabled, 0}, kFixed8, SplitKv{SplitPolicy::auto_select, 0}}) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode})
      specs.push_back(PagedCaseSpec{m, split});
  }
  RunReport report;
  report.problem = p;
  report.paged_cases = testing::recorded_paged_cases(ctx, PagedOptions{4, std::nullopt, 17}, specs);
  REQUIRE(report.paged_cases.size() == 6);
  for (const PagedCaseResult& c : report.paged_cases) {
    CAPTURE(c.name);
    CHECK(c.coverage_errors.empty());
    CHECK(c.candidate.out.max_abs <= report.thresholds.paged_out_max_abs);
    CHECK(c.candidate.lse.max_abs <= report.thresholds.paged_lse_max_abs);
    CHECK(c.dlogp.max_abs <= report.thresholds.paged_dlogp_max_abs);
    CHECK(c.dlogp.active_count == 3 * 13);
    // The same tokens in the RL figures: |Δ| max is the drift's max (exact in FP64, the drift's
    // FP32 difference rounds once), and the exact KL is a finite non-negative mean.
    CHECK(c.dlogp_rl.tokens == 3 * 13);
    CHECK(c.dlogp_rl.abs_max == doctest::Approx(c.dlogp.max_abs).epsilon(1e-6));
    CHECK(c.dlogp_rl.kl_exact_mean >= 0.0);
    CHECK(std::isfinite(c.dlogp_rl.kl_exact_mean));
    CHECK(c.dlogp_rl.diverged == (c.dlogp.mismatch_count > 0));
    CHECK(c.candidate.out.digest.has_value());
    REQUIRE(c.invariances.size() == 6);
    for (const Invariance& inv : c.invariances) {
      CAPTURE(inv.name);
      CHECK(inv.applicable);
      if (invariances_required(c.spec)) CHECK(inv.bitwise_equal());
    }
  }
  // Decode and paged prefill of one plan write the same bits.
  CHECK(report.paged_cases[2].candidate.out.digest == report.paged_cases[3].candidate.out.digest);
  CHECK(report.paged_cases[0].candidate.out.digest != report.paged_cases[2].candidate.out.digest);
  // auto: batch composition and decode vs prefill break (its split follows batch and length).
  const PagedCaseResult& a = report.paged_cases[5];
  CHECK_FALSE(a.invariances[0].bitwise_equal());
  CHECK_FALSE(a.invariances[3].bitwise_equal());
  CHECK(evaluate_checks(report).empty());
  const json::Value v = paged_case_json(report, a);
  CHECK(v.at("paged").at("invariance").at("decode_vs_prefill").at("passed").as_bool() == false);
  CHECK(v.at("paged").at("split_kv").at("requested").at("policy").as_string() == "auto");
  const json::Value fixed = paged_case_json(report, report.paged_cases[3]);
  CHECK(fixed.at("paged").at("invariance").at("page_layout").at("passed").as_bool());
  CHECK(fixed.at("paged").at("split_kv").at("plans").at(1).at("actual_split_size").as_int64() == 8);
  // The plans are the ones the lanes ran with, and the report reads the policy off them: an
  // irregular cut is not the requested fixed one (negative control).
  CHECK(report.paged_cases[3].plans[1] == split_blocks(kFixed8, 43, 3, 4));
  CHECK(report.paged_cases[0].plans[1] == std::vector<Range>{Range{0, 43}});
  PagedCaseResult irregular = report.paged_cases[3];
  for (const std::vector<Range>& odd_plan :
       {std::vector<Range>{Range{0, 8}, Range{8, 12}, Range{12, 43}},
        std::vector<Range>{Range{0, 8}, Range{8, 43}}}) {
    irregular.plans[1] = odd_plan;
    const json::Value odd = paged_case_json(report, irregular).at("paged").at("split_kv");
    CHECK(odd.at("plans").at(1).at("actual_policy").as_string() == "irregular");
    CHECK(odd.at("plans").at(1).at("actual_split_size").is_null());
  }
  // A failed required invariance fails the run.
  report.paged_cases[3].invariances[1].stats.out.mismatch_count = 1;
  const std::vector<std::string> failed = evaluate_checks(report);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("invariance page_layout") != std::string::npos);
}
