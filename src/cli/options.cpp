#include "cpdrift/cli/options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>

#include "cpdrift/core/errors.h"

namespace cpd {

const char* to_string(Device d) {
  switch (d) {
    case Device::auto_select:
      return "auto";
    case Device::cpu:
      return "cpu";
    case Device::cuda:
      return "cuda";
  }
  return "?";
}

const char* to_string(TransportChoice t) {
  switch (t) {
    case TransportChoice::auto_select:
      return "auto";
    case TransportChoice::mpi:
      return "mpi";
    case TransportChoice::nccl:
      return "nccl";
    case TransportChoice::cuda_ipc:
      return "cuda_ipc";
  }
  return "?";
}

const char* to_string(RunMode m) {
  switch (m) {
    case RunMode::prefill:
      return "prefill";
    case RunMode::chunked_prefill:
      return "chunked_prefill";
    case RunMode::paged_prefill:
      return "paged_prefill";
    case RunMode::decode:
      return "decode";
  }
  return "?";
}

namespace {

[[noreturn]] void bad(const std::string& what) { throw UsageError(what); }

template <class Int>
Int parse_int(const std::string& flag, const std::string& text, Int min_value) {
  Int value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    bad(flag + ": expected an integer, got '" + text + "'");
  }
  if (value < min_value)
    bad(flag + ": must be at least " + std::to_string(min_value) + ", got " + text);
  return value;
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
  std::vector<int> values;
  for (const std::string& item : split_list(flag, text))
    values.push_back(parse_int<int>(flag, item, 1));
  return values;
}

std::vector<std::optional<std::int64_t>> parse_splits(const std::string& flag,
                                                      const std::string& text) {
  std::vector<std::optional<std::int64_t>> values;
  for (const std::string& item : split_list(flag, text)) {
    if (item == "none" || item == "full" || item == "no_split") {
      values.emplace_back(std::nullopt);
    } else {
      values.emplace_back(parse_int<std::int64_t>(flag + " (split size)", item, 1));
    }
  }
  return values;
}

// One name, matched against to_string of each value; an unknown name is an error listing them.
template <class T>
T parse_name(const std::string& flag, const std::string& item, const char* what,
             std::initializer_list<T> values) {
  for (const T v : values) {
    if (item == to_string(v)) return v;
  }
  std::string known;
  for (const T v : values) known += (known.empty() ? "" : ", ") + std::string(to_string(v));
  bad(flag + ": unknown " + what + " '" + item + "' (" + known + ")");
}

// A comma list of names.
template <class T>
std::vector<T> parse_names(const std::string& flag, const std::string& text, const char* what,
                           std::initializer_list<T> values) {
  std::vector<T> out;
  for (const std::string& item : split_list(flag, text))
    out.push_back(parse_name(flag, item, what, values));
  return out;
}

constexpr std::initializer_list<Device> kDevices = {Device::auto_select, Device::cpu, Device::cuda};

bool has(const std::vector<RunMode>& modes, RunMode m) {
  return std::find(modes.begin(), modes.end(), m) != modes.end();
}

// Walks argv, handing each flag's value (from `--flag value` or `--flag=value`) to its setter.
class FlagReader {
 public:
  using Setter = std::function<void(const std::string& flag, const std::string& value)>;
  using Switch = std::function<void()>;

