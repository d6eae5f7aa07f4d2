#include "compare/logprob_stream.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/errors.h"
#include "core/util/sha256.h"

namespace cpd {

std::string LogprobStream::where(std::size_t i) const {
  if (format == "jsonl") return path + " line " + std::to_string(records[i].source_line);
  return path + " row " + std::to_string(i);
}

namespace stream_io {

SourceFile fingerprint(const std::string& path) {
  const FileDigest d = sha256_files({path});
  return SourceFile{path, d.size_bytes, d.sha256};
}

void take_top_columns(const std::vector<std::int64_t>& ids, const std::vector<double>& logprobs,
                      std::size_t rows, std::size_t k, const std::string& where, LogprobStream& s) {
  s.top_begin.assign(1, 0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t id = ids[i * k + j];
      if (id == -1) continue;  // padding: fewer than K entries
      if (id < 0) {
        throw UsageError(where + " row " + std::to_string(i) + ": top_ids holds " +
                         std::to_string(id) + " (token ids are >= 0, -1 pads)");
      }
      s.top_ids.push_back(id);
      s.top_logprobs.push_back(logprobs[i * k + j]);
    }
    s.top_begin.push_back(s.top_ids.size());
  }
}

}  // namespace stream_io

LogprobStream read_logprob_stream(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) {
    throw UsageError(path + ": no such file or directory");
  }
  LogprobStream s;
  s.path = path;
  if (std::filesystem::is_directory(st)) {
    s.format = "npy";
    stream_io::read_npy_columns(path, s);
    return s;
  }
  // HDF5's signature opens the file (a user block would move it; cpdrift's writers add none).
  char magic[8] = {};
  if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
    const std::size_t n = std::fread(magic, 1, sizeof magic, f);
    std::fclose(f);
    if (n == sizeof magic && std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0) s.format = "hdf5";
  } else {
    throw UsageError(path + ": cannot read: " + std::strerror(errno));
  }
  if (s.format == "hdf5") {
    stream_io::read_hdf5_columns(path, s);
  } else {
    s.format = "jsonl";
    stream_io::read_jsonl(path, s);
  }
  return s;
}

}  // namespace cpd
