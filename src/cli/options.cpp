#include "cli/options.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "cli/flags.h"
#include "core/models.h"
#include "cpdrift/tp_lanes.h"
#include "inputs/model_config.h"

namespace cpd {

namespace {

// The numeric options' ranges (docs/cli.md, "Ranges"). The run also refuses a problem its
// memory cannot hold, and the plan one whose pairs it cannot count, before any work.
constexpr int kMaxBatch = 4096;
constexpr const char* kBatchWhy = "sequences in one attention call";
constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 30;
constexpr const char* kSeqLenWhy = "2^30 tokens, past any model's context";

// Threads per process, or processes on the host: more than its CPUs only take turns on them.
// Up to 4 per CPU lets a small host still run a wide pool; past that, starting and waking the
// workers is all the run would do.
int per_machine_limit() {
  return 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
std::string per_machine_why() {
  return "4 per CPU; this machine has " + std::to_string(per_machine_limit() / 4);
}

void add_problem_flags(FlagReader& r, Problem& p) {
  // The model by name or by its own config.json; one of the two.
  auto chosen = std::make_shared<std::string>();
  const auto choose = [chosen](const std::string& f) {
    if (!chosen->empty() && *chosen != f)
      bad(*chosen + " and " + f + " both name the model; give one");
    *chosen = f;
  };
  r.value("--model", [&p, choose](const std::string& f, const std::string& v) {
    choose(f);
    const ModelDims* m = find_model(v);
    if (!m) bad(f + ": unknown model '" + v + "' (" + known_model_names() + ")");
    p.dims = *m;
  });
  r.value("--model-config", [&p, choose](const std::string& f, const std::string& v) {
    choose(f);
    if (v.empty()) bad(f + ": an empty path");
    p.dims = read_model_config(v);
  });
  r.integer("--batch", p.batch, 1, kMaxBatch, kBatchWhy);
  r.integer<std::int64_t>("--seq-len", p.seq_len, 1, kMaxSeqLen, kSeqLenWhy);
  r.integer<std::uint64_t>("--seed", p.seed, 0);
  r.name("--dtype", p.dtype, "dtype", kDTypeNames);
  r.toggle("--no-rope", [&] { p.rope = false; });
  r.name("--input-distribution", p.distribution, "input distribution", kInputDistributionNames);
}

// The flags every command takes: the problem and the worker threads.
void add_common_flags(FlagReader& r, Problem& p, int& threads) {
  add_problem_flags(r, p);
  r.integer("--threads", threads, 1, per_machine_limit(), per_machine_why());
}

BenchOptions parse_bench(FlagReader& r, const std::vector<std::string>& args, std::size_t first) {
  BenchOptions b;
  b.problem.seq_len = 4096;
  add_common_flags(r, b.problem, b.threads);
  r.integer("--repeats", b.repeats, 1, 100, "a benchmark, not a soak");
  r.name("--device", b.device, "device", kDeviceNames);
  r.read(args, first);
  b.seq_len_given = r.given("--seq-len");
  return b;
}

void add_threshold_flags(FlagReader& r, Thresholds& t) {
  const auto threshold = [&](const char* flag, double& slot) {
    r.number(flag, slot, {.min = 0, .above_min = true});
  };
  threshold("--out-threshold", t.out_max_abs);
  threshold("--lse-threshold", t.lse_max_abs);
  threshold("--dlogp-threshold", t.dlogp_max_abs);
  threshold("--gradient-threshold", t.gradient_max_abs);
  threshold("--paged-out-threshold", t.paged_out_max_abs);
  threshold("--paged-lse-threshold", t.paged_lse_max_abs);
  threshold("--paged-dlogp-threshold", t.paged_dlogp_max_abs);
}

// Fills `a`; with --help nothing is required.
void parse_accept(FlagReader& r, const std::vector<std::string>& args, std::size_t first,
                  const bool& help, AcceptOptions& a) {
  a.problem.batch = 2;  // two sequences: the paged rows' batch composition needs a batch
  add_common_flags(r, a.problem, a.threads);
  r.value("--mode", [&](const std::string& f, const std::string& v) {
    if (v != "manifest" && v != "run") bad(f + ": unknown mode '" + v + "' (manifest, run)");
    a.mode = v;
  });
  r.path("--output", a.output);
  add_threshold_flags(r, a.thresholds);
  r.read(args, first);
  if (help) return;
  if (a.mode.empty()) bad("accept: --mode manifest|run is required");
  if (a.output.empty()) bad("accept: --output DIR/acceptance.json is required");
}

// The case matrix and the legs.
void add_case_flags(FlagReader& r, RunRequest& q) {
  r.integers("--tp-world-sizes", q.tp_sizes, 1);  // each a divisor of the heads (plan_run)
  r.integers("--cp-world-sizes", q.cp_sizes, 1, 256, "GPUs sharing one sequence's context");
  r.value("--kv-chunk-sizes",
          [&](const std::string& f, const std::string& v) { q.splits = parse_splits(f, v); });
  r.names("--cp-layouts", q.layouts, "layout", kCpLayoutNames);
  r.names("--protocols", q.protocols, "protocol", kProtocolNames);
  r.names("--modes", q.modes, "mode", kRunModeNames);
  r.value("--scope", [&q](const std::string& f, const std::string& v) {
    if (v != "core" && v != "layer") bad(f + ": unknown scope '" + v + "' (core, layer)");
    q.problem.layer = v == "layer";
  });
  r.name("--o-proj-order", q.problem.o_proj_order, "o_proj order", kOProjOrderNames);
  r.toggle("--no-reduction-lanes", [&] { q.problem.reduction_lanes = false; });
  r.toggle("--include-backward", [&] { q.include_backward = true; });
  r.toggle("--include-lane-backward", [&] { q.include_lane_backward = true; });
  r.toggle("--include-dlogp", [&] { q.include_dlogp = true; });
  // A number, or "model": the model's own vocabulary (settled once the model is known).
  r.value("--vocab-size", [&q](const std::string& f, const std::string& v) {
    if (v != "model" && v.find_first_not_of("0123456789") != std::string::npos)
      bad(f + ": expected an integer or 'model', got '" + v + "'");
    q.vocab_size = v == "model" ? 0 : parse_int<int>(f, v, 2, 1 << 20, "2^20, or model");
  });
}

// The paged modes' flags (each needs a paged mode).
void add_paged_flags(FlagReader& r, RunRequest& q) {
  r.integers("--rollout-tp-sizes", q.rollout_tp_sizes, 1);  // each a divisor of the heads
  r.integer("--page-size", q.page_size, 1);                 // at most --seq-len (plan_run)
  r.names("--split-kv-policies", q.split_policies, "split-KV policy", kSplitPolicyNames);
  r.integer<std::int64_t>("--fixed-split-size", q.fixed_split_size, 1);  // shorter than S
  r.integer<std::int64_t>("--q-len", q.q_len, 1);  // at most the room left (plan_run)
}

// Where the run executes.
void add_execution_flags(FlagReader& r, RunRequest& q) {
  r.name("--device", q.device, "device", kDeviceNames);
  r.name("--transport", q.transport, "transport", kTransportNames);
  // Under a second is a busy machine's jitter, not a lost process; a week outlasts any job.
  r.number("--comm-timeout", q.comm_timeout_seconds,
           {.min = 1, .max = 7 * 24 * 3600, .why = "seconds: a second to a week"});
  r.integer("--staging-mib", q.staging_mib, 1, 65536, "64 GiB of GPU memory");
  r.toggle("--no-cpu-check", [&] { q.cpu_check = false; });
  r.value("--inject-fault",
          [&](const std::string& f, const std::string& v) { q.fault = parse_fault(f, v); });
  r.integer<std::int64_t>("--round-rows", q.round_rows, 1);  // at most S (settle_sequence)
}

// What the CLI does with the run's results.
void add_output_flags(FlagReader& r, RunOptions& o) {
  r.path("--output", o.output);
  r.path("--dump", o.dump);
  r.path("--inputs", o.inputs);
  r.path("--weights", o.weights);
  r.integer("--layer", o.layer, 0, 1 << 20, "a layer index");
  r.toggle("--dump-inputs", [&] { o.dump_inputs = true; });
  r.toggle("--overwrite", [&] { o.overwrite = true; });
  r.toggle("--json", [&] { o.json = true; });
  r.toggle("--quiet", [&] { o.quiet = true; });
  r.toggle("--progress", [&] { o.progress = true; });
  r.toggle("--smoke", [&] { o.smoke = true; });
}

// Combinations that no single flag can refuse.
void check_run_options(const RunOptions& o, const FlagReader& r) {
  const RunRequest& q = o.request;
  if (o.dump_inputs && o.dump.empty()) bad("--dump-inputs needs --dump PATH");
  if (o.request.include_lane_backward && !o.request.include_backward)
    bad("--include-lane-backward needs --include-backward (it is the backward's te_p2p lane)");
  if (q.fault && q.fault->kind == FaultKind::dump_write_error) {
    if (o.dump.empty()) bad("--inject-fault dump-write-error needs --dump PATH");
    if (q.fault->rank != 0)
      bad("--inject-fault dump-write-error@RANK: only rank 0 writes the dump");
  }
  const std::string paged = r.first_given({"--rollout-tp-sizes", "--page-size",
                                           "--split-kv-policies", "--fixed-split-size", "--q-len"});
  if (!paged.empty() && !q.runs(RunMode::paged_prefill) && !q.runs(RunMode::decode))
    bad(paged + " applies to the paged modes: add --modes ...,paged_prefill,decode");
  const bool modes_given = r.given("--modes");
  const auto lists_split = [&](bool sized) {
    return std::any_of(q.splits.begin(), q.splits.end(),
                       [&](const auto& s) { return s.has_value() == sized; });
  };
  if (modes_given && q.runs(RunMode::prefill) && !lists_split(false)) {
    bad("--modes prefill: --kv-chunk-sizes lists no 'none' (split disabled)");
  }
  if (modes_given && q.runs(RunMode::chunked_prefill) && !lists_split(true)) {
    bad("--modes chunked_prefill: --kv-chunk-sizes lists no split size");
  }
  const bool fixed_requested = std::find(q.split_policies.begin(), q.split_policies.end(),
                                         SplitPolicy::fixed) != q.split_policies.end();
  if (q.fixed_split_size && !fixed_requested) {
    bad("--fixed-split-size needs the fixed policy in --split-kv-policies");
  }
}

// What the layer (--scope layer) runs today: the forward through o_proj on the CPU backend,
// from synthetic weights and generated hidden states, in the prefill modes.
void check_layer(const RunOptions& o) {
  const RunRequest& q = o.request;
  if (!q.problem.layer) {
    if (q.problem.o_proj_order != OProjOrder::canonical)
      bad("--o-proj-order applies to the layer: add --scope layer");
    if (!q.problem.reduction_lanes)
      bad("--no-reduction-lanes applies to the layer: add --scope layer");
    if (!o.weights.empty() || o.layer >= 0)
      bad(std::string(o.weights.empty() ? "--layer" : "--weights") +
          " applies to the layer: add --scope layer");
    return;
  }
  if (o.weights.empty() != (o.layer < 0))
    bad(o.weights.empty() ? "--layer N needs --weights PATH (the checkpoint it is a layer of)"
                          : "--weights PATH needs --layer N (which layer of the checkpoint)");
  if (q.problem.distribution != InputDistribution::gaussian)
    bad("--scope layer: q, k and v are the layer's projections; drop --input-distribution");
  for (const std::vector<int>* sizes : {&q.tp_sizes, &q.rollout_tp_sizes}) {
    for (const int tp : *sizes) {
      if (q.problem.reduction_lanes && tp > kMaxLaneRanks)
        bad("--scope layer: TP " + std::to_string(tp) + ": the reduction lanes sum at most " +
            std::to_string(kMaxLaneRanks) + " ranks; add --no-reduction-lanes");
    }
  }
  for (const int cp : q.cp_sizes) {
    if (cp > 8)
      bad("--scope layer: --cp-world-sizes " + std::to_string(cp) +
          ": the layer runs CP up to 8 (its token-block grid, docs/numerics.md §11)");
  }
}

// What depends on the sequence length, once it is known: the splits (a default that would cut
// nothing is halved; a given one that cuts nothing is 'none' under another name), the options
// bounded by the sequence, and the layer's 16-token multiple.
void settle_sequence(RunOptions& o) {
  RunRequest& q = o.request;
  const std::int64_t seq = q.problem.seq_len;
  for (std::optional<std::int64_t>& s : q.splits) {
    if (s && *s >= seq && !o.splits_given) s = std::max<std::int64_t>(1, seq / 2);
    if (s && *s >= seq && o.splits_given && seq > 1) {
      bad("--kv-chunk-sizes " + std::to_string(*s) + ": not shorter than the sequence (" +
          std::to_string(seq) + " tokens), so it cuts nothing: that is 'none'");
    }
  }
  if (q.fixed_split_size && *q.fixed_split_size >= seq && seq > 1) {
    bad("--fixed-split-size " + std::to_string(*q.fixed_split_size) +
        ": not shorter than the longest sequence (" + std::to_string(seq) +
        " tokens), so it cuts nothing: that is the disabled policy");
  }
  if (q.round_rows > 0)
    check_range("--round-rows", q.round_rows, 1, seq,
                "at most --seq-len: a round holds at most the sequence");
  if (q.problem.layer && seq % 16 != 0) {
    bad("--scope layer: " + (o.inputs.empty() ? "--seq-len" : "--inputs " + o.inputs + ": S =") +
        " " + std::to_string(seq) +
        " is not a multiple of 16 (the layer's token-block grid, docs/numerics.md §11)");
  }
}

// `extra`: the flags of a command that takes the run's flags and more (plan).
RunOptions parse_run(FlagReader& r, const std::vector<std::string>& args, std::size_t first,
                     const std::function<void(FlagReader&)>& extra = {}) {
  RunOptions o;
  RunRequest& q = o.request;
  add_common_flags(r, q.problem, q.threads);
  add_case_flags(r, q);
  add_paged_flags(r, q);
  add_execution_flags(r, q);
  add_output_flags(r, o);
  if (extra) extra(r);
  r.read(args, first);
  o.splits_given = r.given("--kv-chunk-sizes");
  q.comm_timeout_given = r.given("--comm-timeout");
  if (q.vocab_size == 0) q.vocab_size = q.problem.dims.vocab_size;  // --vocab-size model
  check_run_options(o, r);
  check_layer(o);
  if (!o.inputs.empty()) {
    // The file says B and S; its q, k, v replace the generator's (use_input_file).
    if (r.given("--seq-len") || r.given("--batch"))
      bad("--inputs: B and S come from the file; drop --seq-len and --batch");
    if (o.smoke) bad("--inputs: --smoke sets its own sequence; drop one of them");
    if (q.problem.distribution != InputDistribution::gaussian)
      bad("--inputs: the file's q, k, v are the inputs; drop --input-distribution");
    return o;
  }
  if (o.smoke) {
    if (!r.given("--seq-len")) q.problem.seq_len = 4;
    if (!o.splits_given) q.splits = {std::nullopt, 1};
  }
  settle_sequence(o);
  return o;
}

// A figure of the machine a plan is for, in its unit (TFLOP/s, TB/s or GB/s).
constexpr NumberRange kFigureRange{.min = 1e-3, .max = 1e6, .why = "in its unit"};

PlanOptions parse_plan(FlagReader& r, const std::vector<std::string>& args, std::size_t first) {
  PlanOptions plan;
  const auto figure = [&](const char* flag, double& slot) { r.number(flag, slot, kFigureRange); };
  plan.run = parse_run(r, args, first, [&](FlagReader& fr) {
    fr.value("--profile", [&](const std::string& f, const std::string& v) {
      if (v != "h200" && v != "cpu") bad(f + ": unknown profile '" + v + "' (h200, cpu)");
      plan.profile = v;
    });
    figure("--bf16-tflops", plan.bf16_tflops);
    figure("--fp32-tflops", plan.fp32_tflops);
    figure("--hbm-tbs", plan.hbm_tbs);
    figure("--nvlink-gbs", plan.nvlink_gbs);
    figure("--network-gbs", plan.network_gbs);
    fr.integer("--gpus-per-node", plan.gpus_per_node, 1, 1024, "GPUs sharing NVLink");
    fr.integer("--processes", plan.processes, 1, per_machine_limit(), per_machine_why());
  });
  // The run's execution flags say how a run moves and reports; a plan runs nothing.
  constexpr std::pair<const char*, const char*> kRunOnly[] = {
      {"--dump", "a plan runs nothing"},
      {"--overwrite", "a plan writes no dump"},
      {"--progress", "a plan runs nothing"},
      {"--threads", "--profile cpu uses every core, shared by --processes"},
      {"--transport", "a plan moves nothing"},
      {"--comm-timeout", "a plan moves nothing"},
      {"--staging-mib", "a plan moves nothing"},
      {"--inject-fault", "a plan moves nothing"}};
  for (const auto& [flag, why] : kRunOnly) {
    if (r.given(flag)) bad(std::string("plan: ") + flag + " does not apply (" + why + ")");
  }
  const bool figures_given = !r.first_given({"--bf16-tflops", "--fp32-tflops", "--hbm-tbs",
                                             "--nvlink-gbs", "--network-gbs"})
                                  .empty();
  if (figures_given && plan.profile == "cpu") {
    bad("plan: --profile cpu measures this machine; the device figures apply to h200");
  }
  if (plan.processes > 0 && plan.profile != "cpu") {
    bad("plan: --processes applies to --profile cpu (on a GPU profile every logical rank has "
        "its own GPU)");
  }
  return plan;
}

CompareOptions parse_compare(FlagReader& r, const std::vector<std::string>& args, std::size_t first,
                             const bool& help) {
  CompareOptions c;
  std::vector<std::string> files;
  r.positional([&](const std::string& v) { files.push_back(v); });
  r.path("--output", c.output);
  r.toggle("--json", [&] { c.json = true; });
  r.toggle("--quiet", [&] { c.quiet = true; });
  r.number("--max-abs-delta", c.max_abs_delta, {.min = 0});
  r.number("--ratio-band", c.metrics.ratio_band,
           {.min = 0, .max = 1, .below_max = true, .why = "ratios outside [1 - X, 1 + X] count"});
  r.number("--tis-clip", c.metrics.tis_clip,
           {.min = 1, .why = "ratios above it are clipped; below 1 it would clip equal logprobs"});
  r.integer("--worst", c.metrics.worst, 0, 1000, "a list to read");
  r.read(args, first);
  if (help) return c;
  if (files.size() != 2) {
    bad("compare: expected two logprob streams, TRAIN ROLLOUT (got " +
        std::to_string(files.size()) + ")");
  }
  c.train = files[0];
  c.rollout = files[1];
  if (!c.output.empty() && (c.output == c.train || c.output == c.rollout))
    bad("compare: --output " + c.output + " is one of the streams compared");
  return c;
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine cl;
  std::size_t first = 0;
  const std::map<std::string, CommandLine::Command> commands{
      {"run", CommandLine::Command::run},
      {"bench", CommandLine::Command::bench},
      {"accept", CommandLine::Command::accept},
      {"plan", CommandLine::Command::plan},
      {"compare", CommandLine::Command::compare}};
  if (!args.empty()) {
    if (const auto c = commands.find(args[0]); c != commands.end()) {
      cl.command = c->second;
      first = 1;
    }
  }
  bool help = false;
  FlagReader r;
  r.toggle("--help", [&] { help = true; });
  r.toggle("-h", [&] { help = true; });
  switch (cl.command) {
    case CommandLine::Command::bench:
      cl.bench = parse_bench(r, args, first);
      break;
    case CommandLine::Command::accept:
      parse_accept(r, args, first, help, cl.accept);
      break;
    case CommandLine::Command::plan:
      cl.plan = parse_plan(r, args, first);
      break;
    case CommandLine::Command::compare:
      cl.compare = parse_compare(r, args, first, help);
      break;
    default:
      cl.run = parse_run(r, args, first);
  }
  if (help) cl.command = CommandLine::Command::help;
  return cl;
}

void use_input_file(RunOptions& run, std::shared_ptr<const InputSource> source) {
  const InputFileInfo& file = source->info();
  check_range("--inputs " + file.path + ": its batch", file.batch, 1, kMaxBatch, kBatchWhy);
  check_range("--inputs " + file.path + ": its sequence length", file.seq_len, 1, kMaxSeqLen,
              kSeqLenWhy);
  run.request.problem.batch = file.batch;
  run.request.problem.seq_len = file.seq_len;
  run.request.problem.inputs = std::move(source);
  settle_sequence(run);
}

}  // namespace cpd