  void value(const std::string& name, Setter s) { values_[name] = std::move(s); }
  void toggle(const std::string& name, Switch s) { toggles_[name] = std::move(s); }

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
      } else {
        bad("unknown option '" + args[i] + "' (see cpdrift --help)");
      }
    }
  }

 private:
  std::map<std::string, Setter> values_;
  std::map<std::string, Switch> toggles_;
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
    p.dtype = parse_name(f, v, "dtype", {DType::bf16, DType::fp32});
  });
  r.toggle("--no-rope", [&] { p.rope = false; });
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine cl;
  std::size_t first = 0;
  if (!args.empty() && (args[0] == "run" || args[0] == "bench" || args[0] == "accept")) {
    cl.command = args[0] == "run"     ? CommandLine::Command::run
                 : args[0] == "bench" ? CommandLine::Command::bench
                                      : CommandLine::Command::accept;
    first = 1;
  }
  FlagReader r;
  r.toggle("--help", [&] { cl.command = CommandLine::Command::help; });
  r.toggle("-h", [&] { cl.command = CommandLine::Command::help; });
  bool seq_len_given = false, splits_given = false;
  if (cl.command == CommandLine::Command::bench) {
    BenchOptions& b = cl.bench;
    b.problem.seq_len = 4096;
    add_problem_flags(r, b.problem, seq_len_given);
    r.value("--repeats", [&](const std::string& f, const std::string& v) {
      b.repeats = parse_int<int>(f, v, 1);
    });
    r.value("--threads", [&](const std::string& f, const std::string& v) {
      b.threads = parse_int<int>(f, v, 1);
    });
    r.value("--device", [&](const std::string& f, const std::string& v) {
      b.device = parse_name(f, v, "device", kDevices);
    });
    r.read(args, first);
    b.seq_len_given = seq_len_given;
    return cl;
  }
  if (cl.command == CommandLine::Command::accept) {
    AcceptOptions& a = cl.accept;
    a.problem.batch = 2;  // two sequences: the paged rows' batch composition needs a batch
    add_problem_flags(r, a.problem, seq_len_given);
    r.value("--mode", [&](const std::string& f, const std::string& v) {
      if (v != "manifest" && v != "run") bad(f + ": unknown mode '" + v + "' (manifest, run)");
      a.mode = v;
    });
    r.value("--output", [&](const std::string& f, const std::string& v) {
      if (v.empty()) bad(f + ": empty path");
      a.output = v;
    });
    r.value("--threads", [&](const std::string& f, const std::string& v) {
      a.threads = parse_int<int>(f, v, 1);
    });
    const auto threshold = [&](const char* flag, double& slot) {
      r.value(flag, [&slot](const std::string& f, const std::string& v) {
        slot = parse_threshold(f, v);
      });
    };
    threshold("--out-threshold", a.thresholds.out_max_abs);
    threshold("--lse-threshold", a.thresholds.lse_max_abs);
    threshold("--dlogp-threshold", a.thresholds.dlogp_max_abs);
    threshold("--gradient-threshold", a.thresholds.gradient_max_abs);
    threshold("--paged-out-threshold", a.thresholds.paged_out_max_abs);
    threshold("--paged-lse-threshold", a.thresholds.paged_lse_max_abs);
    threshold("--paged-dlogp-threshold", a.thresholds.paged_dlogp_max_abs);
    r.read(args, first);
    if (cl.command == CommandLine::Command::help) return cl;
    if (a.mode.empty()) bad("accept: --mode manifest|run is required");
    if (a.output.empty()) bad("accept: --output DIR/acceptance.json is required");
    return cl;
  }
  RunOptions& o = cl.run;
  add_problem_flags(r, o.problem, seq_len_given);
  r.value("--tp-world-sizes",
          [&](const std::string& f, const std::string& v) { o.tp_sizes = parse_int_list(f, v); });
  r.value("--cp-world-sizes",
          [&](const std::string& f, const std::string& v) { o.cp_sizes = parse_int_list(f, v); });
  r.value("--kv-chunk-sizes", [&](const std::string& f, const std::string& v) {
    o.splits = parse_splits(f, v);
    splits_given = true;
  });
  r.value("--cp-layouts", [&](const std::string& f, const std::string& v) {
    o.layouts = parse_names(f, v, "layout", {CpLayout::contiguous, CpLayout::zigzag});
  });
  r.value("--protocols", [&](const std::string& f, const std::string& v) {
    o.protocols =
        parse_names(f, v, "protocol", {Protocol::ag_rs, Protocol::ring_kv, Protocol::allgather_kv});
  });
  r.value("--transport", [&](const std::string& f, const std::string& v) {
    o.transport = parse_name(f, v, "transport",
                             {TransportChoice::auto_select, TransportChoice::mpi,
                              TransportChoice::nccl, TransportChoice::cuda_ipc});
  });
  r.value("--comm-timeout", [&](const std::string& f, const std::string& v) {
    o.comm_timeout_seconds = parse_threshold(f, v);
    if (o.comm_timeout_seconds <= 0) bad(f + ": must be more than 0 seconds");
  });
  r.value("--staging-mib", [&](const std::string& f, const std::string& v) {
    o.staging_mib = parse_int<int>(f, v, 1);
  });
  bool modes_given = false;
  r.value("--modes", [&](const std::string& f, const std::string& v) {
    o.modes = parse_names(
        f, v, "mode",
        {RunMode::prefill, RunMode::chunked_prefill, RunMode::paged_prefill, RunMode::decode});
    modes_given = true;
  });
  std::vector<std::string> paged_flags;
  r.value("--page-size", [&](const std::string& f, const std::string& v) {
    o.page_size = parse_int<int>(f, v, 1);
    paged_flags.push_back(f);
  });
  r.value("--split-kv-policies", [&](const std::string& f, const std::string& v) {
    o.split_policies =
        parse_names(f, v, "split-KV policy",
                    {SplitPolicy::disabled, SplitPolicy::fixed, SplitPolicy::auto_select});
    paged_flags.push_back(f);
  });
  r.value("--fixed-split-size", [&](const std::string& f, const std::string& v) {
    o.fixed_split_size = parse_int<std::int64_t>(f, v, 1);
    paged_flags.push_back(f);
  });
  r.value("--q-len", [&](const std::string& f, const std::string& v) {
    o.q_len = parse_int<std::int64_t>(f, v, 1);
    paged_flags.push_back(f);
  });
  r.value("--dump", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    o.dump = v;
  });
  r.toggle("--dump-inputs", [&] { o.dump_inputs = true; });
  r.toggle("--include-backward", [&] { o.include_backward = true; });
  r.toggle("--no-cpu-check", [&] { o.cpu_check = false; });
  r.toggle("--include-dlogp", [&] { o.include_dlogp = true; });
  r.value("--vocab-size", [&](const std::string& f, const std::string& v) {
    o.vocab_size = parse_int<int>(f, v, 2);
  });
  r.value("--device", [&](const std::string& f, const std::string& v) {
    o.device = parse_name(f, v, "device", kDevices);
  });
  r.value("--threads",
          [&](const std::string& f, const std::string& v) { o.threads = parse_int<int>(f, v, 1); });
  r.value("--output", [&](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    o.output = v;
  });
  r.toggle("--json", [&] { o.json = true; });
  r.toggle("--quiet", [&] { o.quiet = true; });
  r.toggle("--smoke", [&] { o.smoke = true; });
  r.read(args, first);
  if (o.dump_inputs && o.dump.empty()) bad("--dump-inputs needs --dump PATH");
  if (!paged_flags.empty() && !has(o.modes, RunMode::paged_prefill) &&
      !has(o.modes, RunMode::decode)) {
    bad(paged_flags.front() + " applies to the paged modes: add --modes ...,paged_prefill,decode");
  }
  const auto lists_split = [&](bool sized) {
    return std::any_of(o.splits.begin(), o.splits.end(),
                       [&](const auto& s) { return s.has_value() == sized; });
  };
  if (modes_given && has(o.modes, RunMode::prefill) && !lists_split(false)) {
    bad("--modes prefill: --kv-chunk-sizes lists no 'none' (split disabled)");
  }
  if (modes_given && has(o.modes, RunMode::chunked_prefill) && !lists_split(true)) {
    bad("--modes chunked_prefill: --kv-chunk-sizes lists no split size");
  }
  const bool fixed_requested = std::find(o.split_policies.begin(), o.split_policies.end(),
                                         SplitPolicy::fixed) != o.split_policies.end();
  if (o.fixed_split_size && !fixed_requested) {
    bad("--fixed-split-size needs the fixed policy in --split-kv-policies");
  }
  if (o.smoke) {
    if (!seq_len_given) o.problem.seq_len = 4;
    if (!splits_given) o.splits = {std::nullopt, 1};
  }
  return cl;
}

