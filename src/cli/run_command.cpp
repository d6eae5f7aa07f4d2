#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "agree.h"
#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cli/commands.h"
#include "cpdrift/cli/human_output.h"
#include "cpdrift/cli/provenance.h"
#include "cpdrift/comm/gpu_transports.h"
#include "cpdrift/core/errors.h"
#include "cpdrift/engine/merge_checks.h"
#include "simd_info.h"

namespace cpd {

int default_threads(const CommContext& comm) {
  // The CPUs this process may run on: a launcher that binds it (srun --cpus-per-task, mpirun
  // --bind-to) has said how many are its own; an unbound process shares the node's cores with
  // the other processes on it.
  const int node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : node;
  if (allowed > 0 && allowed < node) return allowed;
  return std::max(1, node / std::max(1, comm.local_size()));
}

namespace {

// Rank 0 opens the dump before any work, so a bad path fails the run up front on every rank.
std::unique_ptr<TensorDump> open_dump(const RunOptions& options, const CommContext& comm) {
  if (options.dump.empty()) return nullptr;
  if (!dump_supported()) open_tensor_dump(options.dump);  // throws the "built without" UsageError
  std::unique_ptr<TensorDump> dump;
  agree_or_throw(comm, comm.rank() == 0,
                 "--dump: ", [&] { dump = open_tensor_dump(options.dump); });
  return dump;
}

// Rank 0 makes sure the report can be written before any work: a long run must not end in an
// unwritable path.
void check_output_path(const std::string& path, const CommContext& comm) {
  if (path.empty()) return;
  agree_or_throw(comm, comm.rank() == 0, "--output: ", [&] {
    const std::string probe = path + ".tmp.check." + std::to_string(::getpid());
    FILE* f = std::fopen(probe.c_str(), "w");
    if (f == nullptr) {
      throw std::runtime_error("cannot write next to \"" + path + "\": " + std::strerror(errno));
    }
    std::fclose(f);
    std::remove(probe.c_str());
  });
}

// q, k, v after RoPE (FP32) written by rank 0 itself, a block of positions at a time: the
// inputs are a function of their coordinates, so nothing needs to travel.
void dump_inputs(TensorDump& dump, const Problem& p, ThreadPool& pool) {
  constexpr std::int64_t kRows = 256;
  for (const TensorId t : {TensorId::q, TensorId::k, TensorId::v}) {
    const int heads = t == TensorId::q ? p.dims.num_q_heads : p.dims.num_kv_heads;
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
  dump.annotate(
      "/",
      {{"schema_version", std::string("ws2_cp_attention_drift/v2")},
       {"producer", std::string("cpdrift ") + r.provenance.git_describe},
       {"created_at_utc", r.provenance.created_at_utc},
       {"command", r.provenance.command},
       {"model", std::string("qwen3-8b")},
       {"batch", std::int64_t{p.batch}},
       {"seq_len", p.seq_len},
       {"num_query_heads", std::int64_t{p.dims.num_q_heads}},
       {"num_kv_heads", std::int64_t{p.dims.num_kv_heads}},
       {"head_dim", std::int64_t{p.dims.head_dim}},
       {"seed", static_cast<std::int64_t>(p.seed)},
       {"dtype", std::string(to_string(p.dtype))},
       {"rope", std::string(p.rope ? "gpt_neox_rotate_half theta=1e6" : "not_composed")},
       {"layout_note", std::string("tensors are global [B, H, S, D] (out, inputs) or [B, H, S] "
                                   "(lse); BF16 tensors are stored as exact FP32 values")}});
}

// Test hook (tests/meson.build): the named process dies by SIGKILL as the first case starts,
// to show that a lost process ends the whole job instead of hanging it.
void maybe_die_for_test(const CommContext& comm) {
  const char* rank = std::getenv("CPDRIFT_TEST_KILL_RANK");
  if (rank != nullptr && std::atoi(rank) == comm.rank()) ::raise(SIGKILL);
}

}  // namespace

std::unique_ptr<AttentionBackend> select_backend(Device device, ThreadPool& pool,
                                                 const CommContext& comm) {
  const bool want_cuda =
      device == Device::cuda ||
      (device == Device::auto_select && cuda_backend_built() && cuda_device_count() > 0);
  if (!want_cuda) return make_cpu_backend(pool);
  // One GPU per process of the node: the node-local rank picks it. Every process agrees on
  // failure (a process without a usable device fails the job before any work).
  std::unique_ptr<AttentionBackend> backend;
  agree_or_throw(comm, true, "", [&] {
    const int count = cuda_device_count();
    backend = make_cuda_backend(count > 0 ? comm.local_rank() % count : 0);
  });
  return backend;
}

std::unique_ptr<Transport> select_transport(const RunOptions& options,
                                            const AttentionBackend& backend,
                                            const CommContext& comm) {
  if (options.transport == TransportChoice::auto_select ||
      options.transport == TransportChoice::mpi) {
    return make_mpi_transport(comm);
  }
  const bool nccl = options.transport == TransportChoice::nccl;
  if (!cuda_backend_built() || (nccl && !nccl_transport_built())) {
    return nccl ? make_nccl_transport(comm, {})
                : make_cuda_ipc_transport(comm, {});  // "built without CUDA/NCCL"
  }
  if (std::string(backend.name()) != "cuda") {
    throw UsageError(std::string("--transport ") + to_string(options.transport) +
                     " moves GPU buffers: it needs the CUDA backend (--device cuda)");
  }
  GpuTransportOptions o;
  o.device = comm.local_rank() % std::max(1, cuda_device_count());  // the backend's device
  o.timeout_seconds = options.comm_timeout_seconds;
  o.staging_bytes = static_cast<std::uint64_t>(options.staging_mib) << 20;
  return nccl ? make_nccl_transport(comm, o) : make_cuda_ipc_transport(comm, o);
}

RunReport execute_run(const RunOptions& options, const CommContext& comm,
                      const std::string& command_line) {
  const auto started = std::chrono::steady_clock::now();
  const std::vector<CaseSpec> specs = expand_cases(options);
  const std::vector<PagedCaseSpec> paged_specs = expand_paged_cases(options);
  if (specs.empty() && paged_specs.empty()) throw UsageError("--modes: nothing to run");
  check_output_path(options.output, comm);
  const std::unique_ptr<TensorDump> dump = open_dump(options, comm);
  const bool root = comm.rank() == 0;

  RunReport report;
  report.problem = options.problem;
  report.thresholds = options.thresholds;
  report.provenance = gather_provenance(comm, command_line);
  report.provenance.threads = options.threads > 0 ? options.threads : default_threads(comm);
  report.provenance.simd = cpu_simd_isa();

  ThreadPool pool(report.provenance.threads);
  const std::unique_ptr<AttentionBackend> backend = select_backend(options.device, pool, comm);
  const std::unique_ptr<Transport> transport = select_transport(options, *backend, comm);
  report.provenance.transport = transport->name();
  report.provenance.device = backend->device();
  report.provenance.cuda_available = cuda_device_count() > 0;

  // The table goes where the JSON does not.
  std::FILE* table = options.json ? stderr : stdout;
  const bool verbose = root && !options.quiet;
  const bool progress = verbose && (isatty(STDERR_FILENO) != 0 || options.problem.seq_len >= 1024);
  if (verbose) print_header(table, report, specs.size(), paged_specs.size());

  InputStore inputs(options.problem, pool, *backend);
  LocalCp1Results cp1_results;
  LocalCp1Backward cp1_backward;
  RunContext ctx{options.problem, pool, inputs, *transport, comm.collectives(), cp1_results};
  ctx.dump_requested = !options.dump.empty();
  ctx.dump = dump.get();
  ctx.cp1_backward = options.include_backward ? &cp1_backward : nullptr;
  ctx.vocab_size = options.include_dlogp ? options.vocab_size : 0;
  // On a GPU, the FP32 path runs on the CPU too: the report shows the two agree bit for bit.
  std::unique_ptr<AttentionBackend> cpu_backend;
  std::unique_ptr<InputStore> cpu_inputs;
  if (std::string(backend->name()) != "cpu" && options.cpu_check) {
    cpu_backend = make_cpu_backend(pool);
    cpu_inputs = std::make_unique<InputStore>(options.problem, pool, *cpu_backend);
    ctx.cpu_check = cpu_inputs.get();
  }
  report.vocab_size = ctx.vocab_size;

  report.merge_oracle_self_test = merge_oracle_self_test();
  if (options.problem.rope) report.rope = measure_rope_drift(ctx);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (progress) {
      std::fprintf(stderr, "cpdrift: [%zu/%zu] %s ...\n", i + 1, specs.size(),
                   case_name(specs[i], options.problem.dtype).c_str());
    }
    if (i == 0) maybe_die_for_test(comm);
    report.cases.push_back(run_case(ctx, specs[i]));
    if (verbose) print_case_row(table, report.cases.back());
  }
  if (!paged_specs.empty()) {
    if (progress) std::fprintf(stderr, "cpdrift: %zu paged cases ...\n", paged_specs.size());
    if (specs.empty()) maybe_die_for_test(comm);
    PagedOptions paged = paged_options(options);
    paged.progress = progress;
    report.paged_cases = run_paged_cases(ctx, paged, paged_specs);
    if (verbose) print_paged_rows(table, report);
  }
  // Rank 0 holds the digests, so its verdict is the job's: every process returns the same.
  report.failed_checks = evaluate_checks(report);
  std::string verdict;
  for (const std::string& f : report.failed_checks) verdict += f + '\n';
  verdict = comm.broadcast(verdict, 0);
  report.failed_checks.clear();
  for (std::size_t at = 0, nl; (nl = verdict.find('\n', at)) != std::string::npos; at = nl + 1) {
    report.failed_checks.push_back(verdict.substr(at, nl - at));
  }
  report.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  if (root) {
    const std::string text = json::to_string(report_json(report));
    if (dump) {
      if (options.dump_inputs) dump_inputs(*dump, options.problem, pool);
      annotate_file(*dump, report);
      dump->write_text("/report_json", text);
      dump->commit();
    }
    if (!options.output.empty()) json::write_file_atomic(options.output, text);
    if (options.json) std::fwrite(text.data(), 1, text.size(), stdout);
    if (verbose) {
      print_footer(table, report);
    } else {
      std::fprintf(table, "# Drift check : %s\n", report.passed() ? "OK" : "FAILED");
    }
  }
  return report;
}

int run_command(const RunOptions& options, const CommContext& comm,
                const std::string& command_line) {
  return execute_run(options, comm, command_line).passed() ? kExitOk : kExitChecksFailed;
}

}  // namespace cpd
