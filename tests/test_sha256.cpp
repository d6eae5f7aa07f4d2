#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/util/sha256.h"
#include "metrics/digest.h"
#include "report/json.h"

namespace {

std::string digest_in_pieces(const std::string& data, const std::vector<std::size_t>& cuts) {
  cpd::Sha256 hasher;
  std::size_t begin = 0;
  for (const std::size_t cut : cuts) {
    hasher.update(data.data() + begin, cut - begin);
    begin = cut;
  }
  hasher.update(data.data() + begin, data.size() - begin);
  return cpd::Sha256::hex(hasher.finish());
}

std::string random_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xFF);
  return out;
}

}  // namespace

TEST_CASE("sha256: NIST FIPS 180-4 example vectors") {
  // The empty message, "abc" (one block), the 448-bit two-block message, the 896-bit long
  // message and one million 'a's.
  CHECK(cpd::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(cpd::sha256_hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(cpd::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(
      cpd::sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
                      "nopqklmnopqrlmnopqrsmnopqrstnopqrstu") ==
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(cpd::sha256_hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: lengths around the padding boundaries") {
  // Reference digests of "a" * n from Python's hashlib.
  const std::pair<std::size_t, const char*> cases[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
      {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.first);
    CHECK(cpd::sha256_hex(std::string(c.first, 'a')) == c.second);
  }
}

TEST_CASE("sha256: the digest does not depend on how the input is chunked") {
  const std::string data = random_bytes(10007, 42);
  const std::string whole = cpd::sha256_hex(data);

  std::vector<std::size_t> every_byte;
  for (std::size_t i = 1; i < data.size(); ++i) every_byte.push_back(i);
  CHECK(digest_in_pieces(data, every_byte) == whole);

  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::size_t> cuts;
    std::size_t at = 0;
    while (true) {
      at += rng() % 150;  // includes empty pieces and pieces spanning several blocks
      if (at > data.size()) break;
      cuts.push_back(at);
    }
    CAPTURE(trial);
    CHECK(digest_in_pieces(data, cuts) == whole);
  }
}

TEST_CASE("sha256: finish() is single-use") {
  cpd::Sha256 hasher;
  hasher.update("abc", 3);
  CHECK(cpd::Sha256::hex(hasher.finish()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_THROWS_AS(hasher.finish(), std::logic_error);
  CHECK_THROWS_AS(hasher.update("x", 1), std::logic_error);
}

TEST_CASE("sha256: zero-length updates, including a null pointer") {
  cpd::Sha256 hasher;
  hasher.update(nullptr, 0);
  hasher.update("ab", 2);
  hasher.update(nullptr, 0);
  hasher.update("c", 1);
  CHECK(cpd::Sha256::hex(hasher.finish()) == cpd::sha256_hex("abc"));
}

TEST_CASE("sha256: the extremely long message (1 GiB, a bit length past 2^32)") {
  // The published extremely-long-message vector (2^33 bits: the length's upper word matters):
  // the 64-byte block below 16,777,216 times, fed as 4096 pieces of 256 KiB. Its digest was
  // also checked against Python's hashlib.
  const std::string block = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno";
  REQUIRE(block.size() == 64);
  std::string piece;
  for (int i = 0; i < 4096; ++i) piece += block;
  cpd::Sha256 hasher;
  for (int i = 0; i < 4096; ++i) hasher.update(piece.data(), piece.size());
  CHECK(cpd::Sha256::hex(hasher.finish()) ==
        "50e72a0e26442fe2552dc3938ac58658228c0cbfb1d2ca872ae435266fcd055e");
}

TEST_CASE("sha256: digests of compact JSON partition lists") {
  auto partitions = [](std::int64_t total, std::int64_t parts) {
    cpd::json::Value list = cpd::json::Value::array();
    for (std::int64_t i = 0; i < parts; ++i) {
      cpd::json::Value range = cpd::json::Value::array();
      range.push_back(i * total / parts);
      range.push_back((i + 1) * total / parts);
      list.push_back(std::move(range));
    }
    return cpd::json::to_string(list, /*pretty=*/false);
  };
  const std::string two = partitions(16, 2);
  const std::string four = partitions(16, 4);
  REQUIRE(two == "[[0,8],[8,16]]");
  REQUIRE(four == "[[0,4],[4,8],[8,12],[12,16]]");
  CHECK(cpd::sha256_hex(two).starts_with("c7b6a36e348bc195"));
  CHECK(cpd::sha256_hex(four).starts_with("bae9b987400665a4"));
}

TEST_CASE("tensor digests: hashed on rank 0 alone, the same as streamed, in both formats") {
  // Three segments held by rank 0, the middle one longer than the BF16 patterns' staging
  // piece: local_digest (which run_recorder runs on several tensors at once, on the pool) must
  // equal stream_digest and the SHA-256 of the bytes written out by hand: the FP32 values, or
  // each value's BF16 pattern rounded to nearest even.
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> values(40000);
  for (float& x : values) x = dist(rng);
  cpd::GlobalTensor t;
  for (const auto& [begin, end] :
       {std::pair<std::size_t, std::size_t>{0, 1}, {1, 30000}, {30000, 40000}})
    t.segments.push_back(cpd::StreamSegment{0, values.data() + begin, end - begin});
  std::vector<std::uint16_t> bf16;
  for (const float x : values) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    bf16.push_back(static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
  }
  cpd::Sha256 fp32_bytes, bf16_bytes;
  fp32_bytes.update(values.data(), values.size() * sizeof(float));
  bf16_bytes.update(bf16.data(), bf16.size() * sizeof(std::uint16_t));
  const std::string want_fp32 = cpd::Sha256::hex(fp32_bytes.finish());
  const std::string want_bf16 = cpd::Sha256::hex(bf16_bytes.finish());

  REQUIRE(cpd::held_by_root(t));
  CHECK(cpd::local_digest(t, cpd::DigestFormat::fp32) == want_fp32);
  CHECK(cpd::local_digest(t, cpd::DigestFormat::bf16) == want_bf16);
  const cpd::LocalCollectives one;
  CHECK(cpd::stream_digest(one, t, cpd::DigestFormat::fp32) == want_fp32);
  CHECK(cpd::stream_digest(one, t, cpd::DigestFormat::bf16) == want_bf16);
  t.segments[1].owner = 1;
  CHECK_FALSE(cpd::held_by_root(t));
}
