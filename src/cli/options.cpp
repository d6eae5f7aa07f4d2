#include "cli/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <type_traits>

#include "core/errors.h"

namespace cpd {

namespace {

[[noreturn]] void bad(const std::string& what) { throw UsageError(what); }

template <class Int>
Int parse_int(const std::string& flag, const std::string& text, Int min_value) {
  Int value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  const bool digits = !text.empty() &&
                      std::all_of(text.begin() + (text[0] == '-' ? 1 : 0), text.end(),
                                  [](char c) { return c >= '0' && c <= '9'; }) &&
                      text != "-";
  if (digits && (ec == std::errc::result_out_of_range ||
                 (std::is_unsigned_v<Int> && text[0] == '-' && text != "-0"))) {
    // An integer, but not one this flag can hold.
    bad(flag + ": " + text + " is out of range (" + std::to_string(min_value) + " to " +
        std::to_string(std::numeric_limits<Int>::max()) + ")");
  }
  if (ec != std::errc() || ptr != end || text.empty()) {
    bad(flag + ": expected an integer, got '" + text + "'");
  }
  if (value < min_value)
    bad(flag + ": must be at least " + std::to_string(min_value) + ", got " + text);
  return value;
}

// A list item given twice would run (or name) the same thing twice: refused, with the item.
template <class T>
void refuse_repeats(const std::string& flag, const std::vector<T>& values,
                    const std::vector<std::string>& items) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (values[i] == values[j]) {
        bad(flag + ": '" + items[i] + "' repeats '" + items[j] + "' (each item once)");
      }
    }
  }
}

double parse_threshold(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(value >= 0) || !std::isfinite(value)) {
    bad(flag + ": expected a finite non-negative number, got '" + text + "'");
  }
  return value;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) bad(flag + ": malformed list '" + text + "' (empty item)");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::vector<int> parse_int_list(const std::string& flag, const std::string& text) {
  const std::vector<std::string> items = split_list(flag, text);
  std::vector<int> values;
  for (const std::string& item : items) values.push_back(parse_int<int>(flag, item, 1));
  refuse_repeats(flag, values, items);
  return values;
}

std::vector<std::optional<std::int64_t>> parse_splits(const std::string& flag,
                                                      const std::string& text) {
  const std::vector<std::string> items = split_list(flag, text);
  std::vector<std::optional<std::int64_t>> values;
  for (const std::string& item : items) {
    if (item == "none" || item == "full" || item == "no_split") {
      values.emplace_back(std::nullopt);
    } else {
      values.emplace_back(parse_int<std::int64_t>(flag + " (split size)", item, 1));
    }
  }
  refuse_repeats(flag, values, items);  // none, full and no_split are one item
  return values;
}

// One name from an enum's table (the spellings to_string prints); an unknown name is an error
// listing them.
template <class T, std::size_t N>
T parse_name(const std::string& flag, const std::string& item, const char* what,
             const EnumName<T> (&table)[N]) {
  for (const EnumName<T>& e : table) {
    if (item == e.name) return e.value;
  }
  std::string known;
  for (const EnumName<T>& e : table) known += (known.empty() ? "" : ", ") + std::string(e.name);
  bad(flag + ": unknown " + what + " '" + item + "' (" + known + ")");
}

// --inject-fault KIND@RANK[:WHEN].
FaultSpec parse_fault(const std::string& flag, const std::string& text) {
  const std::size_t at = text.find('@');
  if (at == std::string::npos) bad(flag + ": '" + text + "' is not KIND@RANK[:WHEN]");
  FaultSpec f;
  f.kind = parse_name(flag, text.substr(0, at), "fault", kFaultKindNames);
  const std::string place = text.substr(at + 1);
  const std::size_t colon = place.find(':');
  f.rank = parse_int<int>(flag + " RANK", place.substr(0, colon), 0);
  if (colon != std::string::npos)
    f.when = parse_int<int>(flag + " WHEN", place.substr(colon + 1), 1);
  return f;
}

