// Every library check has one shape (docs/style.md): a LibraryError whose text names the host,
// the rank, the file:line of the check, the call and the library's decoded error.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "core/errors.h"
#include "core/util/temp_file_guard.h"
#include "io/tensor_dump.h"

using namespace cpd;

namespace {

std::string host() {
  char name[256] = "?";
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

TEST_CASE("a failed library call: host, rank, file:line, the call, the decoded error") {
  set_error_rank(3);
  try {
    throw_library_error("MPI", "MPI_Send(buf, 1)", "MPI_ERR_RANK: invalid rank", "comm.cpp", 42);
    FAIL("throw_library_error returned");
  } catch (const LibraryError& e) {
    CHECK(e.library() == "MPI");
    CHECK(std::string(e.what()) ==
          host() + " rank 3 comm.cpp:42: MPI_Send(buf, 1) failed: MPI_ERR_RANK: invalid rank");
  }
  set_error_rank(-1);
}

TEST_CASE("CPD_H5_CHECK: HDF5's own failure becomes the same LibraryError") {
  if (!dump_supported()) {
    CHECK_THROWS_AS(open_tensor_dump("/tmp/x.h5"), UsageError);  // built without HDF5
    return;
  }
  const std::string path = "/tmp/cpdrift_test_errors_" + std::to_string(::getpid()) + ".h5";
  set_error_rank(0);
  {
    const std::unique_ptr<TensorDump> dump = open_tensor_dump(path);
    dump->begin("/cases/a", {1, 1, 4}, {});
    dump->end();
    try {
      dump->begin("/cases/a", {1, 1, 4}, {});  // the dataset exists: H5Dcreate2 refuses
      FAIL("a second dataset of the same name was created");
    } catch (const LibraryError& e) {
      const std::string what = e.what();
      CHECK(e.library() == "HDF5");
      // The dump and the reason first, then where: host, rank, source line, the call.
      CHECK(what.rfind("cannot write dump \"" + path + "\": ", 0) == 0);
      CHECK(what.find("(" + host() + " rank 0 ") != std::string::npos);
      CHECK(what.find("hdf5_dump.cpp:") != std::string::npos);
      CHECK(what.find("H5Dcreate2(") != std::string::npos);
      CHECK(what.find(" failed: ") != std::string::npos);
    }
  }
  set_error_rank(-1);
  std::remove(path.c_str());
}

namespace {

// What a child process writes on stderr when it raises SIGTERM after handle_interrupts(true)
// (and note_outputs_written(), when `written`), and whether it died of that signal.
std::pair<std::string, bool> interrupted_child(bool written) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    cpd::handle_interrupts(true);
    if (written) cpd::note_outputs_written();
    std::raise(SIGTERM);
    ::_exit(0);  // not reached
  }
  ::close(fds[1]);
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, buf + n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {text, WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM};
}

}  // namespace

TEST_CASE("an interrupt says whether the outputs were already written") {
  // Before: nothing was written. After note_outputs_written (the report and dump in place, as
  // when mpirun ends the job's other processes once one left with a failing status): say so.
  const auto [before, before_killed] = interrupted_child(false);
  CHECK(before == "cpdrift: interrupted by signal 15; no report written\n");
  CHECK(before_killed);
  const auto [after, after_killed] = interrupted_child(true);
  CHECK(after == "cpdrift: interrupted by signal 15 after its outputs were written\n");
  CHECK(after_killed);
}
