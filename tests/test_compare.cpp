// cpdrift compare: the stream readers (JSON Lines and .npy written here byte by byte), the
// alignment's fail-closed rules one by one, and the figures against an FP64 oracle written
// here. HDF5 and NumPy-written streams: tests/compare/check_compare.py.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compare/stream_comparison.h"
#include "core/errors.h"
#include "temp_dir.h"

using namespace cpd;
namespace fs = std::filesystem;

namespace {

struct TempDir : cpd::testing::TempDir {
  TempDir() : cpd::testing::TempDir("cpdrift_compare") {}
};

struct Rec {
  long long seq, pos, tok;
  double lp;
};

std::string jsonl(const std::vector<Rec>& recs) {
  std::string text;
  char line[256];
  for (const Rec& r : recs) {
    std::snprintf(line, sizeof line,
                  "{\"sequence\": %lld, \"position\": %lld, \"token_id\": %lld, \"logprob\": "
                  "%.17g, \"engine_extra\": \"ignored\"}\n",
                  r.seq, r.pos, r.tok, r.lp);
    text += line;
  }
  return text;
}

// The error `compare_streams` (or a reader) throws, or "" when none.
std::string error_of(const TempDir& dir, const std::string& train, const std::string& rollout) {
  try {
    const LogprobStream t = read_logprob_stream(dir.write("train.jsonl", train));
    const LogprobStream r = read_logprob_stream(dir.write("rollout.jsonl", rollout));
    compare_streams(t, r);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::vector<Rec> kTrain = {{0, 1, 11, -1.25}, {0, 2, 12, -0.5},   {0, 3, 13, -3.0},
                                 {1, 1, 21, -2.0},  {1, 2, 22, -0.125}, {1, 7, 27, -4.5}};

}  // namespace

TEST_CASE("figures: FP64 oracle, any record order, zero for a stream against itself") {
  TempDir dir;
  std::vector<Rec> rollout = kTrain;
  const double shift[] = {0.0, 0.01, -0.02, 0.003, 0.0, -0.5};
  for (std::size_t i = 0; i < rollout.size(); ++i) rollout[i].lp -= shift[i];
  std::swap(rollout[0], rollout[4]);  // file order is not the key order
  const LogprobStream t = read_logprob_stream(dir.write("t.jsonl", "\n" + jsonl(kTrain) + "\n"));
  const LogprobStream r = read_logprob_stream(dir.write("r.jsonl", jsonl(rollout)));
  REQUIRE(t.records.size() == 6);
  CHECK(t.format == "jsonl");
  CHECK(t.where(0) == dir.path.string() + "/t.jsonl line 2");  // blank line 1 skipped
  const StreamComparison c = compare_streams(t, r);
  REQUIRE(c.tokens.size() == 6);
  CHECK(c.sequences == 2);
  CHECK(c.first_position == 1);
  CHECK(c.last_position == 7);
  // Oracle: Δ_i = train − rollout = shift_i, in key order (the shifts were applied in it).
  double abs_sum = 0, abs_max = 0, k3 = 0, rho_min = 1e300, rho_max = 0;
  for (const double d : shift) {
    abs_sum += std::fabs(d);
    abs_max = std::max(abs_max, std::fabs(d));
    k3 += std::expm1(d) - d;
    rho_min = std::min(rho_min, std::exp(d));
    rho_max = std::max(rho_max, std::exp(d));
  }
  // FP64 throughout; the logprobs went through %.17g text and back (exact), Δ is one
  // subtraction: 1e-15 relative covers the rounding of the sums.
  CHECK(c.metrics.abs_mean == doctest::Approx(abs_sum / 6).epsilon(1e-15));
  CHECK(c.metrics.abs_max == doctest::Approx(abs_max).epsilon(1e-15));
  CHECK(c.metrics.k3_mean == doctest::Approx(k3 / 6).epsilon(1e-12));
  CHECK(c.metrics.ratio_min == doctest::Approx(rho_min).epsilon(1e-15));
  CHECK(c.metrics.ratio_max == doctest::Approx(rho_max).epsilon(1e-15));
  REQUIRE(c.metrics.diverged);
  CHECK(c.metrics.first_divergent.sequence == 0);
  CHECK(c.metrics.first_divergent.position == 2);
  REQUIRE(!c.metrics.worst.empty());
  CHECK(c.metrics.worst[0].position == 7);  // |Δ| = 0.5
  CHECK_FALSE(c.exact_kl);
  REQUIRE(c.by_position.size() == 1);  // positions 0–63 only
  CHECK(c.by_position[0].tokens == 6);

  // Negative control: a stream against itself is bitwise equal, every figure zero.
  const StreamComparison same = compare_streams(t, t);
  CHECK_FALSE(same.metrics.diverged);
  CHECK(same.metrics.abs_max == 0.0);
  CHECK(same.metrics.k3_mean == 0.0);
}

TEST_CASE("fail-closed: each invalid stream pair is refused naming the first offending record") {
  TempDir dir;
  const std::string t = dir.path.string() + "/train.jsonl",
                    r = dir.path.string() + "/rollout.jsonl";
  const std::string good = jsonl(kTrain);
  CHECK(error_of(dir, good, good).empty());  // the control: the same streams are valid

  std::vector<Rec> other = kTrain;
  other[2].tok = 99;
  CHECK(error_of(dir, good, jsonl(other)) ==
        "invalid comparison: the token ids differ at (sequence 0, position 3): 13 in " + t +
            " line 3, 99 in " + r + " line 3");

  other = kTrain;
  other.erase(other.begin() + 3);  // (1, 1) only in train
  CHECK(error_of(dir, good, jsonl(other)) == "invalid comparison: " + r +
                                                 " has no record for (sequence 1, position 1) (" +
                                                 t + " line 4)");
  CHECK(error_of(dir, jsonl(other), good) == "invalid comparison: " + t +
                                                 " has no record for (sequence 1, position 1) (" +
                                                 r + " line 4)");

  other = kTrain;
  other.push_back(kTrain[1]);  // (0, 2) twice
  CHECK(error_of(dir, jsonl(other), good) == "invalid comparison: " + t +
                                                 " line 7: (sequence 0, position 2) again (first "
                                                 "at " +
                                                 t + " line 2)");

  std::string nan_line = good;
  nan_line.replace(nan_line.find("-0.5"), 4, "NaN");
  CHECK(error_of(dir, good, nan_line) ==
        r + " line 2: a non-finite number (NaN): invalid comparison, a logprob must be finite");

  other = kTrain;
  other[5].lp = -400;  // 395.5 nats from train's: no ratio
  CHECK(
      error_of(dir, good, jsonl(other)).find("invalid comparison: the logprobs differ by 395.5") ==
      0);

  std::string inactive = good;
  for (std::size_t at = 0; (at = inactive.find("\"engine_extra\"", at)) != std::string::npos;)
    inactive.replace(at, 14, "\"active\": false, \"x\"");
  CHECK(error_of(dir, inactive, inactive) ==
        "invalid comparison: no active token (all 6 records have \"active\": false)");
  CHECK(error_of(dir, good, inactive)
            .find("invalid comparison: \"active\" differs at (sequence "
                  "0, position 1)") == 0);
  CHECK(error_of(dir, "", "") == "invalid comparison: no records in " + t + " and " + r);

  // Malformed records: one line naming the file, the line and what is wrong.
  CHECK(error_of(dir, "{\"sequence\": 0, \"position\": 1, \"token_id\": 3}\n", good) ==
        t + " line 1: no \"logprob\"");
  CHECK(error_of(dir, "{\"sequence\": -1, \"position\": 1, \"token_id\": 3, \"logprob\": -1}\n",
                 good) == t + " line 1: \"sequence\" must be an integer >= 0");
  CHECK(error_of(dir, "not json\n", good).rfind(t + " line 1: not JSON (", 0) == 0);
  CHECK(error_of(dir, "[1, 2]\n", good) == t + " line 1: not a JSON object");
  try {
    read_logprob_stream(dir.path.string() + "/missing.jsonl");
    FAIL("a missing file was read");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) == dir.path.string() + "/missing.jsonl: no such file or directory");
  }
}

