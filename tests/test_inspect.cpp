// cpdrift-inspect's pieces on a toy dump: the figures' pairing and selection (the report's, over
// the same statistics), digests, the .npy writer, the SVG plot and the command line's errors.
#include <doctest/doctest.h>

#include <cstring>

#include "core/util/sha256.h"
#include "inspect/command_line.h"
#include "inspect/drift_plot.h"
#include "inspect/figures.h"
#include "inspect/tiny_dump.h"

using namespace inspect_test;
using namespace cpd::inspect;

namespace {

const std::string kBase = "/cases/" + kCase + "/";

const FigureSpec* find_spec(const std::vector<FigureSpec>& specs, const std::string& name) {
  for (const FigureSpec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

struct Ran {
  int status;
  std::string out, err;
};

// inspect_main in this process, its output and errors captured.
Ran run_main(const std::vector<std::string>& args) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  const int status = inspect_main(args, out, err);
  const auto take = [](std::FILE* f) {
    std::string s(static_cast<std::size_t>(std::ftell(f)), '\0');
    std::rewind(f);
    s.resize(std::fread(s.data(), 1, s.size(), f));
    std::fclose(f);
    return s;
  };
  return Ran{status, take(out), take(err)};
}

}  // namespace

TEST_CASE("the figures pair each candidate with the report's reference") {
  const std::string path = tmp_path("figures.h5");
  write_tiny_dump(path);
  const DumpFile dump = DumpFile::open(path);
  const CaseInfo& c = dump.cases().front();
  const std::vector<FigureSpec> specs = report_figures(dump, c);
  struct Want {
    const char* name;
    std::string candidate, reference;
    bool digest, bf16;
  };
  const std::vector<Want> wants = {
      {"drift.cp_merge_fp32.out", "candidate_fp32/out", "reference_fp32/out", true, false},
      {"drift.dtype_path_vs_fp32.lse", "candidate_bf16/lse", "reference_fp32/lse", true, false},
      {"drift.bf16_kernel.out", "bf16_kernel/out", "reference_fp32/out", true, false},
      {"per_rank[1].out", "candidate_bf16/out", "reference_fp32/out", false, false},
      {"per_rank[0].cp_merge_fp32.lse", "candidate_fp32/lse", "reference_fp32/lse", false, false},
      {"backward.report.drifts[0].dk", "candidate_fp32/dk", "reference_fp32/dk", true, false},
      {"backward.report.drifts[0].per_rank[1].dv", "candidate_fp32/dv", "reference_fp32/dv", false,
       false},
      {"backward.report.drifts[0].bf16_final_write.dq", "candidate_fp32/dq", "reference_fp32/dq",
       false, true},
      {"dlogp.drift", "candidate/logp", "reference/logp", true, false},
  };
  for (const Want& w : wants) {
    CAPTURE(w.name);
    const FigureSpec* s = find_spec(specs, w.name);
    REQUIRE(s != nullptr);
    CHECK(s->candidate == kBase + w.candidate);
    CHECK(s->reference == kBase + w.reference);
    CHECK(s->digest == w.digest);
    CHECK(s->bf16_candidate == w.bf16);
  }
  // Not in this dump: the lanes, the GPU legs, and the topology check (no CP=1 case).
  CHECK(find_spec(specs, "drift.production_lanes.te_p2p.vs_fp32_reference.out") == nullptr);
  CHECK(find_spec(specs, "drift.topology_invariance.out") == nullptr);
  CHECK(find_spec(specs, "cuda_vs_cpu_fp32.out") == nullptr);
  const std::vector<MissingFigure> missing = missing_figures(dump, c);
  REQUIRE_FALSE(missing.empty());
  CHECK(missing.front().name == "drift.topology_invariance");
  CHECK(missing.front().reason ==
        "its CP=1 counterpart qwen3_8b_tp1_cp1_chunk4_bf16 is not a case of this run");
  std::remove(path.c_str());
}

TEST_CASE("a figure over a rank's tokens is the statistics of exactly those elements") {
  const std::string path = tmp_path("select.h5");
  const std::vector<TinyTensor> t = write_tiny_dump(path);
  const DumpFile dump = DumpFile::open(path);
  const std::vector<FigureSpec> specs = report_figures(dump, dump.cases().front());
  FigureMeter meter(dump, nullptr);
  // Rank 1 of CP=2 owns positions [4, 8): gather them by hand, [h][s][d] for every h.
  const std::vector<float>& cand = t[2].data;  // candidate_fp32/out
  const std::vector<float>& ref = t[0].data;   // reference_fp32/out
  REQUIRE(t[2].leg_path == "candidate_fp32/out");
  std::vector<float> c1, r1;
  for (int h = 0; h < kHq; ++h) {
    for (int s = kS / 2; s < kS; ++s) {
      for (int d = 0; d < kD; ++d) {
        const std::size_t at = static_cast<std::size_t>((h * kS + s) * kD + d);
        c1.push_back(cand[at]);
        r1.push_back(ref[at]);
      }
    }
  }
  const cpd::DiffPart part{c1.data(), r1.data(), c1.size(), false};
  const cpd::DiffStats want = cpd::compute_diff_stats(std::span(&part, 1));
  const cpd::DiffStats got = meter.measure(*find_spec(specs, "per_rank[1].cp_merge_fp32.out"));
  CHECK(got.active_count == c1.size());
  CHECK(got.max_abs == want.max_abs);
  CHECK(got.mean_abs == want.mean_abs);
  CHECK(got.p95_abs == want.p95_abs);
  CHECK(got.p99_abs == want.p99_abs);
  CHECK(got.mismatch_count == want.mismatch_count);
  CHECK(got.max_ulp == want.max_ulp);
  CHECK_FALSE(got.digest.has_value());
  // The logprobs' active tokens leave each sequence's first out; the digest is the whole tensor's.
  const cpd::DiffStats logp = meter.measure(*find_spec(specs, "dlogp.drift"));
  CHECK(logp.active_count == static_cast<std::uint64_t>(kB * (kS - 1)));
  const std::vector<float>& cand_logp = t[t.size() - 2].data;
  CHECK(logp.digest == cpd::sha256_hex(std::string_view(
                           reinterpret_cast<const char*>(cand_logp.data()), cand_logp.size() * 4)));
  // A cache too small for two tensors (each read again when needed) changes no figure.
  FigureMeter tight(dump, nullptr, 1);
  for (const FigureSpec& f : specs) {
    CAPTURE(f.name);
    const cpd::DiffStats a = meter.measure(f), b = tight.measure(f);
    CHECK((a.max_abs == b.max_abs && a.mean_abs == b.mean_abs && a.p99_abs == b.p99_abs &&
           a.mismatch_count == b.mismatch_count && a.digest == b.digest));
  }
  // A pairing of two shapes is one error naming both.
  FigureSpec odd = *find_spec(specs, "drift.cp_merge_fp32.out");
  odd.reference = kBase + "reference_fp32/lse";
  try {
    meter.measure(odd);
    FAIL("a shape mismatch was measured");
  } catch (const InspectError& e) {
    CHECK(std::string(e.what()) == path + ": drift.cp_merge_fp32.out: " + kBase +
                                       "candidate_fp32/out is [1, 4, 8, 4] but " + kBase +
                                       "reference_fp32/lse is [1, 4, 8]");
  }
  std::remove(path.c_str());
}

TEST_CASE("digests are the report's: FP32 bytes, or BF16 bit patterns of BF16-exact values") {
  const std::vector<float> v = values(1000, 7, true);
  CHECK(tensor_digest(v, false) ==
        cpd::sha256_hex(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * 4)));
  std::vector<std::uint16_t> top(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    top[i] = static_cast<std::uint16_t>(u >> 16);
  }
  CHECK(tensor_digest(v, true) == cpd::sha256_hex(std::string_view(
                                      reinterpret_cast<const char*>(top.data()), top.size() * 2)));
}

