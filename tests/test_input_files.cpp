// --inputs: files written here — safetensors and .npy byte by byte, HDF5 with cpdrift's own dump
// writer — read back through generate_shard: the stored values exactly (FP16 and BF16 widened
// as an independent decoder here says), any slice equal to the same slice of the whole, RoPE
// applied to pre-RoPE files exactly as to generated inputs, and every malformed file refused
// with one line naming it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cli/options.h"
#include "core/errors.h"
#include "core/util/sha256.h"
#include "cpdrift/bf16.h"
#include "cpdrift/rope.h"
#include "inputs/input_files.h"
#include "io/tensor_dump.h"
#include "kernels/cpu/inputs.h"
#include "kernels/layer_weights.h"
#include "temp_dir.h"

using namespace cpd;
namespace fs = std::filesystem;

namespace {

constexpr int kSeq = 24, kBatch = 2, kDim = 128;

struct TempDir : cpd::testing::TempDir {
  TempDir() : cpd::testing::TempDir("cpdrift_inputs") {}
};

// The generator's whole tensor, [B][H][S][D] (FP32; RoPE as `problem` says).
Shard whole(const Problem& p, TensorId t) {
  ThreadPool pool(1);
  return generate_shard(p, t, {p.batch, Range{0, heads_of(p.dims, t)}, {Range{0, p.seq_len}}, kDim},
                        InputPrecision::fp32, pool);
}

// Stored bytes of `x` as `dtype`: F32 as is, BF16 by rounding (round_bf16 is exact to 16 bits),
// F16 only for the values this test gives it (exactly representable).
std::string encode(std::span<const float> x, const std::string& dtype) {
  std::string out;
  for (const float v : x) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
    if (dtype == "F32") {
      out.append(reinterpret_cast<const char*>(&bits), 4);
    } else if (dtype == "BF16") {
      const std::uint16_t h =
          static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(round_bf16(v)) >> 16);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

std::string safetensors(const std::vector<std::pair<std::string, std::string>>& tensors,
                        const std::vector<std::string>& headers, const std::string& metadata) {
  std::string json = "{";
  std::string data;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    json += "\"" + tensors[i].first + "\": {" + headers[i] + ", \"data_offsets\": [" +
            std::to_string(data.size()) + ", " +
            std::to_string(data.size() + tensors[i].second.size()) + "]}, ";
    data += tensors[i].second;
  }
  json += "\"__metadata__\": " + metadata + "}";
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + data;
}

// A safetensors file of the generator's q, k, v in `dtype`, RoPE as `p` says.
std::string write_safetensors(const TempDir& dir, const Problem& p, const std::string& dtype,
                              const std::string& name = "in.safetensors") {
  std::vector<std::pair<std::string, std::string>> t;
  std::vector<std::string> h;
  for (const auto& [id, n] :
       {std::pair{TensorId::q, "q"}, std::pair{TensorId::k, "k"}, std::pair{TensorId::v, "v"}}) {
    t.emplace_back(n, encode(whole(p, id).data, dtype));
    h.push_back("\"dtype\": \"" + dtype + "\", \"shape\": [" + std::to_string(p.batch) + ", " +
                std::to_string(heads_of(p.dims, id)) + ", " + std::to_string(p.seq_len) + ", 128]");
  }
  return dir.write(
      name, safetensors(
                t, h, std::string("{\"rope_applied\": \"") + (p.rope ? "true" : "false") + "\"}"));
}

Problem problem() {
  Problem p;
  p.batch = kBatch;
  p.seq_len = kSeq;
  return p;
}

// generate_shard over `shape` with the file's inputs.
Shard read(const std::string& path, TensorId t, const ShardShape& shape,
           InputPrecision prec = InputPrecision::fp32) {
  Problem p = problem();
  p.inputs = open_input_file(path, p.dims, false, true);
  REQUIRE(p.inputs->info().batch == kBatch);
  REQUIRE(p.inputs->info().seq_len == kSeq);
  ThreadPool pool(2);
  return generate_shard(p, t, shape, prec, pool);
}

std::string error_of(const std::string& path) {
  try {
    open_input_file(path, ModelDims{}, false, false);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("safetensors F32 after RoPE: the generator's tensors back bit for bit, any slice") {
  TempDir dir;
  const Problem p = problem();
  const std::string path = write_safetensors(dir, p, "F32");
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    CAPTURE(static_cast<int>(t));
    const int heads = heads_of(p.dims, t);
    CHECK(same_bits(read(path, t, {kBatch, Range{0, heads}, {Range{0, kSeq}}, kDim}).data,
                    whole(p, t).data));
    // A process's slice: some heads, two token ranges.
    const ShardShape slice{kBatch, Range{1, 3}, {Range{2, 7}, Range{15, 24}}, kDim};
    ThreadPool pool(1);
    CHECK(same_bits(read(path, t, slice).data,
                    generate_shard(p, t, slice, InputPrecision::fp32, pool).data));
    // BF16 paths round the file's values as they round generated ones.
    CHECK(same_bits(read(path, t, slice, InputPrecision::bf16).data,
                    generate_shard(p, t, slice, InputPrecision::bf16, pool).data));
  }
  const Problem with = [&] {
    Problem q = p;
    q.inputs = open_input_file(path, p.dims, false, true);
    return q;
  }();
  CHECK(with.inputs->info().format == "safetensors");
  CHECK(with.inputs->info().dtype == "float32");
  CHECK(with.inputs->info().rope_applied);
  CHECK(with.inputs->info().sha256.size() == 64);
  CHECK(shared_prompt_len(with) == 0);  // a file's sequences share nothing by assumption
  CHECK(shared_prompt_len(p) > 0);      // the generator's do (control)
}

TEST_CASE("pre-RoPE files get cpdrift's RoPE: equal to generating with RoPE") {
  TempDir dir;
  Problem pre = problem();
  pre.rope = false;  // the file holds the normals before any rotation
  const std::string path = write_safetensors(dir, pre, "F32");
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const ShardShape all{kBatch, Range{0, heads_of(pre.dims, t)}, {Range{0, kSeq}}, kDim};
    CHECK(same_bits(read(path, t, all).data, whole(problem(), t).data));
  }
  // Negative control: the rotation did happen (q differs from the stored pre-RoPE values).
  const ShardShape all{kBatch, Range{0, 32}, {Range{0, kSeq}}, kDim};
  CHECK_FALSE(same_bits(read(path, TensorId::q, all).data, whole(pre, TensorId::q).data));
}

TEST_CASE("BF16 and FP16 storage widen exactly; positions drive RoPE") {
  TempDir dir;
  const Problem p = problem();
  const std::string path = write_safetensors(dir, p, "BF16");
  const ShardShape all{kBatch, Range{0, 8}, {Range{0, kSeq}}, kDim};
  FloatBuffer want = whole(p, TensorId::k).data;
  for (float& x : want) x = round_bf16(x);
  CHECK(same_bits(read(path, TensorId::k, all).data, want));

  // FP16: values chosen to cover normals, a subnormal (2^-24), zero signs and the largest.
  const float values[] = {1.5f,  -2.0f, 65504.0f,       std::ldexp(1.0f, -24),
                          -0.0f, 0.0f,  0.333251953125f};
  const std::uint16_t halves[] = {0x3e00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x0000, 0x3555};
  const std::size_t n = std::size_t{kBatch} * 32 * kSeq * kDim;
  std::string q16, kv16;
  for (std::size_t i = 0; i < n; ++i) q16.append(reinterpret_cast<const char*>(&halves[i % 7]), 2);
  for (std::size_t i = 0; i < n / 4; ++i)
    kv16.append(reinterpret_cast<const char*>(&halves[i % 7]), 2);
  const std::string shape_q = "\"dtype\": \"F16\", \"shape\": [2, 32, 24, 128]";
  const std::string shape_kv = "\"dtype\": \"F16\", \"shape\": [2, 8, 24, 128]";
  std::vector<std::int64_t> pos(kBatch * kSeq);
  // Sequence b's token s sits at position 100 + 50·b + s.
  for (std::size_t i = 0; i < pos.size(); ++i)
    pos[i] = static_cast<std::int64_t>(i % kSeq + 100 + 50 * (i / kSeq));
  const std::string pos_bytes(reinterpret_cast<const char*>(pos.data()), pos.size() * 8);
  const std::string f16 =
      dir.write("f16.safetensors",
                safetensors({{"q", q16}, {"k", kv16}, {"v", kv16}, {"positions", pos_bytes}},
                            {shape_q, shape_kv, shape_kv, "\"dtype\": \"I64\", \"shape\": [2, 24]"},
                            "{\"rope_applied\": \"1\"}"));
  const Shard v = read(f16, TensorId::v, all);
  bool exact = true;
  for (std::size_t i = 0; i < v.data.size(); ++i)
    exact = exact &&
            std::bit_cast<std::uint32_t>(v.data[i]) == std::bit_cast<std::uint32_t>(values[i % 7]);
  CHECK(exact);

  // The same file before RoPE: q rotated at the positions the file gives, not at the token index.
  const std::string pre =
      dir.write("f16pre.safetensors",
                safetensors({{"q", q16}, {"k", kv16}, {"v", kv16}, {"positions", pos_bytes}},
                            {shape_q, shape_kv, shape_kv, "\"dtype\": \"I64\", \"shape\": [2, 24]"},
                            "{\"rope_applied\": \"false\"}"));
  const Shard q = read(pre, TensorId::q, {2, Range{0, 1}, {Range{5, 6}}, kDim});
  std::vector<float> row(kDim);
  // Element (b 1, h 0, s 5, d) of q is number ((1·32 + 0)·24 + 5)·128 + d in the file; its
  // position 155.
  for (int d = 0; d < kDim; ++d) row[d] = values[((32 * 24 + 5) * kDim + d) % 7];
  const std::vector<float> inv = rope_inv_freq(ModelDims{});
  for (int i = 0; i < 64; ++i) {
    float c, s;
    rope_cos_sin(155, inv[i], c, s);
    rope_rotate_pair(row[i], row[i + 64], c, s);
  }
  CHECK(same_bits(std::vector<float>(q.at(1, 0, 0), q.at(1, 0, 0) + kDim), row));
}

TEST_CASE(".npy directory and HDF5 (cpdrift's own dump writer): the same tensors") {
  TempDir dir;
  const Problem p = problem();
  // .npy: float32 q, k, v and inputs.json.
  fs::create_directory(dir.path / "npy");
  std::string qkv;  // the three files' bytes, one after the other
  for (const auto& [id, n] :
       {std::pair{TensorId::q, "q"}, std::pair{TensorId::k, "k"}, std::pair{TensorId::v, "v"}}) {
    const Shard s = whole(p, id);
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, " +
                         std::to_string(heads_of(p.dims, id)) + ", 24, 128), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = "\x93NUMPY\x01";
    bytes += '\0';
    bytes += static_cast<char>(header.size());
    bytes += '\0';
    bytes += header + std::string(reinterpret_cast<const char*>(s.data.data()), s.data.size() * 4);
    dir.write(std::string("npy/") + n + ".npy", bytes);
    qkv += bytes;
  }
  const std::string npy = (dir.path / "npy").string();
  CHECK(error_of(npy) == npy +
                             ": no inputs.json saying {\"rope_applied\": true|false} (are q and "
                             "k stored after RoPE?)");
  dir.write("npy/inputs.json", "{\"rope_applied\": true}");
  const ShardShape all{kBatch, Range{0, 32}, {Range{0, kSeq}}, kDim};
  CHECK(same_bits(read(npy, TensorId::q, all).data, whole(p, TensorId::q).data));
  // The fingerprint covers every file the inputs come from: inputs.json, then q, k, v.
  const auto info = [&] { return open_input_file(npy, p.dims, false, true)->info(); };
  const std::string json = "{\"rope_applied\": true}";
  CHECK(info().sha256 == sha256_hex(json + qkv));
  CHECK(info().size_bytes == json.size() + qkv.size());
  dir.write("npy/inputs.json", "{\"rope_applied\":  true}");  // the same meaning, other bytes
  CHECK(info().sha256 == sha256_hex("{\"rope_applied\":  true}" + qkv));
  CHECK(info().sha256 != sha256_hex(json + qkv));

  if (!dump_supported()) return;
  // HDF5: /inputs/{q,k,v} as --dump-inputs writes them.
  const std::string h5 = (dir.path / "in.h5").string();
  {
    std::unique_ptr<TensorDump> dump = open_tensor_dump(h5);
    for (const auto& [id, n] :
         {std::pair{TensorId::q, "q"}, std::pair{TensorId::k, "k"}, std::pair{TensorId::v, "v"}}) {
      const int heads = heads_of(p.dims, id);
      const Shard s = whole(p, id);
      dump->begin(std::string("/inputs/") + n, {kBatch, heads, kSeq, kDim},
                  {{"rope_applied", std::int64_t{id == TensorId::v ? 0 : 1}}});
      for (int b = 0; b < kBatch; ++b) {
        for (int h = 0; h < heads; ++h)
          dump->write(GlobalPiece{b, h, Range{0, kSeq}, 0}, s.at(b, h, 0));
      }
      dump->end();
    }
    dump->commit();
  }
  CHECK(same_bits(read(h5, TensorId::q, all).data, whole(p, TensorId::q).data));
  const ShardShape slice{kBatch, Range{3, 5}, {Range{1, 2}, Range{20, 24}}, kDim};
  ThreadPool pool(1);
  CHECK(same_bits(read(h5, TensorId::k, slice).data,
                  generate_shard(p, TensorId::k, slice, InputPrecision::fp32, pool).data));
}

TEST_CASE("--inputs: one parse, then the file's B and S settle what needs the sequence") {
  TempDir dir;
  const std::string path = write_safetensors(dir, problem(), "F32");
  const auto usage_error = [](const auto& work) {
    try {
      work();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Split 20 and 24 rows a round: past the generator's default 16 tokens, within the file's 24.
  for (const char* command : {"run", "plan"}) {
    CAPTURE(command);
    CommandLine cl = parse_command_line(
        {command, "--inputs", path, "--kv-chunk-sizes", "none,20", "--round-rows", "24"});
    RunOptions& run = cl.command == CommandLine::Command::run ? cl.run : cl.plan.run;
    CHECK(run.request.problem.inputs == nullptr);
    const auto source = open_input_file(path, ModelDims{}, false, false);
    use_input_file(run, source);
    CHECK(run.request.problem.batch == kBatch);
    CHECK(run.request.problem.seq_len == kSeq);
    CHECK(run.request.problem.inputs == source);
  }
  // What the file's 24 tokens refuse: only once they are known.
  for (const auto& [flag, value, says] :
       {std::tuple{"--kv-chunk-sizes", "24",
                   "--kv-chunk-sizes 24: not shorter than the sequence "
                   "(24 tokens), so it cuts nothing"},
        std::tuple{"--round-rows", "25", "--round-rows: must be from 1 to 24"}}) {
    CAPTURE(flag);
    CommandLine cl = parse_command_line({"--inputs", path, flag, value});
    const std::string error = usage_error(
        [&] { use_input_file(cl.run, open_input_file(path, ModelDims{}, false, false)); });
    CHECK(error.rfind(says, 0) == 0);
  }
  // Negative control: without --inputs the generator's 16 tokens refuse the split at once.
  CHECK(usage_error([] {
          parse_command_line({"--kv-chunk-sizes", "none,20"});
        }).find("--kv-chunk-sizes 20: not shorter than the sequence (16 tokens)") == 0);
}

TEST_CASE("malformed input files: one line naming the file and what is wrong") {
  TempDir dir;
  const Problem p = problem();
  const std::string good = write_safetensors(dir, p, "F32", "good.safetensors");
  CHECK(error_of(good).empty());  // the control
  const std::string bytes = [&] {
    std::ifstream in(good, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  const std::string cut = dir.write("cut.safetensors", bytes.substr(0, bytes.size() - 100));
  CHECK(error_of(cut).find(cut + ": tensor v: ends at byte") == 0);

  const std::string kv = "\"dtype\": \"F32\", \"shape\": [1, 8, 4, 128]";
  const std::string zeros8(8 * 4 * 128 * 4, '\0');
  const std::string q16(16 * 4 * 128 * 4, '\0');
  const std::string heads = dir.write(
      "heads.safetensors", safetensors({{"q", q16}, {"k", zeros8}, {"v", zeros8}},
                                       {"\"dtype\": \"F32\", \"shape\": [1, 16, 4, 128]", kv, kv},
                                       "{\"rope_applied\": \"true\"}"));
  CHECK(error_of(heads) == heads + ": q has shape [1, 16, 4, 128]; qwen3-8b needs [B, 32, S, 128]");
  const std::string q32(32 * 4 * 128 * 4, '\0');
  const std::string qshape = "\"dtype\": \"F32\", \"shape\": [1, 32, 4, 128]";
  const std::string norope =
      dir.write("norope.safetensors",
                safetensors({{"q", q32}, {"k", zeros8}, {"v", zeros8}}, {qshape, kv, kv}, "{}"));
  CHECK(error_of(norope).find("__metadata__ must say \"rope_applied\"") != std::string::npos);
  const std::string i8 = dir.write(
      "i8.safetensors", safetensors({{"q", q32}, {"k", zeros8}, {"v", zeros8}},
                                    {"\"dtype\": \"I8\", \"shape\": [1, 32, 4, 128]", kv, kv},
                                    "{\"rope_applied\": \"true\"}"));
  CHECK(error_of(i8) == i8 + ": tensor q: dtype I8 (reads F32, F16 and BF16)");
  const std::string shortv =
      dir.write("shortv.safetensors",
                safetensors({{"q", q32}, {"k", zeros8}, {"v", zeros8}},
                            {qshape, kv, "\"dtype\": \"F32\", \"shape\": [1, 8, 3, 128]"},
                            "{\"rope_applied\": \"true\"}"));
  CHECK(error_of(shortv) ==
        shortv + ": v has shape [1, 8, 3, 128]; qwen3-8b needs [B, 8, S, 128] with q's B and S");
  const std::string garbage = dir.write("garbage.bin", "hello world, not a tensor file");
  CHECK(error_of(garbage).find(garbage + ": not HDF5, safetensors or a .npy directory") == 0);
  CHECK(error_of((dir.path / "missing").string()) ==
        "--inputs " + (dir.path / "missing").string() + ": no such file or directory");
}

TEST_CASE(
    "the layer's hidden states from a file: its rows exactly, and the generator's q when "
    "it holds the generator's rows") {
  TempDir dir;
  Problem gen = problem();
  gen.layer = true;
  const std::int64_t hidden = gen.dims.hidden_size;
  std::vector<float> x(static_cast<std::size_t>(kBatch * kSeq * hidden));
  for (int b = 0; b < kBatch; ++b)
    layer_hidden_rows(gen, b, Range{0, kSeq}, x.data() + b * kSeq * hidden);
  const std::string shape = "\"shape\": [" + std::to_string(kBatch) + ", " + std::to_string(kSeq) +
                            ", " + std::to_string(hidden) + "]";
  const std::string path = dir.write(
      "hidden.safetensors",
      safetensors({{"hidden", encode(x, "BF16")}}, {"\"dtype\": \"BF16\", " + shape}, "{}"));
  Problem file = gen;
  file.inputs = open_input_file(path, gen.dims, true, true);
  CHECK(file.inputs->info().hidden);
  CHECK(file.inputs->info().dtype == "bfloat16");
  CHECK(file.inputs->info().seq_len == kSeq);
  // Rows 5..11 of sequence 1: the stored values (BF16-valued, so exact).
  std::vector<float> rows(static_cast<std::size_t>(7 * hidden));
  layer_hidden_rows(file, 1, Range{5, 12}, rows.data());
  CHECK(same_bits(rows, std::span<const float>(x).subspan(
                            static_cast<std::size_t>((kSeq + 5) * hidden), rows.size())));
  // A process's slice of q (projection, q_norm, RoPE, BF16): the generator's bits.
  const ShardShape slice{kBatch, Range{1, 3}, {Range{2, 7}, Range{15, 24}}, kDim};
  ThreadPool pool(2);
  CHECK(same_bits(generate_shard(file, TensorId::q, slice, InputPrecision::bf16, pool).data,
                  generate_shard(gen, TensorId::q, slice, InputPrecision::bf16, pool).data));
  // The control: one value changed in the file changes the projection's bits.
  x[static_cast<std::size_t>((kSeq + 3) * hidden + 17)] += 0.5f;
  const std::string other = dir.write(
      "other.safetensors",
      safetensors({{"hidden", encode(x, "BF16")}}, {"\"dtype\": \"BF16\", " + shape}, "{}"));
  Problem changed = gen;
  changed.inputs = open_input_file(other, gen.dims, true, false);
  CHECK(!same_bits(generate_shard(changed, TensorId::q, slice, InputPrecision::bf16, pool).data,
                   generate_shard(gen, TensorId::q, slice, InputPrecision::bf16, pool).data));

  // The wrong kind of file, either way: one line saying which --scope reads it.
  const auto refused = [&](const std::string& f, bool layer) {
    try {
      open_input_file(f, gen.dims, layer, false);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused(path, false) ==
        path + ": no q, k, v (this file holds the layer's hidden states: add --scope layer)");
  const std::string core = write_safetensors(dir, problem(), "F32", "core.safetensors");
  CHECK(refused(core, true).find(core + ": no hidden [B, S, hidden]") == 0);
  const std::string narrow = dir.write(
      "narrow.safetensors", safetensors({{"hidden", std::string(2 * 16 * 64 * 4, '\0')}},
                                        {"\"dtype\": \"F32\", \"shape\": [2, 16, 64]"}, "{}"));
  CHECK(refused(narrow, true) ==
        narrow + ": hidden has shape [2, 16, 64]; qwen3-8b needs [B, S, 4096]");
}
