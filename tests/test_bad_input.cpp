// Bad input, as a table (issue 13): every invocation below must end, on every process of the
// job, with status 2, exactly one line on stderr (from rank 0; the others say nothing), nothing
// on stdout and nothing written anywhere. Each runs in-process through cli_main, the function
// main() calls once MPI is up, so a job of 1 or 2 processes (meson test runs both) tries them
// all in seconds. The line must also name the fault: each row holds a piece of its text.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/errors.h"
#include "in_process_cli.h"
#include "kernels/attention_backend.h"

namespace {

using namespace cpd::testing;

struct BadInput {
  std::vector<std::string> args;  // after "cpdrift"; "@D" stands for the scratch directory
  std::string says;               // a piece of the one line it must print
};

std::string substitute(std::string arg, const std::string& dir) {
  for (std::size_t at; (at = arg.find("@D")) != std::string::npos;) arg.replace(at, 2, dir);
  return arg;
}

// What is wrong with one row's outcome on this process ("" when nothing), agreed by nobody yet.
std::string judge(const BadInput& row, const Outcome& o, bool root) {
  if (o.status != cpd::kExitUsage) return "status " + std::to_string(o.status) + ", not 2";
  if (!o.out.empty()) return "wrote to stdout: " + o.out;
  if (!root) return o.err.empty() ? "" : "a process other than rank 0 wrote: " + o.err;
  const std::size_t newline = o.err.find('\n');
  if (newline == std::string::npos || newline + 1 != o.err.size())
    return "not exactly one line on stderr: [" + o.err + "]";
  if (o.err.rfind("cpdrift: error: ", 0) != 0) return "not a cpdrift error line: " + o.err;
  if (o.err.find(row.says) == std::string::npos)
    return "the line does not say \"" + row.says + "\": " + o.err;
  return "";
}

// The rows. Each says what it checks only through its arguments and the words it must print.
const std::vector<BadInput>& bad_inputs() {
  static const std::vector<BadInput> rows = [] {
    std::vector<BadInput> r = {
        // Flags and subcommands.
        {{"--no-such-flag"}, "--no-such-flag"},
        {{"run", "--no-such-flag"}, "--no-such-flag"},
        {{"plan", "--no-such-flag"}, "--no-such-flag"},
        {{"bench", "--no-such-flag"}, "--no-such-flag"},
        {{"accept", "--no-such-flag"}, "--no-such-flag"},
        {{"frobnicate"}, "frobnicate"},
        {{"run", "stray"}, "stray"},
        {{"plan", "stray"}, "stray"},
        {{"--seq-len"}, "--seq-len"},
        {{"--seq-len="}, "--seq-len"},
        {{"--model", "llama"}, "--model: unknown model 'llama' (qwen3-8b, qwen3-4b"},
        {{"--model-config", "@D/none.json"}, "@D/none.json: cannot read the model config"},
        {{"--model-config", "@D"}, "@D: cannot read the model config (not a file)"},
        {{"--model-config", ""}, "--model-config"},
        {{"--model", "qwen3-4b", "--model-config", "@D/c.json"},
         "--model and --model-config both name the model"},
        {{"--dtype", "fp16"}, "fp16"},
        {{"--device", "tpu"}, "tpu"},
        {{"--transport", "carrier-pigeon"}, "carrier-pigeon"},
        {{"--transport", "nccl", "--device", "cpu"}, "--transport nccl"},
        {{"--no-rope=1"}, "--no-rope"},
        {{"--dump-inputs"}, "--dump-inputs"},
        // Numbers: not numbers, out of range, overflowing.
        {{"--seq-len", "x"}, "--seq-len"},
        {{"--seq-len", "0"}, "--seq-len"},
        {{"--seq-len", "-4"}, "--seq-len"},
        {{"--seq-len", "16.5"}, "--seq-len"},
        {{"--seq-len", "99999999999999999999999"}, "--seq-len: must be from 1 to 1073741824"},
        {{"--seq-len", "1073741825"}, "--seq-len: must be from 1 to 1073741824 (2^30 tokens"},
        {{"--seq-len", "1073741824"}, "not enough memory"},
        {{"--batch", "0"}, "--batch: must be from 1 to 4096"},
        {{"--batch", "4097"}, "--batch: must be from 1 to 4096 (sequences in one attention"},
        {{"--batch", "3000000000"}, "--batch: must be from 1 to 4096"},
        {{"--batch", "4096", "--seq-len", "1000000"}, "not enough memory"},
        {{"--seed", "-1"}, "--seed: must be from 0 to 18446744073709551615, got -1"},
        {{"--seed", "18446744073709551616"}, "--seed: must be from 0 to 18446744073709551615"},
        {{"--threads", "0"}, "--threads: must be from 1 to"},
        {{"--threads", "many"}, "--threads: expected an integer"},
        // Far more threads than any machine's 4 per CPU: refused at once, where it used to hang.
        {{"--threads", "100000", "--output", "@D/r.json", "--dump", "@D/d.h5"},
         "--threads: must be from 1 to"},
        {{"bench", "--threads", "100000"}, "per CPU; this machine has"},
        {{"accept", "--mode", "manifest", "--output", "@D/acc.json", "--threads", "100000"},
         "--threads: must be from 1 to"},
        {{"--vocab-size", "1"}, "--vocab-size: must be from 2 to 1048576"},
        {{"--vocab-size", "big"}, "--vocab-size: expected an integer or 'model', got 'big'"},
        {{"--vocab-size", "1048577", "--include-dlogp"}, "--vocab-size: must be from 2 to 1048576"},
        {{"--cp-world-sizes", "1,512"}, "--cp-world-sizes: must be from 1 to 256"},
        {{"--round-rows", "0"}, "--round-rows: must be at least 1"},
        {{"--round-rows", "17"}, "--round-rows: must be from 1 to 16 (at most --seq-len"},
        {{"--seq-len", "64", "--round-rows", "65"}, "--round-rows: must be from 1 to 64"},
        {{"--staging-mib", "0"}, "--staging-mib: must be from 1 to 65536"},
        {{"--staging-mib", "65537"}, "--staging-mib: must be from 1 to 65536"},
        {{"--comm-timeout", "-1"}, "--comm-timeout: must be from 1 to 604800"},
        {{"--comm-timeout", "0.5"}, "--comm-timeout: must be from 1 to 604800 (seconds"},
        {{"--comm-timeout", "604801"}, "--comm-timeout: must be from 1 to 604800"},
        {{"--comm-timeout", "nan"}, "--comm-timeout: expected a finite number"},
        {{"--comm-timeout", "inf"}, "--comm-timeout: expected a finite number"},
        {{"--page-size", "0"}, "--page-size"},
        {{"--q-len", "0"}, "--q-len"},
        {{"--fixed-split-size", "0"}, "--fixed-split-size"},
        {{"--modes", "decode", "--seq-len", "32", "--page-size", "4", "--fixed-split-size", "32"},
         "--fixed-split-size 32: not shorter than the longest sequence (32 tokens)"},
        // Lists: empty items, duplicates, names that are not in them.
        {{"--tp-world-sizes", ""}, "--tp-world-sizes"},
        {{"--tp-world-sizes", "1,,2"}, "--tp-world-sizes"},
        {{"--tp-world-sizes", "2,2"}, "--tp-world-sizes"},
        {{"--tp-world-sizes", "1,"}, "--tp-world-sizes"},
        {{"--cp-world-sizes", "0"}, "--cp-world-sizes"},
        {{"--cp-world-sizes", "1,1"}, "--cp-world-sizes"},
        {{"--kv-chunk-sizes", "4,4"}, "--kv-chunk-sizes"},
        {{"--kv-chunk-sizes", "zero"}, "--kv-chunk-sizes"},
        {{"--kv-chunk-sizes", "16"}, "--kv-chunk-sizes"},
        {{"--kv-chunk-sizes", "none,full"}, "'full' repeats 'none'"},
        {{"--cp-layouts", "spiral"}, "spiral"},
        {{"--cp-layouts", "zigzag,zigzag"}, "--cp-layouts"},
        {{"--protocols", "ag_rs,ag_rs"}, "--protocols"},
        {{"--protocols", "carrier"}, "carrier"},
        {{"--modes", "train"}, "train"},
        {{"--modes", "decode,decode"}, "--modes: 'decode' repeats"},
        {{"--split-kv-policies", "sometimes"}, "sometimes"},
        {{"--modes", "prefill", "--kv-chunk-sizes", "4"}, "--modes prefill"},
        {{"--modes", "chunked_prefill", "--kv-chunk-sizes", "none"}, "--modes chunked_prefill"},
        {{"--modes", "decode", "--split-kv-policies", "disabled", "--fixed-split-size", "32"},
         "--fixed-split-size"},
        // World sizes and shapes that do not fit.
        {{"--tp-world-sizes", "3"}, "TP=3 must divide"},
        {{"--tp-world-sizes", "16"}, "TP=16 exceeds the 8 KV heads of qwen3-8b: vLLM serves"},
        {{"--tp-world-sizes", "3"}, "TP=3 must divide both the 32 query heads"},
        {{"--model", "qwen2.5-7b", "--tp-world-sizes", "8"}, "TP=8 must divide both the 28"},
        {{"--tp-world-sizes", "64"}, "TP=64 must divide"},
        {{"--cp-world-sizes", "32"}, "CP=32 (contiguous) needs"},
        {{"--cp-world-sizes", "3", "--cp-layouts", "zigzag"}, "zigzag"},
        {{"--modes", "decode", "--page-size", "5", "--fixed-split-size", "7"},
         "--fixed-split-size"},
        {{"--modes", "decode", "--q-len", "64"}, "--q-len"},
        {{"--modes", "decode", "--page-size", "4096"}, "--page-size"},
        {{"--page-size", "4"}, "applies to the paged modes"},
        // Fault injection specifications.
        {{"--inject-fault", "gremlin@0"}, "gremlin"},
        {{"--inject-fault", "drop-state"}, "--inject-fault"},
        {{"--inject-fault", "drop-state@x"}, "--inject-fault"},
        {{"--inject-fault", "drop-state@0:0"}, "--inject-fault"},
        {{"--inject-fault", "drop-state@9"}, "--inject-fault"},
        {{"--inject-fault", "slow-rank@1"}, "slow-rank"},
        // Output paths.
        {{"--output", "@D/adir"}, "is a directory"},
        {{"--output", "@D/adir/"}, "is a directory"},
        {{"--output", "@D/missing/report.json"}, "@D/missing/report.json"},
        {{"--output", "@D/existing.h5/report.json"}, "@D/existing.h5/report.json"},
        {{"--dump", "@D/adir"}, "is a directory"},
        {{"--dump", "@D/existing.h5"}, "--overwrite"},
        {{"--dump", "@D/missing/d.h5"}, "@D/missing/d.h5"},
        {{"--output", "@D/same", "--dump", "@D/same"}, "same file"},
        {{"--output", "@D/same", "--dump", "@D/./same"}, "same file"},
        {{"plan", "--output", "@D/adir"}, "is a directory"},
        {{"plan", "--output", "@D/missing/plan.json"}, "@D/missing/plan.json"},
        {{"accept", "--mode", "manifest", "--output", "@D/missing/acc.json"}, "does not exist"},
        {{"accept", "--mode", "run"}, "--output"},
        {{"accept", "--mode", "sometimes", "--output", "@D/acc.json"}, "sometimes"},
        {{"accept", "--output", "@D/acc.json"}, "--mode"},
        // The other subcommands' own options.
        {{"plan", "--profile", "abacus"}, "abacus"},
        {{"plan", "--bf16-tflops", "0"}, "--bf16-tflops: must be from 0.001 to 1e+06"},
        {{"plan", "--network-gbs", "1e7"}, "--network-gbs: must be from 0.001 to 1e+06"},
        {{"plan", "--gpus-per-node", "0"}, "--gpus-per-node: must be from 1 to 1024"},
        {{"plan", "--gpus-per-node", "1025"}, "--gpus-per-node: must be from 1 to 1024"},
        {{"plan", "--processes", "0"}, "--processes: must be from 1 to"},
        {{"plan", "--profile", "cpu", "--processes", "100000"}, "per CPU; this machine has"},
        {{"plan", "--seq-len", "1099511627776"}, "--seq-len: must be from 1 to 1073741824"},
        {{"plan", "--seq-len", "1073741824", "--tp-world-sizes", "8", "--cp-world-sizes", "32"},
         "pairs than the plan counts"},
        {{"bench", "--repeats", "0"}, "--repeats: must be from 1 to 100"},
        {{"bench", "--repeats", "101"}, "--repeats: must be from 1 to 100"},
        {{"bench", "--seq-len", "0"}, "--seq-len"},
        {{"bench", "--device", "cpu", "--seq-len", "1048576"}, "S x S scores"},
        {{"accept", "--mode", "manifest", "--output", "@D/acc.json", "--out-threshold", "-1"},
         "--out-threshold: must be more than 0"},
        {{"accept", "--mode", "manifest", "--output", "@D/acc.json", "--paged-lse-threshold", "0"},
         "--paged-lse-threshold: must be more than 0, got 0"},
        {{"accept", "--mode", "manifest", "--output", "@D/acc.json", "--lse-threshold", "x"},
         "--lse-threshold"},
        {{"--input-distribution", "uniform"}, "uniform"},
        // --inputs: the file, and what cannot go with it.
        {{"--inputs", "@D/nothing.h5"}, "@D/nothing.h5: no such file or directory"},
        {{"plan", "--inputs", "@D/nothing.h5"}, "@D/nothing.h5: no such file or directory"},
        {{"--inputs", "@D/a.jsonl"}, "not HDF5, safetensors or a .npy directory"},
        {{"--inputs", "@D/adir"}, "no inputs.json"},
        {{"--inputs", ""}, "--inputs: empty path"},
        {{"--inputs", "@D/a.jsonl", "--seq-len", "8"}, "drop --seq-len and --batch"},
        {{"--inputs", "@D/a.jsonl", "--batch", "2"}, "drop --seq-len and --batch"},
        {{"--inputs", "@D/a.jsonl", "--smoke"}, "--smoke"},
        {{"--inputs", "@D/a.jsonl", "--input-distribution", "sink"}, "drop --input-distribution"},
        {{"bench", "--inputs", "@D/a.jsonl"}, "unknown option '--inputs'"},
        // compare: its arguments, its options, and streams that cannot be compared.
        {{"compare"}, "TRAIN ROLLOUT (got 0)"},
        {{"compare", "@D/a.jsonl"}, "(got 1)"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "@D/a.jsonl"}, "(got 3)"},
        {{"compare", "--no-such-flag"}, "--no-such-flag"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--max-abs-delta", "-1"}, "--max-abs-delta"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--worst", "x"}, "--worst"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--worst", "1001"}, "--worst: must be from 0 to"},
        // A truncated-IS clip truncates the ratios above it: under 1 it would clip equal tokens.
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--tis-clip", "0", "--output", "@D/c.json"},
         "--tis-clip: must be at least 1"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--tis-clip", "0.99"},
         "--tis-clip: must be at least 1"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--ratio-band", "1"},
         "--ratio-band: must be at least 0 and less than 1"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--ratio-band", "-0.1"}, "--ratio-band"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--max-abs-delta", "inf"},
         "--max-abs-delta: expected a finite number"},
        {{"compare", "@D/a.jsonl", "@D/b.jsonl", "--output", "@D/b.jsonl"},
         "is one of the streams"},
        {{"compare", "@D/nothing.jsonl", "@D/a.jsonl"}, "@D/nothing.jsonl: no such file"},
        {{"compare", "@D/a.jsonl", "@D/b.jsonl"}, "token ids differ at (sequence 0, position 1)"},
        {{"compare", "@D/a.jsonl", "@D/empty.jsonl"}, "has no record for (sequence 0, position 1)"},
        {{"compare", "@D/empty.jsonl", "@D/empty.jsonl", "--output", "@D/c.json"}, "no records"},
        {{"compare", "@D/a.jsonl", "@D/a.jsonl", "--output", "@D/adir"}, "is a directory"},
    };
    // Where the bench could run on a GPU, asking for one is no error.
    if (!cpd::cuda_backend_built()) {
      r.push_back({{"bench", "--device", "cuda"}, "--device cuda: built without CUDA"});
    } else if (cpd::cuda_device_count() == 0) {
      r.push_back({{"bench", "--device", "cuda"}, "--device cuda: no CUDA device"});
    }
    return r;
  }();
  return rows;
}

}  // namespace