TEST_CASE(".npy: format 1.0, '<f4', C order, the shape, data 64-byte aligned") {
  const std::vector<float> v = values(2 * 3 * 5, 3);
  const std::string npy = npy_bytes(v, {2, 3, 5});
  REQUIRE(npy.size() > 10);
  CHECK(npy.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  const std::size_t header = static_cast<unsigned char>(npy[8]) |
                             static_cast<std::size_t>(static_cast<unsigned char>(npy[9])) << 8;
  CHECK((10 + header) % 64 == 0);
  const std::string dict = npy.substr(10, header);
  CHECK(dict.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 5), }", 0) == 0);
  CHECK(dict.back() == '\n');
  REQUIRE(npy.size() == 10 + header + v.size() * 4);
  CHECK(std::memcmp(npy.data() + 10 + header, v.data(), v.size() * 4) == 0);
  CHECK(npy_bytes(v, {30}).find("'shape': (30,), }") != std::string::npos);
}

TEST_CASE("the plot: every figure of the case, the run's gates, a strip per CP rank") {
  const std::string path = tmp_path("plot.h5");
  write_tiny_dump(path, R"({"thresholds": {"out_max_abs": 0.001, "lse_max_abs": 2e-4,
      "bf16_final_write_out_max_abs": 0.02, "dlogp_max_abs": 0.05, "gradient_max_abs": 0.05}})");
  const DumpFile dump = DumpFile::open(path);
  const DriftPlot plot = gather_plot(dump, {}, nullptr);
  REQUIRE(plot.cases.size() == 1);
  CHECK(plot.thresholds_from_report);
  CHECK(plot.threshold(0, 0) == 0.001);  // out: the report's value, not the default 2e-4
  CHECK(plot.threshold(2, 1) == 0.05);
  CHECK_FALSE(plot.threshold(1, 2).has_value());  // the BF16 kernel is reported, not gated
  const CasePlot& c = plot.cases.front();
  for (std::size_t col = 0; col < kPlotColumns.size(); ++col) {
    CAPTURE(kPlotColumns[col]);
    CHECK(c.whole[col][col == 2 ? 1 : 0].has_value());
  }
  CHECK_FALSE(c.whole[2][0].has_value());  // dlogp has the dtype path only
  REQUIRE(c.per_rank.size() == 2);
  CHECK(c.rank_tokens[1] == std::vector<cpd::Range>{{4, 8}});
  const std::string svg = render_svg(plot);
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>\n") == svg.size() - 7);
  CHECK(svg.find(kCase) != std::string::npos);
  CHECK(svg.find(">gate 1.0e-3<") != std::string::npos);
  CHECK(svg.find(">rank 1<") != std::string::npos);
  CHECK(svg.find(">[4,8)<") != std::string::npos);
  // Text is escaped: a file name with markup stays text.
  DriftPlot named = plot;
  named.file = "a<b>&c.h5";
  CHECK(render_svg(named).find("a&lt;b&gt;&amp;c.h5") != std::string::npos);
  CHECK_THROWS_AS(gather_plot(dump, {"nope"}, nullptr), InspectError);
  std::remove(path.c_str());
}

