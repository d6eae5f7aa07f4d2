#include "cpdrift/comm/comm_context.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "comm_impl.h"
#include "mpi_check.h"

namespace cpd {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  int rank = -1, initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw CommError(std::string(host) + " rank " + std::to_string(rank) + " " + file + ":" +
                  std::to_string(line) + ": " + call + " failed: " + text);
}

namespace {

class MpiReducer final : public CounterReducer {
 public:
  explicit MpiReducer(const CommContext& comm) : comm_(comm) {}
  void sum(std::span<std::uint64_t> v) const override { comm_.allreduce_sum(v); }
  void max(std::span<std::uint64_t> v) const override { comm_.allreduce_max(v); }

 private:
  const CommContext& comm_;
};

}  // namespace

CommContext::CommContext(int* argc, char*** argv) : impl_(std::make_unique<Impl>()) {
  int provided = 0;
  CPD_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes and become exceptions, instead of MPI aborting on its own.
  CPD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CPD_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->world));
  CPD_MPI_CHECK(MPI_Comm_rank(impl_->world, &rank_));
  CPD_MPI_CHECK(MPI_Comm_size(impl_->world, &size_));
  CPD_MPI_CHECK(
      MPI_Comm_split_type(impl_->world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &impl_->node));
  CPD_MPI_CHECK(MPI_Comm_rank(impl_->node, &local_rank_));
  CPD_MPI_CHECK(MPI_Comm_size(impl_->node, &local_size_));
  reducer_ = std::make_unique<MpiReducer>(*this);
}

CommContext::~CommContext() {
  MPI_Comm_free(&impl_->node);
  MPI_Comm_free(&impl_->world);
  MPI_Finalize();
}

std::string CommContext::library_version() const {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, static_cast<std::size_t>(len));
  if (const std::size_t nl = v.find_first_of(",\n"); nl != std::string::npos) v.resize(nl);
  return v;
}

void CommContext::allreduce_sum(std::span<std::uint64_t> values) const {
  if (size_ == 1 || values.empty()) return;
  CPD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                              MPI_UINT64_T, MPI_SUM, impl_->world));
}

void CommContext::allreduce_max(std::span<std::uint64_t> values) const {
  if (size_ == 1 || values.empty()) return;
  CPD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                              MPI_UINT64_T, MPI_MAX, impl_->world));
}

bool CommContext::any(bool flag) const {
  int value = flag ? 1 : 0;
  if (size_ > 1)
    CPD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_LOR, impl_->world));
  return value != 0;
}

void CommContext::barrier() const { CPD_MPI_CHECK(MPI_Barrier(impl_->world)); }

void CommContext::abort(int status) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(impl_->world, status);
  std::_Exit(status);
}

}  // namespace cpd
