#include "compare/logprob_stream.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"
#include "core/util/npy_format.h"
#include "core/util/sha256.h"

namespace cpd {
namespace {

namespace fs = std::filesystem;

// The values of a .npy array's data as T, widened from its stored type.
template <class T>
std::vector<T> widen(const NpyHeader& h, const char* data) {
  std::vector<T> out(h.data_bytes() / static_cast<std::size_t>(h.itemsize));
  const auto from = [&](auto stored) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::memcpy(&stored, data + i * sizeof stored, sizeof stored);
      out[i] = static_cast<T>(stored);
    }
  };
  const int size = h.itemsize;
  if (h.kind == 'f') {
    size == 4 ? from(float{}) : from(double{});
  } else if (h.kind == 'i') {
    size == 1   ? from(std::int8_t{})
    : size == 2 ? from(std::int16_t{})
    : size == 4 ? from(std::int32_t{})
                : from(std::int64_t{});
  } else {  // 'u', 'b'
    size == 1   ? from(std::uint8_t{})
    : size == 2 ? from(std::uint16_t{})
    : size == 4 ? from(std::uint32_t{})
                : from(std::uint64_t{});
  }
  return out;
}

// Column `name` of a directory of .npy files (NumPy format 1.0–3.0, little-endian, C order).
std::optional<stream_io::Column> npy_column(const std::string& dir, const std::string& name,
                                            bool integers, bool required, LogprobStream& s) {
  const std::string path = (fs::path(dir) / (name + ".npy")).string();
  if (!fs::exists(path)) {
    if (required) throw UsageError(dir + ": no " + name + ".npy (a directory of .npy columns)");
    return std::nullopt;
  }
  const std::string text = stream_io::read_source(path, s);
  NpyHeader h;
  try {
    h = parse_npy_header(text);
  } catch (const std::runtime_error& e) {
    throw UsageError(path + ": " + e.what());
  }
  if (h.kind == 'f' && h.itemsize == 2) throw UsageError(path + ": float16: save float32 or 64");
  if (integers && h.kind == 'f') throw UsageError(path + ": must hold integers");
  if (text.size() != h.data_offset + h.data_bytes()) {
    throw UsageError(path + ": " + std::to_string(text.size() - h.data_offset) +
                     " bytes of data, shape " + h.shape_text() + " needs " +
                     std::to_string(h.data_bytes()) + " (truncated or not this shape)");
  }
  stream_io::Column c{path, h.shape, {}, {}};
  const char* data = text.data() + h.data_offset;
  if (integers) {
    c.ints = widen<std::int64_t>(h, data);
  } else {
    c.reals = widen<double>(h, data);
  }
  return c;
}

}  // namespace

std::string LogprobStream::where(std::size_t i) const {
  if (format == "jsonl") return path + " line " + std::to_string(records[i].source_line);
  return path + " row " + std::to_string(i);
}

std::string stream_io::read_source(const std::string& path, LogprobStream& s) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw UsageError(path + ": read error: " + std::strerror(errno));
  std::string text = std::move(buf).str();
  s.files.push_back(SourceFile{path, text.size(), sha256_hex(text)});
  return text;
}

void stream_io::take_columns(const ColumnReader& read, LogprobStream& s) {
  // Read in this order, which is the order a .npy directory's files are listed in.
  const Column seq = *read("sequence", true, true), pos = *read("position", true, true),
               tok = *read("token_id", true, true), lp = *read("logprob", false, true);
  const std::optional<Column> active = read("active", false, false);
  std::optional<Column> vocab = read("vocab_logprobs", false, false);
  const std::optional<Column> top_ids = read("top_ids", true, false),
                              top_lp = read("top_logprobs", false, false);
  if (lp.shape.size() != 1) throw UsageError(lp.label + ": must be 1-D (one logprob a record)");
  const std::int64_t n = lp.shape[0];
  for (const Column* c : {&seq, &pos, &tok, active ? &*active : nullptr}) {
    if (c != nullptr && c->shape != std::vector<std::int64_t>{n})
      throw UsageError(c->label + ": shape must be [" + std::to_string(n) + "] like logprob");
  }
  if (vocab) {
    if (vocab->shape.size() != 2 || vocab->shape[0] != n || vocab->shape[1] == 0)
      throw UsageError(vocab->label + ": shape must be [" + std::to_string(n) + ", V]");
    s.vocab_size = vocab->shape[1];
    s.vocab = std::move(vocab->reals);
  }
  if (top_ids.has_value() != top_lp.has_value())
    throw UsageError(s.path + ": top_ids and top_logprobs go together");
  if (top_ids) {
    if (top_ids->shape.size() != 2 || top_ids->shape[0] != n || top_lp->shape != top_ids->shape) {
      throw UsageError(s.path + ": top_ids and top_logprobs must both be [" + std::to_string(n) +
                       ", K]");
    }
    s.top_begin.assign(1, 0);
    const auto k = static_cast<std::size_t>(top_ids->shape[1]);
    for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
      for (std::size_t j = i * k; j < (i + 1) * k; ++j) {
        const std::int64_t id = top_ids->ints[j];
        if (id == -1) continue;  // padding: fewer than K entries
        if (id < 0) {
          throw UsageError(s.path + " row " + std::to_string(i) + ": top_ids holds " +
                           std::to_string(id) + " (token ids are >= 0, -1 pads)");
        }
        s.top_ids.push_back(id);
        s.top_logprobs.push_back(top_lp->reals[j]);
      }
      s.top_begin.push_back(s.top_ids.size());
    }
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    const char* names[] = {"sequence", "position", "token_id"};
    const std::int64_t ids[] = {seq.ints[i], pos.ints[i], tok.ints[i]};
    for (int f = 0; f < 3; ++f) {
      if (ids[f] < 0)
        throw UsageError(s.path + " row " + std::to_string(i) + ": " + names[f] + " is negative");
    }
    s.records.push_back(
        LogprobRecord{ids[0], ids[1], ids[2], lp.reals[i], !active || active->reals[i] != 0, 0});
    s.vocab_row.push_back(vocab ? static_cast<std::int64_t>(i) : -1);
  }
}

LogprobStream read_logprob_stream(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw UsageError(path + ": no such file or directory");
  LogprobStream s;
  s.path = path;
  if (fs::is_directory(st)) {
    s.format = "npy";
    stream_io::take_columns(
        [&](const std::string& name, bool integers, bool required) {
          return npy_column(path, name, integers, required, s);
        },
        s);
    return s;
  }
  // HDF5's signature opens the file (a user block would move it; cpdrift's writers add none).
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw UsageError(path + ": cannot read: " + std::strerror(errno));
  char magic[8] = {};
  const bool hdf5 = std::fread(magic, 1, sizeof magic, f) == sizeof magic &&
                    std::memcmp(magic, "\x89HDF\r\n\x1a\n", 8) == 0;
  std::fclose(f);
  if (hdf5) {
    s.format = "hdf5";
    stream_io::read_hdf5_columns(path, s);
  } else {
    s.format = "jsonl";
    stream_io::read_jsonl(path, s);
  }
  return s;
}

}  // namespace cpd
