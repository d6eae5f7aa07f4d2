// The subcommands main() dispatches to. Each returns the process's exit status.
#pragma once

#include "cpdrift/backend/attention_backend.h"
#include "cpdrift/cli/options.h"
#include "cpdrift/comm/comm_context.h"
#include "cpdrift/report/run_report.h"

namespace cpd {

/// Runs every case, writes the report (and dump), prints the table; returns the report (its
/// statistics on every process, its digests on rank 0).
RunReport execute_run(const RunOptions& options, const CommContext& comm,
                      const std::string& command_line);

/// execute_run's exit status: 0 when every check passed, 1 else.
int run_command(const RunOptions& options, const CommContext& comm,
                const std::string& command_line);

/// `cpdrift accept`: the acceptance matrix, written as ws2_attention_gpu_acceptance/v1; 0 only
/// when every required row passed.
int accept_command(const AcceptOptions& options, const CommContext& comm,
                   const std::string& command_line);

/// Prints FP32-reference and BF16-emulated forward throughput.
int bench_command(const BenchOptions& options, const CommContext& comm);

/// The compute backend `device` asks for (auto: CUDA when built and a device is present).
/// Collective: a process that cannot have it fails every process with one UsageError.
std::unique_ptr<AttentionBackend> select_backend(Device device, ThreadPool& pool,
                                                 const CommContext& comm);

/// The transport `options.transport` asks for (auto: mpi). The GPU transports need the CUDA
/// backend and use its device. Throws UsageError (on every process alike) when unavailable.
std::unique_ptr<Transport> select_transport(const RunOptions& options,
                                            const AttentionBackend& backend,
                                            const CommContext& comm);

/// Threads per process when not given: the cores of the node shared among its processes.
int default_threads(const CommContext& comm);

}  // namespace cpd
