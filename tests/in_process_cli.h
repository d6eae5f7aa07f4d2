// In-process runs of the command line for MPI tests: cli_main (what main() calls once MPI is
// up) with stdout and stderr captured, and a scratch directory shared by the job's processes.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "mpi_support.h"

namespace cpd::testing {

namespace fs = std::filesystem;

// One invocation's fate on this process.
struct Outcome {
  int status = -1;
  std::string out, err;
};

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs `argv` through cli_main with this process's stdout and stderr sent to files.
inline Outcome invoke(const std::vector<std::string>& argv, const fs::path& capture) {
  std::fflush(stdout);
  std::fflush(stderr);
  const fs::path out_path = capture / "stdout", err_path = capture / "stderr";
  const int saved_out = ::dup(1), saved_err = ::dup(2);
  const int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE((saved_out >= 0 && saved_err >= 0 && out_fd >= 0 && err_fd >= 0));
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  Outcome o;
  o.status = cpd::cli_main(argv, comm());
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  for (const int fd : {saved_out, saved_err, out_fd, err_fd}) ::close(fd);
  o.out = read_file(out_path);
  o.err = read_file(err_path);
  return o;
}

// Every file under `dir` with its size, so that a file written, grown or removed shows.
inline std::string listing(const fs::path& dir) {
  std::string text;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    text += e.path().string();
    if (e.is_regular_file()) text += " " + std::to_string(e.file_size());
    text += "\n";
  }
  return text;
}

// The scratch directory of the job: rank 0 makes it (and removes it); every process works in it.
struct Scratch {
  fs::path dir;
  fs::path capture;  // per process, outside `dir`
  Scratch() {
    std::string made;
    if (comm().rank() == 0) {
      std::string pattern = (fs::temp_directory_path() / "cpdrift_in_process_XXXXXX").string();
      if (::mkdtemp(pattern.data()) != nullptr) made = pattern;
    }
    dir = comm().broadcast(made, 0);
    REQUIRE_MESSAGE(!dir.empty(), "rank 0 could not make a scratch directory");  // all ranks
    capture = dir.string() + ".capture." + std::to_string(comm().rank());
    fs::create_directories(capture);
    comm().barrier();
  }
  ~Scratch() {
    comm().barrier();
    std::error_code ec;
    fs::remove_all(capture, ec);
    if (comm().rank() == 0) fs::remove_all(dir, ec);
  }
};

}  // namespace cpd::testing