// A comma list of names.
template <class T, std::size_t N>
std::vector<T> parse_names(const std::string& flag, const std::string& text, const char* what,
                           const EnumName<T> (&table)[N]) {
  const std::vector<std::string> items = split_list(flag, text);
  std::vector<T> out;
  for (const std::string& item : items) out.push_back(parse_name(flag, item, what, table));
  refuse_repeats(flag, out, items);
  return out;
}

// Walks argv, handing each flag's value (from `--flag value` or `--flag=value`) to its setter.
class FlagReader {
 public:
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  using Switch = std::function<void()>;

  void value(const std::string& name, Setter s) { values_[name] = std::move(s); }
  void toggle(const std::string& name, Switch s) { toggles_[name] = std::move(s); }
  /// Where arguments that are not flags go (a command's files); without it they are refused.
  void positional(std::function<void(const std::string&)> take) { positional_ = std::move(take); }

  void read(const std::vector<std::string>& args, std::size_t first) {
    for (std::size_t i = first; i < args.size(); ++i) {
      std::string flag = args[i], inline_value;
      bool has_inline = false;
      if (const std::size_t eq = flag.find('=');
          flag.rfind("--", 0) == 0 && eq != std::string::npos) {
        inline_value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        has_inline = true;
      }
      if (const auto t = toggles_.find(flag); t != toggles_.end()) {
        if (has_inline) bad(flag + " takes no value");
        t->second();
      } else if (const auto v = values_.find(flag); v != values_.end()) {
        if (!has_inline && i + 1 >= args.size()) bad(flag + ": missing value");
        v->second(flag, has_inline ? inline_value : args[++i]);
      } else if (positional_ && !args[i].empty() && args[i][0] != '-') {
        positional_(args[i]);
      } else {
        bad("unknown option '" + args[i] + "' (see cpdrift --help)");
      }
    }
  }

 private:
  std::map<std::string, Setter> values_;
  std::map<std::string, Switch> toggles_;
  std::function<void(const std::string&)> positional_;
};

void add_problem_flags(FlagReader& r, Problem& p, bool& seq_len_given) {
  r.value("--model", [](const std::string& f, const std::string& v) {
    if (v != "qwen3-8b") bad(f + ": unknown model '" + v + "' (qwen3-8b)");
  });
  r.value("--batch",
          [&](const std::string& f, const std::string& v) { p.batch = parse_int<int>(f, v, 1); });
  r.value("--seq-len", [&](const std::string& f, const std::string& v) {
    p.seq_len = parse_int<std::int64_t>(f, v, 1);
    seq_len_given = true;
  });
  r.value("--seed", [&](const std::string& f, const std::string& v) {
    p.seed = parse_int<std::uint64_t>(f, v, 0);
  });
  r.value("--dtype", [&](const std::string& f, const std::string& v) {
    p.dtype = parse_name(f, v, "dtype", kDTypeNames);
  });
  r.toggle("--no-rope", [&] { p.rope = false; });
  r.value("--input-distribution", [&](const std::string& f, const std::string& v) {
    p.distribution = parse_name(f, v, "input distribution", kInputDistributionNames);
  });
}

// The flags every command takes: the problem and the worker threads.
void add_common_flags(FlagReader& r, Problem& p, bool& seq_len_given, int& threads) {
  add_problem_flags(r, p, seq_len_given);
  r.value("--threads",
          [&](const std::string& f, const std::string& v) { threads = parse_int<int>(f, v, 1); });
}

BenchOptions parse_bench(FlagReader& r, const std::vector<std::string>& args, std::size_t first) {
  BenchOptions b;
  b.problem.seq_len = 4096;
  add_common_flags(r, b.problem, b.seq_len_given, b.threads);
  r.value("--repeats",
          [&](const std::string& f, const std::string& v) { b.repeats = parse_int<int>(f, v, 1); });
  r.value("--device", [&](const std::string& f, const std::string& v) {
    b.device = parse_name(f, v, "device", kDeviceNames);
  });
  r.read(args, first);
  return b;
}

