// A private scratch directory for a test's files (mkdtemp under the system's temp directory),
// removed with everything in it when the test ends.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace cpd::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// Writes `bytes` to `name` in the directory; its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path p = path / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
};

}  // namespace cpd::testing