std::vector<CaseSpec> expand_cases(const RunOptions& o) {
  std::vector<CaseSpec> cases;
  for (int tp : o.tp_sizes) {
    for (int cp : o.cp_sizes) {
      for (const auto& split : o.splits) {
        if (!has(o.modes, split ? RunMode::chunked_prefill : RunMode::prefill)) continue;
        for (CpLayout layout : o.layouts) {
          for (Protocol protocol : o.protocols) {
            CaseSpec spec{tp, cp, split, layout, protocol};
            const std::string name = case_name(spec, o.problem.dtype);
            if (const std::string why = validate_case(spec, o.problem); !why.empty()) {
              throw UsageError(name + ": " + why);
            }
            for (const CaseSpec& c : cases) {
              if (case_name(c, o.problem.dtype) == name) {
                throw UsageError(
                    name + " is listed twice (a repeated size, or none/full/no_split together)");
              }
            }
            cases.push_back(spec);
          }
        }
      }
    }
  }
  return cases;
}

PagedOptions paged_options(const RunOptions& o) {
  return PagedOptions{o.page_size, o.q_len, o.vocab_size, false};
}

std::vector<PagedCaseSpec> expand_paged_cases(const RunOptions& o) {
  std::vector<PagedCaseSpec> cases;
  if (!has(o.modes, RunMode::paged_prefill) && !has(o.modes, RunMode::decode)) return cases;
  make_paged_workload(o.problem, o.page_size,
                      o.q_len);  // throws UsageError when it cannot be built
  const std::int64_t fixed = o.fixed_split_size.value_or(4 * std::int64_t{o.page_size});
  if (fixed % o.page_size != 0) {
    bad("--fixed-split-size " + std::to_string(fixed) + ": must be a multiple of --page-size " +
        std::to_string(o.page_size));
  }
  std::vector<SplitPolicy> policies;
  for (const SplitPolicy p : o.split_policies) {
    if (std::find(policies.begin(), policies.end(), p) != policies.end()) {
      bad(std::string("--split-kv-policies: ") + to_string(p) + " is listed twice");
    }
    policies.push_back(p);
  }
  // Plan-major, so each plan's lanes run once for both modes.
  for (const SplitPolicy p : policies) {
    for (const PagedMode m : {PagedMode::paged_prefill, PagedMode::decode}) {
      if (!has(o.modes, m == PagedMode::decode ? RunMode::decode : RunMode::paged_prefill))
        continue;
      cases.push_back(PagedCaseSpec{m, SplitKv{p, p == SplitPolicy::fixed ? fixed : 0}});
    }
  }
  return cases;
}