TEST_CASE("exact KL from full-vocabulary rows against an FP64 oracle; a missing row says so") {
  TempDir dir;
  // Two tokens over a 3-entry vocabulary, each row a normalised log-distribution.
  const auto row = [](double a, double b) {
    const double z = std::log(std::exp(a) + std::exp(b) + 1.0);
    return std::vector<double>{a - z, b - z, -z};
  };
  const std::vector<double> t0 = row(0.5, -1.0), r0 = row(0.4, -0.9), t1 = row(2.0, 0.0),
                            r1 = row(2.0, 0.0);
  const auto line = [](long long pos, int tok, const std::vector<double>& v) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"sequence\": 0, \"position\": %lld, \"token_id\": %d, \"logprob\": %.17g, "
                  "\"vocab_logprobs\": [%.17g, %.17g, %.17g]}\n",
                  pos, tok, v[static_cast<std::size_t>(tok)], v[0], v[1], v[2]);
    return std::string(buf);
  };
  const LogprobStream t =
      read_logprob_stream(dir.write("t.jsonl", line(0, 1, t0) + line(1, 0, t1)));
  const LogprobStream r =
      read_logprob_stream(dir.write("r.jsonl", line(0, 1, r0) + line(1, 0, r1)));
  const StreamComparison c = compare_streams(t, r);
  REQUIRE(c.exact_kl);
  double kl0 = 0;
  for (int v = 0; v < 3; ++v) kl0 += std::exp(r0[v]) * (r0[v] - t0[v]);
  // FP64 throughout, the same three terms in the same order: 1e-15 relative.
  CHECK(c.metrics.kl_exact_mean == doctest::Approx(kl0 / 2).epsilon(1e-15));
  CHECK(kl0 > 0);

  // Without a row on one side the exact KL is unavailable, with the reason; the rest stands.
  const LogprobStream bare =
      read_logprob_stream(dir.write("b.jsonl", jsonl({{0, 0, 1, t0[1]}, {0, 1, 0, t1[0]}})));
  const StreamComparison d = compare_streams(bare, r);
  CHECK_FALSE(d.exact_kl);
  CHECK(d.exact_kl_reason == "needs vocab_logprobs in both streams");
  CHECK(d.metrics.kl_exact_mean == 0.0);
}