TEST_CASE(
    "bad input: at least 80 invocations, each status 2 and one line from rank 0, "
    "nothing written") {
  const std::vector<BadInput>& rows = bad_inputs();
  CHECK(rows.size() >= 80);
  const Scratch scratch;
  if (comm().rank() == 0) {
    fs::create_directory(scratch.dir / "adir");
    std::ofstream(scratch.dir / "existing.h5") << "an earlier dump";
    // Logprob streams for compare: b differs from a in its token id, empty has no record.
    std::ofstream(scratch.dir / "a.jsonl")
        << R"({"sequence": 0, "position": 1, "token_id": 5, "logprob": -0.5})"
        << "\n";
    std::ofstream(scratch.dir / "b.jsonl")
        << R"({"sequence": 0, "position": 1, "token_id": 6, "logprob": -0.5})"
        << "\n";
    std::ofstream(scratch.dir / "empty.jsonl");
  }
  comm().barrier();
  const std::string before = listing(scratch.dir);
  const fs::path cwd = fs::current_path();
  fs::current_path(scratch.dir);  // so that a stray relative write would land where it shows
  for (const BadInput& row : rows) {
    std::vector<std::string> argv{"cpdrift"};
    std::string shown = "cpdrift";
    for (const std::string& a : row.args) {
      argv.push_back(substitute(a, scratch.dir.string()));
      shown += " '" + a + "'";
    }
    BadInput expected = row;
    expected.says = substitute(row.says, scratch.dir.string());
    const Outcome o = invoke(argv, scratch.capture);
    std::string fault = judge(expected, o, comm().rank() == 0);
    if (fault.empty() && comm().rank() == 0 && listing(scratch.dir) != before)
      fault = "wrote into the scratch directory:\n" + listing(scratch.dir);
    // Every process learns the first process's complaint, so all of them agree on the verdict.
    fault = comm().agree(fault);
    CHECK_MESSAGE(fault.empty(), shown << " at " << comm().size() << " processes: " << fault);
    if (std::getenv("CPDRIFT_SHOW_LINES") != nullptr && comm().rank() == 0)
      std::printf("%s\n  -> %s", shown.c_str(), o.err.c_str());
  }
  fs::current_path(cwd);
}

TEST_CASE("bad input: the judge rejects what is not a usage error (negative controls)") {
  const Scratch scratch;
  const BadInput row{{}, "--seq-len"};
  const bool root = comm().rank() == 0;
  // A good run: status 0 and a table on stdout.
  const Outcome good = invoke({"cpdrift", "--smoke", "--quiet"}, scratch.capture);
  CHECK(good.status == 0);
  CHECK_FALSE(judge(row, good, root).empty());
  // Two lines, or a line on a process other than rank 0, or the wrong words.
  Outcome two{cpd::kExitUsage, "", "cpdrift: error: --seq-len\ncpdrift: error: --seq-len\n"};
  CHECK_FALSE(judge(row, two, true).empty());
  Outcome other{cpd::kExitUsage, "", "cpdrift: error: --seq-len\n"};
  CHECK(judge(row, other, true).empty());
  CHECK_FALSE(judge(row, other, false).empty());
  CHECK_FALSE(judge(BadInput{{}, "--batch"}, other, true).empty());
}