TEST_CASE("the command line: help, and every mistake one line and status 2") {
  const Ran help = run_main({"--help"});
  CHECK(help.status == 0);
  CHECK(help.out.rfind("usage: cpdrift-inspect COMMAND", 0) == 0);
  for (const char* command : {"list", "summary", "diff", "export", "plot"}) {
    CAPTURE(command);
    const Ran r = run_main({command, "--help"});
    CHECK(r.status == 0);
    CHECK(r.out.rfind(std::string("usage: cpdrift-inspect ") + command, 0) == 0);
    CHECK(r.err.empty());
  }
  const std::string missing = tmp_path("absent.h5");
  const std::vector<std::pair<std::vector<std::string>, std::string>> mistakes = {
      {{"frobnicate"},
       "unknown command \"frobnicate\": list, summary, diff, export or plot (see "
       "cpdrift-inspect --help)"},
      {{"list"}, "list: expects 1 file, got 0 (see cpdrift-inspect list --help)"},
      {{"diff", "a.h5"}, "diff: expects 2 operands, got 1 (see cpdrift-inspect diff --help)"},
      {{"list", "x.h5", "--atol", "1"},
       "list: unknown option --atol (see cpdrift-inspect list --help)"},
      {{"diff", "a.h5", "b.h5", "--atol"},
       "diff: --atol needs a value (see cpdrift-inspect diff --help)"},
      {{"diff", "a.h5", "b.h5", "--atol=-1"}, "diff: --atol -1: not a finite number >= 0"},
      {{"export", missing, "x"},
       "export: -o OUT.npy is required (see cpdrift-inspect export --help)"},
      {{"plot", missing}, "plot: -o OUT.svg is required (see cpdrift-inspect plot --help)"},
      {{"summary", missing}, missing + ": no such file"},
      {{"export", "--json", missing, "x", "-o", "y.npy"},
       "export: unknown option --json (see "
       "cpdrift-inspect export --help)"},
  };
  for (const auto& [args, says] : mistakes) {
    CAPTURE(args.front());
    const Ran r = run_main(args);
    CHECK(r.status == kExitError);
    CHECK(r.err == "cpdrift-inspect: error: " + says + "\n");
    CHECK(r.out.empty());
  }
}
