// `cpdrift [run]`: checks where the outputs go, sets the engine up, runs it into the report,
// prints the table, writes the JSON report and the dump.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cli/commands.h"
#include "comm/agree.h"
#include "core/errors.h"
#include "core/util/partial_files.h"
#include "core/util/process_memory.h"
#include "core/util/temp_file_guard.h"
#include "engine/memory_plan.h"
#include "engine/run_session.h"
#include "kernels/cpu/inputs.h"
#include "kernels/layer_weights.h"
#include "report/run_recorder.h"

namespace cpd {
namespace {

// Rank 0 opens the dump before any work, so a bad path fails the run up front on every rank.
std::unique_ptr<TensorDump> open_dump(const RunOptions& options, const CommContext& comm) {
  if (options.dump.empty()) return nullptr;
  if (!dump_supported()) open_tensor_dump(options.dump);  // throws the "built without" UsageError
  std::unique_ptr<TensorDump> dump;
  agree_or_throw(comm, comm.rank() == 0,
                 "--dump: ", [&] { dump = open_tensor_dump(options.dump); });
  const std::optional<FaultSpec>& fault = options.request.fault;
  if (dump != nullptr && fault && fault->kind == FaultKind::dump_write_error)
    dump = with_write_fault(std::move(dump), options.dump, fault->when);
  return dump;
}

// The layer's hidden states [B, S, hidden] (FP32), what --inputs reads under --scope layer. The
// dump's pieces are [B, H, S] rows; here a token stands for H and a unit for S: a row a piece.
void dump_hidden(TensorDump& dump, const Problem& p) {
  const std::int64_t hidden = p.dims.hidden_size;
  dump.begin("/inputs/hidden", {p.batch, p.seq_len, hidden},
             {{"shape", std::string("[B, S, hidden]")},
              {"original_dtype", std::string(p.inputs ? p.inputs->info().dtype : "bfloat16")}});
  std::vector<float> row(static_cast<std::size_t>(hidden));
  for (int b = 0; b < p.batch; ++b) {
    for (std::int64_t s = 0; s < p.seq_len; ++s) {
      layer_hidden_row(p, b, s, row.data());
      dump.write(GlobalPiece{b, s, Range{0, hidden}, 0}, row.data());
    }
  }
  dump.end();
}

// q, k, v after RoPE (FP32) written by rank 0 itself, a block of positions at a time: the
// inputs are a function of their coordinates, so nothing needs to travel. The layer's: its
// hidden states.
void dump_inputs(TensorDump& dump, const Problem& p, ThreadPool& pool) {
  if (p.layer) return dump_hidden(dump, p);
  constexpr std::int64_t kRows = 256;
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const int heads = heads_of(p.dims, t);
    const char* name = t == TensorId::q ? "q" : t == TensorId::k ? "k" : "v";
    dump.begin(std::string("/inputs/") + name, {p.batch, heads, p.seq_len, p.dims.head_dim},
               {{"shape", std::string("[B, H, S, D]")},
                {"original_dtype", std::string("float32")},
                {"rope_applied", std::int64_t{p.rope && t != TensorId::v ? 1 : 0}}});
    for (std::int64_t s = 0; s < p.seq_len; s += kRows) {
      const Range tokens{s, std::min(p.seq_len, s + kRows)};
      const Shard rows =
          generate_shard(p, t, ShardShape{p.batch, Range{0, heads}, {tokens}, p.dims.head_dim},
                         InputPrecision::fp32, pool);
      for (int b = 0; b < p.batch; ++b) {
        for (int h = 0; h < heads; ++h) dump.write(GlobalPiece{b, h, tokens, 0}, rows.at(b, h, 0));
      }
    }
    dump.end();
  }
}

void annotate_file(TensorDump& dump, const RunReport& r) {
  const Problem& p = r.problem;
  // Where q, k, v came from: a distribution of the generator, or a file and its digest.
  if (p.inputs) {
    dump.annotate(
        "/", {{"inputs_file", p.inputs->info().path}, {"inputs_sha256", p.inputs->info().sha256}});
  } else {
    dump.annotate("/", {{"input_distribution", std::string(to_string(p.distribution))}});
  }
  dump.annotate(
      "/",
      {{"schema_version", std::string(kReportSchema)},
       {"producer", std::string("cpdrift ") + r.provenance.git_describe},
       {"created_at_utc", r.provenance.created_at_utc},
       {"command", r.provenance.command},
       {"model", p.dims.name},
       {"model_source", p.dims.source},
       {"batch", std::int64_t{p.batch}},
       {"seq_len", p.seq_len},
       {"num_query_heads", std::int64_t{p.dims.num_q_heads}},
       {"num_kv_heads", std::int64_t{p.dims.num_kv_heads}},
       {"head_dim", std::int64_t{p.dims.head_dim}},
       {"hidden_size", std::int64_t{p.dims.hidden_size}},
       {"seed", static_cast<std::int64_t>(p.seed)},
       {"dtype", std::string(to_string(p.dtype))},
       {"rope", p.rope ? "gpt_neox_rotate_half " + rope_text(p.dims.rope) : "not_composed"},
       {"layout_note", std::string("tensors are global [B, H, S, D] (out, inputs) or [B, H, S] "
                                   "(lse); BF16 tensors are stored as exact FP32 values")}});
}

// Rank 0's files and closing lines.
void write_outputs(const RunOptions& options, const RunReport& report, TensorDump* dump,
                   ThreadPool& pool, std::FILE* table, bool verbose) {
  const std::string text = json::to_string(report_json(report));
  if (dump != nullptr) {
    if (options.dump_inputs) dump_inputs(*dump, options.request.problem, pool);
    annotate_file(*dump, report);
    dump->write_text("/report_json", text);
    dump->commit();
  }
  if (!options.output.empty()) json::write_file_atomic(options.output, text);
  if (options.json) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);  // on its way before the outputs count as written
  }
  note_outputs_written();
  if (verbose) {
    print_footer(table, report);
  } else {
    std::fprintf(table, "# Drift check : %s\n", report.passed() ? "OK" : "FAILED");
  }
}