TEST_CASE("top-k lists: overlap, top-1 agreement and shared entries against a hand count") {
  TempDir dir;
  const std::string t0 = R"({"sequence": 0, "position": 1, "token_id": 1, "logprob": -0.1, )"
                         R"("top_logprobs": {"1": -0.1, "2": -2.0, "3": -3.0}})";
  const std::string r0 = R"({"sequence": 0, "position": 1, "token_id": 1, "logprob": -0.12, )"
                         R"("top_logprobs": [[4, -3.5], [1, -0.12], [2, -1.9]]})";
  const std::string t1 = R"({"sequence": 0, "position": 2, "token_id": 5, "logprob": -0.5, )"
                         R"("top_logprobs": [[5, -0.5], [6, -1.0]]})";
  const std::string r1 = R"({"sequence": 0, "position": 2, "token_id": 5, "logprob": -0.6, )"
                         R"("top_logprobs": [[6, -0.4], [5, -0.6]]})";
  const std::string bare = R"({"sequence": 0, "position": 3, "token_id": 7, "logprob": -1.0})";
  const LogprobStream t =
      read_logprob_stream(dir.write("t.jsonl", t0 + "\n" + t1 + "\n" + bare + "\n"));
  const LogprobStream r =
      read_logprob_stream(dir.write("r.jsonl", r0 + "\n" + r1 + "\n" + bare + "\n"));
  const TopkFigures k = compare_streams(t, r).topk;
  REQUIRE(k.available);
  // Token 1: {1, 2, 3} vs {1, 2, 4}: 2 shared of 4, |Δ| 0.02 and 0.1, the same best id (1).
  // Token 2: {5, 6} both: 2 of 2, |Δ| 0.1 and 0.6, best ids 5 and 6. Token 3 has no lists.
  CHECK(k.tokens == 2);
  CHECK(k.overlap_mean == doctest::Approx(0.75));
  CHECK(k.overlap_min == doctest::Approx(0.5));
  CHECK(k.top1_agreement == doctest::Approx(0.5));
  CHECK(k.common_entries == 4);
  CHECK(k.common_abs_mean == doctest::Approx((0.02 + 0.1 + 0.1 + 0.6) / 4));
  CHECK(k.common_abs_max == doctest::Approx(0.6));
  // A stream against itself: full overlap, same top-1, nothing apart (the control).
  const TopkFigures self = compare_streams(t, t).topk;
  CHECK(self.overlap_min == 1.0);
  CHECK(self.top1_agreement == 1.0);
  CHECK(self.common_abs_max == 0.0);
  // Lists on one side only: unavailable, with the reason.
  const LogprobStream plain = read_logprob_stream(
      dir.write("p.jsonl", jsonl({{0, 1, 1, -0.1}, {0, 2, 5, -0.5}, {0, 3, 7, -1.0}})));
  CHECK(compare_streams(t, plain).topk.reason == "needs top_logprobs in both streams");
  // An id twice in one list is an invalid comparison.
  const std::string twice = R"({"sequence": 0, "position": 1, "token_id": 1, "logprob": -0.1, )"
                            R"("top_logprobs": [[1, -0.1], [1, -0.2]]})";
  CHECK(error_of(dir, twice + "\n", twice + "\n") ==
        "invalid comparison: " + dir.path.string() +
            "/train.jsonl line 1: top-k list names token 1 twice");
  // A vLLM key must be a token id, whole: "7" is read, "x7", "7x", "" and " 7" are refused.
  for (const char* key : {"x7", "7x", "", " 7"}) {
    CAPTURE(key);
    const std::string bad = R"({"sequence": 0, "position": 1, "token_id": 1, "logprob": -0.1, )"
                            R"("top_logprobs": {")" +
                            std::string(key) + R"(": -0.1}})";
    CHECK(error_of(dir, bad + "\n", twice + "\n") ==
          dir.path.string() + "/train.jsonl line 1: \"top_logprobs\" key \"" + key +
              "\" is not a token id");
  }
}

