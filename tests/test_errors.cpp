// Every library check has one shape (style habit 3): a LibraryError whose text names the host,
// the rank, the file:line of the check, the call and the library's decoded error.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cpdrift/core/errors.h"
#include "cpdrift/io/tensor_dump.h"

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