void add_threshold_flags(FlagReader& r, Thresholds& t) {
  const auto threshold = [&](const char* flag, double& slot) {
    r.value(flag,
            [&slot](const std::string& f, const std::string& v) { slot = parse_threshold(f, v); });
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
  bool seq_len_given = false;
  add_common_flags(r, a.problem, seq_len_given, a.threads);
  r.value("--mode", [&](const std::string& f, const std::string& v) {
    if (v != "manifest" && v != "run") bad(f + ": unknown mode '" + v + "' (manifest, run)");
    a.mode = v;
  });
  r.value("--output", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    a.output = v;
  });
  add_threshold_flags(r, a.thresholds);
  r.read(args, first);
  if (help) return;
  if (a.mode.empty()) bad("accept: --mode manifest|run is required");
  if (a.output.empty()) bad("accept: --output DIR/acceptance.json is required");
}

// The case matrix and the legs.
void add_case_flags(FlagReader& r, RunRequest& q, bool& splits_given, bool& modes_given) {
  r.value("--tp-world-sizes",
          [&](const std::string& f, const std::string& v) { q.tp_sizes = parse_int_list(f, v); });
  r.value("--cp-world-sizes",
          [&](const std::string& f, const std::string& v) { q.cp_sizes = parse_int_list(f, v); });
  r.value("--kv-chunk-sizes", [&](const std::string& f, const std::string& v) {
    q.splits = parse_splits(f, v);
    splits_given = true;
  });
  r.value("--cp-layouts", [&](const std::string& f, const std::string& v) {
    q.layouts = parse_names(f, v, "layout", kCpLayoutNames);
  });
  r.value("--protocols", [&](const std::string& f, const std::string& v) {
    q.protocols = parse_names(f, v, "protocol", kProtocolNames);
  });
  r.value("--modes", [&](const std::string& f, const std::string& v) {
    q.modes = parse_names(f, v, "mode", kRunModeNames);
    modes_given = true;
  });
  r.toggle("--include-backward", [&] { q.include_backward = true; });
  r.toggle("--include-lane-backward", [&] { q.include_lane_backward = true; });
  r.toggle("--include-dlogp", [&] { q.include_dlogp = true; });
  r.value("--vocab-size", [&](const std::string& f, const std::string& v) {
    q.vocab_size = parse_int<int>(f, v, 2);
  });
}

// The paged modes' flags; each one given is remembered, as it needs a paged mode.
void add_paged_flags(FlagReader& r, RunRequest& q, std::vector<std::string>& given) {
  r.value("--rollout-tp-sizes", [&](const std::string& f, const std::string& v) {
    q.rollout_tp_sizes = parse_int_list(f, v);
    given.push_back(f);
  });
  r.value("--page-size", [&](const std::string& f, const std::string& v) {
    q.page_size = parse_int<int>(f, v, 1);
    given.push_back(f);
  });
  r.value("--split-kv-policies", [&](const std::string& f, const std::string& v) {
    q.split_policies = parse_names(f, v, "split-KV policy", kSplitPolicyNames);
    given.push_back(f);
  });
  r.value("--fixed-split-size", [&](const std::string& f, const std::string& v) {
    q.fixed_split_size = parse_int<std::int64_t>(f, v, 1);
    given.push_back(f);
  });
  r.value("--q-len", [&](const std::string& f, const std::string& v) {
    q.q_len = parse_int<std::int64_t>(f, v, 1);
    given.push_back(f);
  });
}

// Where the run executes.
void add_execution_flags(FlagReader& r, RunRequest& q) {
  r.value("--device", [&](const std::string& f, const std::string& v) {
    q.device = parse_name(f, v, "device", kDeviceNames);
  });
  r.value("--transport", [&](const std::string& f, const std::string& v) {
    q.transport = parse_name(f, v, "transport", kTransportNames);
  });
  r.value("--comm-timeout", [&](const std::string& f, const std::string& v) {
    q.comm_timeout_seconds = parse_threshold(f, v);
    if (q.comm_timeout_seconds <= 0) bad(f + ": must be more than 0 seconds");
    q.comm_timeout_given = true;
  });
  r.value("--staging-mib", [&](const std::string& f, const std::string& v) {
    q.staging_mib = parse_int<int>(f, v, 1);
  });
  r.toggle("--no-cpu-check", [&] { q.cpu_check = false; });
  r.value("--inject-fault",
          [&](const std::string& f, const std::string& v) { q.fault = parse_fault(f, v); });
  r.value("--round-rows", [&](const std::string& f, const std::string& v) {
    q.round_rows = parse_int<std::int64_t>(f, v, 1);
  });
}

