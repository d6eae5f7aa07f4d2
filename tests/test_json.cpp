#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "report/json.h"

using cpd::json::Value;

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A fresh, empty directory per test, removed again afterwards.
struct ScratchDir {
  fs::path path;
  ScratchDir() {
    static int serial = 0;
    path = fs::temp_directory_path() /
           ("cpd_json_test." + std::to_string(::getpid()) + "." + std::to_string(serial++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
};

}  // namespace

// Pointers and characters must not slip into bool or integer constructors.
static_assert(!std::is_constructible_v<Value, int*>);
static_assert(!std::is_constructible_v<Value, char>);
static_assert(std::is_constructible_v<Value, std::size_t>);
static_assert(std::is_constructible_v<Value, float>);

TEST_CASE("json: construction from the usual C++ types") {
  CHECK(Value().is_null());
  CHECK(Value(nullptr).is_null());
  CHECK(Value(true).as_bool());
  CHECK(Value(-3).as_int64() == -3);
  CHECK(Value(7L).type() == cpd::json::Type::int64);
  CHECK(Value(7LL).type() == cpd::json::Type::int64);
  CHECK(Value(std::int8_t{-5}).as_int64() == -5);
  CHECK(Value(7u).type() == cpd::json::Type::int64);
  CHECK(Value(std::size_t{7}) == Value(7));
  CHECK(Value(std::numeric_limits<std::uint64_t>::max()).type() == cpd::json::Type::uint64);
  CHECK(Value(0.5f).as_double() == 0.5);
  CHECK(Value(2.5).as_double() == 2.5);
  CHECK(Value(4).as_double() == 4.0);
  CHECK(Value("c").as_string() == "c");
  CHECK(Value(std::string("s")).as_string() == "s");
  CHECK(Value(std::string_view("v")).as_string() == "v");

  Value obj = Value::object();
  obj["n"] = 1;
  obj["list"] = Value::array();
  obj["list"].push_back("x");
  obj.at("list").push_back(false);
  CHECK(obj.size() == 2);
  CHECK(obj.contains("n"));
  CHECK_FALSE(obj.contains("m"));
  CHECK(obj.at("list").at(1) == Value(false));
  CHECK_THROWS_AS(obj.at("m"), std::out_of_range);
  CHECK_THROWS_AS(obj.at("list").at(2), std::out_of_range);
  CHECK_THROWS_AS(obj.at("n").as_string(), std::runtime_error);
  CHECK_THROWS_AS(Value(1).push_back(2), std::runtime_error);
  CHECK_THROWS_AS(Value(-1).as_uint64(), std::runtime_error);
}

TEST_CASE("json: keys are sorted by byte order at every depth") {
  Value a = Value::object();
  a["b"] = 1;
  a["B"] = 2;
  a["a"] = Value::object();
  a["a"]["z"] = 1;
  a["a"]["_"] = 2;
  a["a"]["y"] = Value::array();
  a["a"]["y"].push_back(Value::object());
  a["a"]["y"].at(0)["d"] = 1;
  a["a"]["y"].at(0)["c"] = 2;

  Value b = Value::object();
  b["a"] = Value::object();
  b["a"]["y"] = Value::array();
  b["a"]["y"].push_back(Value::object());
  b["a"]["y"].at(0)["c"] = 2;
  b["a"]["y"].at(0)["d"] = 1;
  b["a"]["_"] = 2;
  b["a"]["z"] = 1;
  b["B"] = 2;
  b["b"] = 1;

  const std::string expected = R"({"B":2,"a":{"_":2,"y":[{"c":2,"d":1}],"z":1},"b":1})";
  CHECK(cpd::json::to_string(a, false) == expected);
  CHECK(cpd::json::to_string(b, false) == expected);
}

TEST_CASE("json: pretty output matches Python's json.dumps(indent=2, sort_keys=True)") {
  Value inner = Value::object();
  inner["y"] = nullptr;
  inner["x"] = true;
  Value b = Value::array();
  b.push_back(1);
  b.push_back(2);
  b.push_back(inner);
  Value zeta = Value::object();
  zeta["b"] = b;
  zeta["a"] = "s\"q";
  Value list = Value::array();
  list.push_back(Value::array());
  list.push_back(Value(cpd::json::Array{Value(1)}));

  Value root = Value::object();
  root["zeta"] = zeta;
  root["alpha"] = Value::array();
  root["empty"] = Value::object();
  root["n"] = -7;
  root["big"] = std::numeric_limits<std::uint64_t>::max();
  root["list"] = list;

  // print(repr(json.dumps(d, indent=2, sort_keys=True) + "\n")) for the same data in Python.
  const std::string python =
      "{\n  \"alpha\": [],\n  \"big\": 18446744073709551615,\n  \"empty\": {},\n  \"list\": [\n"
      "    [],\n    [\n      1\n    ]\n  ],\n  \"n\": -7,\n  \"zeta\": {\n    \"a\": \"s\\\"q\",\n"
      "    \"b\": [\n      1,\n      2,\n      {\n        \"x\": true,\n        \"y\": null\n"
      "      }\n    ]\n  }\n}\n";
  CHECK(cpd::json::to_string(root) == python);
  CHECK(cpd::json::to_string(Value(3)) == "3\n");
  CHECK(cpd::json::to_string(Value(3), false) == "3");
}

TEST_CASE("json: integers stay integers, doubles stay doubles") {
  CHECK(cpd::json::to_string(Value(3), false) == "3");
  CHECK(cpd::json::to_string(Value(3.0), false) == "3.0");
  CHECK(cpd::json::to_string(Value(0.1), false) == "0.1");
  CHECK(cpd::json::parse("3").type() == cpd::json::Type::int64);
  CHECK(cpd::json::parse("-9223372036854775808").as_int64() ==
        std::numeric_limits<std::int64_t>::min());
  CHECK(cpd::json::parse("18446744073709551615").as_uint64() ==
        std::numeric_limits<std::uint64_t>::max());
  CHECK(cpd::json::parse("18446744073709551616").type() == cpd::json::Type::floating);
  CHECK(cpd::json::parse("3.0").type() == cpd::json::Type::floating);
  CHECK(cpd::json::parse("1e2").type() == cpd::json::Type::floating);
}

TEST_CASE("json: parse(to_string(v)) == v") {
  Value v = Value::object();
  v["ints"] = cpd::json::Array{Value(0), Value(-1), Value(std::numeric_limits<std::int64_t>::min()),
                               Value(std::numeric_limits<std::uint64_t>::max())};
  const double doubles[] = {0.1,     1.0 / 3.0,     -0.0,
                            1e300,   5e-324,        2.2250738585072014e-308,
                            1.5e-10, 123456789.125, std::numeric_limits<double>::max()};
  v["doubles"] = Value::array();
  for (const double d : doubles) v["doubles"].push_back(d);
  v["strings"] =
      cpd::json::Array{Value(""), Value("tab\there \"q\" \\ /"), Value(std::string("nul\0byte", 8)),
                       Value("\xc3\xa9\xe2\x82\xac"), Value("\x01\x1f")};
  v["nested"] = Value::object();
  v["nested"]["empty_array"] = Value::array();
  v["nested"]["empty_object"] = Value::object();
  v["nested"]["null"] = nullptr;
  v["nested"]["flags"] = cpd::json::Array{Value(true), Value(false)};

  for (const bool pretty : {true, false}) {
    CAPTURE(pretty);
    const Value back = cpd::json::parse(cpd::json::to_string(v, pretty));
    CHECK(back == v);
    // operator== treats -0.0 == 0.0, so check the bits: the round trip must be exact.
    for (std::size_t i = 0; i < std::size(doubles); ++i) {
      CHECK(std::bit_cast<std::uint64_t>(back.at("doubles").at(i).as_double()) ==
            std::bit_cast<std::uint64_t>(doubles[i]));
    }
  }
}

TEST_CASE("json: non-finite numbers throw and name their path") {
  Value report = Value::object();
  report["cases"] = Value::array();
  for (int i = 0; i < 5; ++i) {
    Value c = Value::object();
    c["drift"] = Value::object();
    c["drift"]["cp_merge_fp32"] = Value::object();
    c["drift"]["cp_merge_fp32"]["out"] = Value::object();
    c["drift"]["cp_merge_fp32"]["out"]["max_abs"] = 0.5;
    report["cases"].push_back(c);
  }
  report["cases"].at(3)["drift"]["cp_merge_fp32"]["out"]["max_abs"] = std::nan("");
  report["cases"].at(4)["drift"]["cp_merge_fp32"]["out"]["max_abs"] = HUGE_VAL;

  for (const bool pretty : {true, false}) {
    try {
      (void)cpd::json::to_string(report, pretty);
      FAIL("expected std::invalid_argument");
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      CAPTURE(message);
      CHECK(message.find(" cases[3].drift.cp_merge_fp32.out.max_abs") != std::string::npos);
    }
  }
  CHECK_THROWS_WITH_AS(cpd::json::to_string(Value(-INFINITY)), doctest::Contains("<root>"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(cpd::json::to_string(Value(cpd::json::Array{Value(1), Value(NAN)})),
                       doctest::Contains("[1]"), std::invalid_argument);
}

TEST_CASE("json: parse errors report the offset") {
  CHECK_THROWS_WITH_AS(cpd::json::parse(R"({"a": })"), doctest::Contains("offset 6"),
                       std::runtime_error);
  CHECK_THROWS_AS(cpd::json::parse("1 2"), std::runtime_error);
  CHECK_THROWS_AS(cpd::json::parse("NaN"), std::runtime_error);
  CHECK_THROWS_AS(cpd::json::parse(""), std::runtime_error);
  // The view need not be NUL-terminated.
  const std::string text = "[1,2]garbage";
  CHECK(cpd::json::parse(std::string_view(text).substr(0, 5)).size() == 2);
}

TEST_CASE("json: write_file_atomic replaces the file and leaves nothing else behind") {
  ScratchDir dir;
  const fs::path target = dir.path / "report.json";
  cpd::json::write_file_atomic(target.string(), "first\n");
  CHECK(read_file(target) == "first\n");
  cpd::json::write_file_atomic(target.string(), "second, longer content\n");
  CHECK(read_file(target) == "second, longer content\n");
  cpd::json::write_file_atomic(target.string(), "");
  CHECK(read_file(target).empty());

  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path)) {
    CAPTURE(entry.path().string());
    CHECK(entry.path() == target);
    ++entries;
  }
  CHECK(entries == 1);
}

TEST_CASE("json: write_file_atomic into a missing directory throws a clear message") {
  ScratchDir dir;
  const std::string target = (dir.path / "missing" / "report.json").string();
  try {
    cpd::json::write_file_atomic(target, "x");
    FAIL("expected std::runtime_error");
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(message.find(target) != std::string::npos);
    CHECK(message.find("No such file or directory") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir.path / "missing"));
}

TEST_CASE("json: numbers read correctly rounded, where RapidJSON 1.1.0's full precision misreads") {
  // The fuzzer's finding and its relatives (Tencent/rapidjson#1249, #1441): exact values.
  CHECK(cpd::json::parse("0e308").as_double() == 0.0);
  CHECK(cpd::json::parse("[0e100]").at(0).as_double() == 0.0);
  CHECK(cpd::json::parse("0.0000000000000000000000000000").as_double() == 0.0);
  CHECK(cpd::json::parse("0.184467440737095516159").as_double() == 0.18446744073709551);
  CHECK(cpd::json::parse("-0.01234567890").as_double() == -0.0123456789);
  CHECK(cpd::json::parse("2.220446049250313e-16").as_double() == 2.220446049250313e-16);
  // Integers stay integers; past uint64 they become the nearest double.
  CHECK(cpd::json::parse("-9223372036854775808").as_int64() == INT64_MIN);
  CHECK(cpd::json::parse("18446744073709551615").as_uint64() == UINT64_MAX);
  CHECK(cpd::json::parse("123456789012345678901234567890").as_double() == 1.2345678901234568e29);
  // Underflow is the nearest value; overflow is refused.
  CHECK(cpd::json::parse("1e-400").as_double() == 0.0);
  CHECK(cpd::json::parse("4.9e-324").as_double() == 4.9406564584124654e-324);
  CHECK_THROWS_WITH_AS(cpd::json::parse("[1e400]"), doctest::Contains("too big"),
                       std::runtime_error);
  // Past the largest double with an exponent RapidJSON lets through: refused by the builder.
  CHECK_THROWS_WITH_AS(cpd::json::parse("[1.8e308]"), doctest::Contains("too big for a double"),
                       std::runtime_error);
  // Every double of a sweep of magnitudes reads back bit-identical from what to_string wrote.
  for (double x = 1e-300; x < 1e300; x *= 7.3) {
    const double y = -x / 3;
    CHECK(cpd::json::parse(cpd::json::to_string(cpd::json::Value(y))).as_double() == y);
  }
}

TEST_CASE("json: a document nested past 512 levels is refused, not a stack overflow") {
  const std::string deep = std::string(513, '[') + std::string(513, ']');
  CHECK_THROWS_WITH_AS(cpd::json::parse(deep), doctest::Contains("nested deeper than 512"),
                       std::runtime_error);
  const std::string fits = std::string(512, '[') + std::string(512, ']');
  CHECK(cpd::json::parse(fits).is_array());
  CHECK_THROWS_AS(cpd::json::parse(std::string(200000, '[')), std::runtime_error);
}