// `path` names a file (not a directory) that can be written where it is named: nothing is
// created on the way, so a missing directory is an error.
void check_writable(const char* flag, const std::string& path) {
  std::error_code ec;
  if (path.back() == '/' || std::filesystem::is_directory(path, ec)) {
    throw UsageError(std::string(flag) + " " + path + ": is a directory; name a file");
  }
  // Its own name, not a partial's: the probe lives for microseconds and is never a result.
  const std::string probe = path + ".cpdrift-probe." + std::to_string(::getpid());
  FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) {
    throw UsageError(std::string(flag) + ": cannot write next to \"" + path +
                     "\": " + std::strerror(errno));
  }
  std::fclose(f);
  std::remove(probe.c_str());
  // What an earlier run killed while writing this path left behind, said once.
  const std::string stale = stale_partials_warning(path);
  if (!stale.empty()) std::fprintf(stderr, "cpdrift: warning: %s\n", stale.c_str());
}

// The output files, checked on rank 0 before anything runs: each writable, not one file, and
// the dump replacing an existing file only with --overwrite.
void check_outputs(const RunOptions& o, const CommContext& comm) {
  namespace fs = std::filesystem;
  agree_or_throw(comm, comm.rank() == 0, "", [&] {
    if (!o.output.empty()) check_writable("--output", o.output);
    if (o.dump.empty()) return;
    check_writable("--dump", o.dump);
    std::error_code ec;
    if (!o.output.empty() &&
        fs::weakly_canonical(o.output, ec) == fs::weakly_canonical(o.dump, ec)) {
      throw UsageError("--output and --dump name the same file, " + o.dump +
                       ": the report and the dump need two");
    }
    if (fs::exists(o.dump, ec) && !o.overwrite) {
      throw UsageError("--dump " + o.dump + ": the file exists (--overwrite replaces it)");
    }
  });
}

// Refuses, before anything is allocated, a run whose planned peak on some process (cpdrift
// plan's estimate) exceeds the memory that process may count on.
void check_memory(const RunRequest& q, const RunPlan& plan, const CommContext& comm) {
  agree_or_throw(comm, true, "", [&] {
    const MemoryBudget budget = memory_budget(comm.local_size());
    if (budget.bytes == 0 || plan.cases.empty()) return;
    // The floor first: a grid of an absurd S would not fit itself.
    std::uint64_t need = process_memory_floor(q, plan, comm.size());
    if (need <= budget.bytes) {
      const int threads = q.threads > 0 ? q.threads : default_threads(comm);
      need = plan_run_peaks(q, plan, comm.size(), threads,
                            q.device == Device::cuda)[static_cast<std::size_t>(comm.rank())];
    }
    if (need > budget.bytes) {
      refuse_memory(comm.rank(), need, "at its peak (cpdrift plan's estimate)", budget,
                    "use more processes or nodes, a larger --kv-chunk-sizes split (each KV block "
                    "adds a state per query row), or a smaller --seq-len or --batch (cpdrift "
                    "plan shows each phase's buffers)");
    }
  });
}

}  // namespace

void refuse_memory(int rank, std::uint64_t need, const std::string& when,
                   const MemoryBudget& budget, const std::string& advice) {
  const auto gb = [](std::uint64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g GB", static_cast<double>(bytes) * 1e-9);
    return std::string(text);
  };
  throw UsageError("not enough memory: process " + std::to_string(rank) + " would need about " +
                   gb(need) + " " + when + " and may count on " + gb(budget.bytes) + " (" +
                   budget.source + "); " + advice);
}

void check_output_path(const std::string& path, const CommContext& comm) {
  if (path.empty()) return;
  agree_or_throw(comm, comm.rank() == 0, "", [&] { check_writable("--output", path); });
}

RunReport execute_run(const RunOptions& options, const CommContext& comm,
                      const std::string& command_line) {
  const auto started = std::chrono::steady_clock::now();
  const RunPlan plan = plan_run(options.request);
  check_outputs(options, comm);
  check_memory(options.request, plan, comm);
  const std::unique_ptr<TensorDump> dump = open_dump(options, comm);
  RunSession session(options.request, comm);
  RunReport report;
  RunRecorder recorder(report, session, comm, options.thresholds, command_line,
                       !options.dump.empty(), dump.get());

  // The table goes where the JSON does not.
  const bool root = comm.rank() == 0;
  std::FILE* table = options.json ? stderr : stdout;
  const bool verbose = root && !options.quiet;
  // Progress lines on a terminal, or when asked for (a batch job's log); never with --quiet.
  const bool progress = verbose && (isatty(STDERR_FILENO) != 0 || options.progress);
  if (verbose) {
    print_header(table, report, plan.cases.size(), plan.paged.size());
    recorder.on_case = [&](const CaseResult& c) { print_case_row(table, c); };
  }
  session.run(plan, recorder, progress);
  recorder.finish(started);
  if (root) write_outputs(options, report, dump.get(), session.pool(), table, verbose);
  return report;
}

}  // namespace cpd