// What the CLI does with the run's results.
void add_output_flags(FlagReader& r, RunOptions& o) {
  r.value("--output", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    o.output = v;
  });
  r.value("--dump", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    o.dump = v;
  });
  r.toggle("--dump-inputs", [&] { o.dump_inputs = true; });
  r.toggle("--overwrite", [&] { o.overwrite = true; });
  r.toggle("--json", [&] { o.json = true; });
  r.toggle("--quiet", [&] { o.quiet = true; });
  r.toggle("--progress", [&] { o.progress = true; });
  r.toggle("--smoke", [&] { o.smoke = true; });
}

// Combinations that no single flag can refuse.
void check_run_options(const RunOptions& o, const std::vector<std::string>& paged_flags,
                       bool modes_given) {
  const RunRequest& q = o.request;
  if (o.dump_inputs && o.dump.empty()) bad("--dump-inputs needs --dump PATH");
  if (o.request.include_lane_backward && !o.request.include_backward)
    bad("--include-lane-backward needs --include-backward (it is the backward's te_p2p lane)");
  if (q.fault && q.fault->kind == FaultKind::dump_write_error) {
    if (o.dump.empty()) bad("--inject-fault dump-write-error needs --dump PATH");
    if (q.fault->rank != 0)
      bad("--inject-fault dump-write-error@RANK: only rank 0 writes the dump");
  }
  if (!paged_flags.empty() && !q.runs(RunMode::paged_prefill) && !q.runs(RunMode::decode)) {
    bad(paged_flags.front() + " applies to the paged modes: add --modes ...,paged_prefill,decode");
  }
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

// `extra`: the flags of a command that takes the run's flags and more (plan).
// `inputs`: the --inputs file once opened (parse_command_line).
RunOptions parse_run(FlagReader& r, const std::vector<std::string>& args, std::size_t first,
                     const InputFileInfo* inputs,
                     const std::function<void(FlagReader&)>& extra = {}) {
  RunOptions o;
  RunRequest& q = o.request;
  bool seq_len_given = false, splits_given = false, modes_given = false, batch_given = false;
  std::vector<std::string> paged_flags;
  add_common_flags(r, q.problem, seq_len_given, q.threads);
  r.value("--batch", [&](const std::string& f, const std::string& v) {
    q.problem.batch = parse_int<int>(f, v, 1);
    batch_given = true;
  });
  r.value("--inputs", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    o.inputs = v;
  });
  add_case_flags(r, q, splits_given, modes_given);
  add_paged_flags(r, q, paged_flags);
  add_execution_flags(r, q);
  add_output_flags(r, o);
  if (extra) extra(r);
  r.read(args, first);
  if (!o.inputs.empty()) {
    // The file says B and S; its q, k, v replace the generator's.
    if (seq_len_given || batch_given)
      bad("--inputs: B and S come from the file; drop --seq-len and --batch");
    if (o.smoke) bad("--inputs: --smoke sets its own sequence; drop one of them");
    if (q.problem.distribution != InputDistribution::gaussian)
      bad("--inputs: the file's q, k, v are the inputs; drop --input-distribution");
    if (inputs == nullptr) return o;  // the rest is checked once the file says B and S
    q.problem.batch = inputs->batch;
    q.problem.seq_len = inputs->seq_len;
    seq_len_given = true;
  }
  check_run_options(o, paged_flags, modes_given);
  if (o.smoke) {
    if (!seq_len_given) q.problem.seq_len = 4;
    if (!splits_given) q.splits = {std::nullopt, 1};
  }
  // A split as long as the sequence cuts nothing: split-KV disabled under another name.
  const std::int64_t seq = q.problem.seq_len;
  for (std::optional<std::int64_t>& s : q.splits) {
    // A default that would cut nothing (a very short sequence) halves it instead.
    if (s && *s >= seq && !splits_given) s = std::max<std::int64_t>(1, seq / 2);
    if (s && *s >= seq && splits_given && seq > 1) {
      bad("--kv-chunk-sizes " + std::to_string(*s) + ": not shorter than the sequence (" +
          std::to_string(seq) + " tokens), so it cuts nothing: that is 'none'");
    }
  }
  return o;
}