TEST_CASE(".npy columns: integer and float dtypes, and a truncated column refused") {
  TempDir dir;
  const auto npy = [](const std::string& descr, const std::string& shape, const void* data,
                      std::size_t bytes) {
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string out = "\x93NUMPY\x01";
    out += '\0';
    out += static_cast<char>(header.size() & 0xff);
    out += static_cast<char>(header.size() >> 8);
    return out + header + std::string(static_cast<const char*>(data), bytes);
  };
  const std::int64_t seq[3] = {0, 0, 1};
  const std::int32_t pos[3] = {1, 2, 1};
  const std::uint16_t tok[3] = {7, 8, 9};
  const float lp[3] = {-1.5f, -0.25f, -2.0f};
  const bool active[3] = {true, false, true};
  fs::create_directory(dir.path / "cols");
  dir.write("cols/sequence.npy", npy("<i8", "(3,)", seq, sizeof seq));
  dir.write("cols/position.npy", npy("<i4", "(3,)", pos, sizeof pos));
  dir.write("cols/token_id.npy", npy("<u2", "(3,)", tok, sizeof tok));
  dir.write("cols/logprob.npy", npy("<f4", "(3,)", lp, sizeof lp));
  dir.write("cols/active.npy", npy("|b1", "(3,)", active, sizeof active));
  // Top-2 lists, the third row's padded to one entry with -1.
  const std::int64_t top_ids[6] = {7, 3, 8, 2, 9, -1};
  const double top_lp[6] = {-1.5, -2.0, -0.25, -3.0, -2.0, 0.0};
  dir.write("cols/top_ids.npy", npy("<i8", "(3, 2)", top_ids, sizeof top_ids));
  dir.write("cols/top_logprobs.npy", npy("<f8", "(3, 2)", top_lp, sizeof top_lp));
  const LogprobStream s = read_logprob_stream((dir.path / "cols").string());
  CHECK(s.format == "npy");
  CHECK(s.files.size() == 7);
  REQUIRE(s.records.size() == 3);
  CHECK(s.records[1].position == 2);
  CHECK(s.records[2].token_id == 9);
  CHECK(s.records[0].logprob == -1.5);
  CHECK_FALSE(s.records[1].active);
  CHECK(s.where(2) == (dir.path / "cols").string() + " row 2");
  CHECK(s.top_begin == std::vector<std::size_t>{0, 2, 4, 5});
  CHECK(s.top_ids[4] == 9);
  const StreamComparison c = compare_streams(s, s);
  CHECK(c.tokens.size() == 2);
  CHECK(c.inactive == 1);

  dir.write("cols/logprob.npy", npy("<f4", "(3,)", lp, sizeof lp - 2));
  try {
    read_logprob_stream((dir.path / "cols").string());
    FAIL("a truncated column was read");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()) == (dir.path / "cols/logprob.npy").string() +
                                       ": 10 bytes of data, shape (3,) needs 12 (truncated or "
                                       "not this shape)");
  }
  dir.write("cols/logprob.npy", npy("<f4", "(2,)", lp, 8));
  try {
    read_logprob_stream((dir.path / "cols").string());
    FAIL("columns of different lengths were read");
  } catch (const UsageError& e) {
    CHECK(std::string(e.what()).find("shape must be [2] like logprob") != std::string::npos);
  }
}
