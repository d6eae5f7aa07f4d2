#include "report/provenance.h"

#include <sys/utsname.h>

#include <cstdlib>
#include <ctime>
#include <string_view>
#if defined(__GLIBC__)
#include <gnu/libc-version.h>
#endif

#include "comm/gpu_transports.h"
#include "cpdrift_version.h"
#include "io/hdf5_info.h"
#include "kernels/attention_backend.h"

namespace cpd {

const char* git_describe() { return CPD_GIT_DESCRIBE; }

std::string shell_join(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) {
    if (!out.empty()) out += ' ';
    const bool plain =
        !a.empty() &&
        a.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
            std::string::npos;
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string platform_name() {
  // Python's platform.platform() on Linux: system, release and machine joined by '-', then
  // "with-glibc<version>"; characters it does not keep in a name become '_'.
  utsname u{};
  std::string name;
  if (uname(&u) == 0) {
    for (const char* part : {u.sysname, u.release, u.machine}) {
      if (*part == '\0') continue;
      if (!name.empty()) name += '-';
      name += part;
    }
  }
#if defined(__GLIBC__)
  name += std::string(name.empty() ? "" : "-") + "with-glibc" + gnu_get_libc_version();
#endif
  for (char& c : name) {
    if (std::string_view(" /\\:;\"()").find(c) != std::string_view::npos) c = '_';
  }
  return name;
}

Provenance gather_provenance(const CommContext& comm, const std::string& command_line) {
  Provenance pv;
  pv.command = command_line;
  pv.rank = comm.rank();
  pv.world_size = comm.size();
  pv.local_rank = comm.local_rank();
  pv.launcher = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? "mpirun"
                : std::getenv("SLURM_PROCID") != nullptr       ? "srun"
                                                               : "direct";
  pv.torchrun = std::getenv("TORCHELASTIC_RUN_ID") != nullptr;
  for (const char* name :
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
        "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"}) {
    if (const char* value = std::getenv(name)) pv.rank_env[name] = value;
  }
  pv.compiler = std::string("g++ ") + __VERSION__;
  pv.mpi_version = comm.library_version();
  pv.hdf5_version = hdf5_library_version();
  pv.cuda_version = cuda_runtime_version();
  pv.nccl_version = nccl_library_version();
  pv.git_describe = git_describe();
  pv.platform = platform_name();
  pv.created_at_utc = utc_now();
  return pv;
}

}  // namespace cpd
