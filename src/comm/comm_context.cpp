#include "comm/comm_context.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "comm/comm_impl.h"
#include "comm/mpi_check.h"
#include "comm/mpi_wait.h"
#include "core/util/sha256.h"

namespace cpd {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw_library_error("MPI", call, std::string(text, static_cast<std::size_t>(len)), file, line);
}

namespace {

// Point-to-point messages carry at most this many floats (MPI counts are int).
constexpr std::size_t kMaxFloatsPerMessage = std::size_t{1} << 28;
constexpr int kStreamTag = 7001;

// An in-place reduction of `n` values over every process of `comm`.
void allreduce(MPI_Comm comm, void* values, int n, MPI_Datatype type, MPI_Op op) {
  MPI_Request r;
  CPD_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, n, type, op, comm, &r));
  wait_one(r);
}

}  // namespace

// Every owner sends its segments to rank 0 in list order; rank 0 receives them in list order.
// MPI keeps the order of messages between a pair on one tag, so rank 0 always gets the
// segment it asks for next, and holds one segment at a time.
void CommContext::stream_to_root(std::span<const StreamSegment> segments,
                                 const std::function<void(std::size_t, const float*)>& sink) const {
  const MPI_Comm world = impl_->world;
  // Segment s sent to rank 0 from its owner (`into` null), or received there into `into`, in
  // pieces MPI can count.
  const auto move = [&](const StreamSegment& s, float* into) {
    for (std::size_t at = 0; at < s.floats; at += kMaxFloatsPerMessage) {
      const int n = static_cast<int>(std::min(kMaxFloatsPerMessage, s.floats - at));
      MPI_Request r;
      if (into == nullptr) {
        CPD_MPI_CHECK(MPI_Isend(s.data + at, n, MPI_FLOAT, 0, kStreamTag, world, &r));
      } else {
        CPD_MPI_CHECK(MPI_Irecv(into + at, n, MPI_FLOAT, s.owner, kStreamTag, world, &r));
      }
      wait_one(r);
    }
  };
  std::vector<float> buffer;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const StreamSegment& s = segments[i];
    if (rank_ == 0 && s.owner == 0) {
      sink(i, s.data);
    } else if (rank_ == 0) {
      buffer.resize(s.floats);
      move(s, buffer.data());
      sink(i, buffer.data());
    } else if (s.owner == rank_) {
      move(s, nullptr);
    }
  }
}

CommContext::CommContext(int* argc, char*** argv) : impl_(std::make_unique<Impl>()) {
  int provided = 0;
  CPD_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes and become exceptions, instead of MPI aborting on its own.
  CPD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  CPD_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &impl_->world));
  CPD_MPI_CHECK(MPI_Comm_rank(impl_->world, &rank_));
  set_error_rank(rank_);
  CPD_MPI_CHECK(MPI_Comm_size(impl_->world, &size_));
  CPD_MPI_CHECK(
      MPI_Comm_split_type(impl_->world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &impl_->node));
  CPD_MPI_CHECK(MPI_Comm_rank(impl_->node, &local_rank_));
  CPD_MPI_CHECK(MPI_Comm_size(impl_->node, &local_size_));
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
  if (size_ > 1 && !values.empty())
    allreduce(impl_->world, values.data(), static_cast<int>(values.size()), MPI_UINT64_T, MPI_SUM);
}

void CommContext::allreduce_max(std::span<std::uint64_t> values) const {
  if (size_ > 1 && !values.empty())
    allreduce(impl_->world, values.data(), static_cast<int>(values.size()), MPI_UINT64_T, MPI_MAX);
}

bool CommContext::any(bool flag) const {
  int value = flag ? 1 : 0;
  if (size_ > 1) allreduce(impl_->world, &value, 1, MPI_INT, MPI_LOR);
  return value != 0;
}

std::string CommContext::broadcast(const std::string& text, int root) const {
  std::uint64_t length = text.size();
  MPI_Request r;
  CPD_MPI_CHECK(MPI_Ibcast(&length, 1, MPI_UINT64_T, root, impl_->world, &r));
  wait_one(r);
  std::string out = rank_ == root ? text : std::string(length, '\0');
  if (length > 0) {
    MPI_Request r;
    CPD_MPI_CHECK(
        MPI_Ibcast(out.data(), static_cast<int>(length), MPI_CHAR, root, impl_->world, &r));
    wait_one(r);
  }
  return out;
}

bool CommContext::same_everywhere(const std::string& text) const {
  if (size_ == 1) return true;
  const std::string digest = sha256_hex(text);
  const std::uint64_t h = std::stoull(digest.substr(0, 16), nullptr, 16);
  // The max of h and of ~h: both equal to this process's only if all agree.
  std::uint64_t v[2] = {h, ~h};
  allreduce(impl_->world, v, 2, MPI_UINT64_T, MPI_MAX);
  return v[0] == h && v[1] == ~h;
}

std::string CommContext::agree(const std::string& local_error) const {
  if (size_ == 1) return local_error;
  int first = local_error.empty() ? size_ : rank_;
  allreduce(impl_->world, &first, 1, MPI_INT, MPI_MIN);
  if (first == size_) return "";
  return broadcast(local_error, first);
}

std::vector<std::string> CommContext::allgather(const std::string& bytes) const {
  const auto n = static_cast<std::size_t>(size_);
  std::vector<int> lengths(n), offsets(n);
  const int mine = static_cast<int>(bytes.size());
  MPI_Request r;
  CPD_MPI_CHECK(MPI_Iallgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, impl_->world, &r));
  wait_one(r);
  int total = 0;
  for (std::size_t p = 0; p < n; ++p) {
    offsets[p] = total;
    total += lengths[p];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  CPD_MPI_CHECK(MPI_Iallgatherv(bytes.data(), mine, MPI_CHAR, all.data(), lengths.data(),
                                offsets.data(), MPI_CHAR, impl_->world, &r));
  wait_one(r);
  std::vector<std::string> out;
  for (std::size_t p = 0; p < n; ++p)
    out.push_back(all.substr(static_cast<std::size_t>(offsets[p]), lengths[p]));
  return out;
}

void CommContext::alltoall(std::span<const std::uint64_t> send,
                           std::span<std::uint64_t> recv) const {
  MPI_Request r;
  CPD_MPI_CHECK(
      MPI_Ialltoall(send.data(), 1, MPI_UINT64_T, recv.data(), 1, MPI_UINT64_T, impl_->world, &r));
  wait_one(r);
}

void CommContext::barrier() const {
  MPI_Request r;
  CPD_MPI_CHECK(MPI_Ibarrier(impl_->world, &r));
  wait_one(r);
}

void CommContext::set_wait_timeout(double seconds) const { cpd::set_wait_timeout(seconds, rank_); }

void CommContext::abort(int status) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(impl_->world, status);
  std::_Exit(status);
}

}  // namespace cpd