std::string usage_text() {
  return R"(usage: cpdrift [run] [options]        measure CP attention drift (Qwen3-8B attention)
       cpdrift bench [options]        kernel throughput: CPU FP32 and BF16-emulated, or with
                                      --device cuda the GPU paths vs PyTorch SDPA
       cpdrift accept --mode manifest|run --output DIR/acceptance.json
                                      the fail-closed acceptance matrix (design section 7)

Launch one process per GPU (or any number on the CPU): mpirun -np N cpdrift ...

Problem
  --model qwen3-8b             Hq=32 Hkv=8 D=128, causal, RoPE theta=1e6 (the only model)
  --batch N                    sequences (default 1; accept: 2)
  --seq-len N                  tokens per sequence (default 16; bench: 4096, or 4096 and
                               16384 on CUDA)
  --seed N                     input seed (default 2355)
  --dtype bf16|fp32            candidate dtype (default bf16)
  --no-rope                    attention only, no RoPE on q/k
Cases (every combination runs, in this order)
  --tp-world-sizes LIST        tensor-parallel sizes, must divide 32 and 8 (default 1,2)
  --cp-world-sizes LIST        context-parallel sizes (default 1,2)
  --kv-chunk-sizes LIST        split-KV sizes in tokens; none/full/no_split = disabled
                               (default none,4)
  --cp-layouts LIST            contiguous,zigzag (default contiguous)
  --protocols LIST             ag_rs,ring_kv,allgather_kv (default ag_rs); all give the same bits
  --smoke                      seq-len 4 and chunks none,1 unless given explicitly
  --modes LIST                 prefill,chunked_prefill (the CP cases above, split none / sized)
                               and the rollout side's paged_prefill,decode (default
                               prefill,chunked_prefill)
Paged cases (--modes paged_prefill,decode; TP=1, sequence b holds S - b*(S/4B) - b tokens,
the first pages a prompt shared by all, q-len query tokens at each end)
  --page-size N                KV cache page size in tokens (default 16)
  --split-kv-policies LIST     disabled,fixed,auto (default disabled,fixed); auto is a
                               diagnostic and never passes an invariance check
  --fixed-split-size N         the fixed policy's split in tokens, a multiple of the page
                               size (default 4 pages)
  --q-len N                    query tokens per sequence (default min(16, room / 2))
Execution and output
  --device auto|cpu|cuda       compute backend (default auto: cuda when built and present)
  --transport auto|mpi|nccl|cuda_ipc
                               how partial states move between processes (default auto: mpi);
                               nccl and cuda_ipc stage through GPU memory (--device cuda)
  --comm-timeout S             GPU transports: a wait longer than S seconds ends the job
                               (default 300)
  --staging-mib N              cuda_ipc: receive window per process, in MiB (default 64)
  --threads N                  CPU threads per process (default: cores / processes per node)
  --no-cpu-check               on the GPU, skip re-running the FP32 path on the CPU (cuda_vs_cpu_fp32)
  --output PATH                write the JSON report (atomically)
  --include-backward           also the FP32 backward (dq, dk, dv) vs the CP=1 reference
  --include-dlogp              also the selected-token logprob drift (synthetic lm_head)
  --vocab-size V               vocabulary of the synthetic lm_head (default 17)
  --json                       print the JSON report on stdout (the table goes to stderr)
  --dump PATH                  write the tensors (HDF5) from rank 0, one piece at a time
  --dump-inputs                also dump q, k, v (after RoPE) into the --dump file
  --quiet                      only the verdict line and errors
  -h, --help                   this text

Accept (writes DIR/acceptance.json and, in run mode, DIR/report.json)
  --out-threshold X --lse-threshold X --dlogp-threshold X --gradient-threshold X
  --paged-out-threshold X --paged-lse-threshold X --paged-dlogp-threshold X
                               override design section 7's thresholds

Exit status: 0 checks passed, 1 a drift check failed, 2 bad input (nothing ran),
3 a failure while running.
)";
}

}  // namespace cpd