PlanOptions parse_plan(FlagReader& r, const std::vector<std::string>& args, std::size_t first,
                       const InputFileInfo* inputs) {
  PlanOptions plan;
  bool figures_given = false;
  const auto figure = [&](const char* flag, double& slot) {
    r.value(flag, [&](const std::string& f, const std::string& v) {
      slot = parse_threshold(f, v);
      if (slot <= 0) bad(f + ": must be more than 0");
      figures_given = true;
    });
  };
  plan.run = parse_run(r, args, first, inputs, [&](FlagReader& fr) {
    fr.value("--profile", [&](const std::string& f, const std::string& v) {
      if (v != "h200" && v != "cpu") bad(f + ": unknown profile '" + v + "' (h200, cpu)");
      plan.profile = v;
    });
    figure("--bf16-tflops", plan.bf16_tflops);
    figure("--fp32-tflops", plan.fp32_tflops);
    figure("--hbm-tbs", plan.hbm_tbs);
    figure("--nvlink-gbs", plan.nvlink_gbs);
    figure("--network-gbs", plan.network_gbs);
    fr.value("--gpus-per-node", [&](const std::string& f, const std::string& v) {
      plan.gpus_per_node = parse_int<int>(f, v, 1);
    });
    fr.value("--processes", [&](const std::string& f, const std::string& v) {
      plan.processes = parse_int<int>(f, v, 1);
    });
  });
  // The run's execution flags say how a run moves and reports; a plan runs nothing.
  const RunRequest& q = plan.run.request;
  const RunRequest defaults;
  if (!plan.run.dump.empty()) bad("plan: --dump does not apply (a plan runs nothing)");
  if (plan.run.overwrite) bad("plan: --overwrite does not apply (a plan writes no dump)");
  if (plan.run.progress) bad("plan: --progress does not apply (a plan runs nothing)");
  if (q.threads != 0) {
    bad("plan: --threads does not apply (--profile cpu uses every core, shared by --processes)");
  }
  if (q.transport != defaults.transport ||
      q.comm_timeout_seconds != defaults.comm_timeout_seconds ||
      q.staging_mib != defaults.staging_mib) {
    bad("plan: --transport, --comm-timeout and --staging-mib do not apply (a plan moves nothing)");
  }
  if (q.fault) bad("plan: --inject-fault does not apply (a plan moves nothing)");
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
  r.value("--output", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    c.output = v;
  });
  r.toggle("--json", [&] { c.json = true; });
  r.toggle("--quiet", [&] { c.quiet = true; });
  r.value("--max-abs-delta", [&](const std::string& f, const std::string& v) {
    c.max_abs_delta = parse_threshold(f, v);
  });
  r.value("--ratio-band", [&](const std::string& f, const std::string& v) {
    c.metrics.ratio_band = parse_threshold(f, v);
  });
  r.value("--tis-clip", [&](const std::string& f, const std::string& v) {
    c.metrics.tis_clip = parse_threshold(f, v);
  });
  r.value("--worst", [&](const std::string& f, const std::string& v) {
    c.metrics.worst = parse_int<int>(f, v, 0);
  });
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

CommandLine parse_command_line(const std::vector<std::string>& args, const InputFileInfo* inputs) {
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
      cl.plan = parse_plan(r, args, first, inputs);
      break;
    case CommandLine::Command::compare:
      cl.compare = parse_compare(r, args, first, help);
      break;
    default:
      cl.run = parse_run(r, args, first, inputs);
  }
  if (help) cl.command = CommandLine::Command::help;
  return cl;
}

}  // namespace cpd
