// A directory of NumPy .npy columns (format versions 1.0–3.0, little-endian, C order):
// sequence.npy, position.npy, token_id.npy, logprob.npy [N], optional active.npy [N] and
// vocab_logprobs.npy [N, V].
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "compare/logprob_stream.h"
#include "core/errors.h"
#include "core/util/npy_format.h"
#include "core/util/sha256.h"

namespace cpd::stream_io {
namespace {

struct NpyArray {
  std::string path;
  char kind = 0;  // 'i', 'u', 'f' or 'b'
  int itemsize = 0;
  std::vector<std::int64_t> shape;
  std::string bytes;  // the data, C order
  std::size_t count() const {
    std::size_t n = 1;
    for (const std::int64_t d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  template <class T>
  T at(std::size_t i) const {
    const char* p = bytes.data() + i * static_cast<std::size_t>(itemsize);
    const auto load = [&](auto tag) {
      decltype(tag) x;
      std::memcpy(&x, p, sizeof x);
      return static_cast<T>(x);
    };
    switch (kind) {
      case 'f':
        return itemsize == 4 ? load(float{}) : load(double{});
      case 'u':
        switch (itemsize) {
          case 1:
            return load(std::uint8_t{});
          case 2:
            return load(std::uint16_t{});
          case 4:
            return load(std::uint32_t{});
          default:
            return load(std::uint64_t{});
        }
      case 'b':
        return load(std::uint8_t{});
      default:
        switch (itemsize) {
          case 1:
            return load(std::int8_t{});
          case 2:
            return load(std::int16_t{});
          case 4:
            return load(std::int32_t{});
          default:
            return load(std::int64_t{});
        }
    }
  }
};

NpyArray read_npy(const std::string& path, LogprobStream& s) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  s.files.push_back(SourceFile{path, text.size(), sha256_hex(text)});
  NpyHeader h;
  try {
    h = parse_npy_header(text);
  } catch (const std::runtime_error& e) {
    throw UsageError(path + ": " + e.what());
  }
  if (h.kind == 'f' && h.itemsize == 2) throw UsageError(path + ": float16: save float32 or 64");
  NpyArray a;
  a.path = path;
  a.kind = h.kind;
  a.itemsize = h.itemsize;
  a.shape = h.shape;
  if (text.size() != h.data_offset + h.data_bytes()) {
    throw UsageError(path + ": " + std::to_string(text.size() - h.data_offset) +
                     " bytes of data, shape " + h.shape_text() + " needs " +
                     std::to_string(h.data_bytes()) + " (truncated or not this shape)");
  }
  a.bytes = text.substr(h.data_offset);
  return a;
}

}  // namespace

void read_npy_columns(const std::string& dir, LogprobStream& s) {
  const auto column = [&](const char* name, bool required) -> std::optional<NpyArray> {
    const std::string path = (std::filesystem::path(dir) / (std::string(name) + ".npy")).string();
    if (!std::filesystem::exists(path)) {
      if (required) throw UsageError(dir + ": no " + name + ".npy (a directory of .npy columns)");
      return std::nullopt;
    }
    return read_npy(path, s);
  };
  const NpyArray seq = *column("sequence", true), pos = *column("position", true),
                 tok = *column("token_id", true), lp = *column("logprob", true);
  const std::optional<NpyArray> active = column("active", false);
  const std::optional<NpyArray> vocab = column("vocab_logprobs", false);
  const std::size_t n = lp.count();
  for (const NpyArray* a : {&seq, &pos, &tok, &lp, active ? &*active : nullptr}) {
    if (a == nullptr) continue;
    if (a->shape.size() != 1 || a->count() != n) {
      throw UsageError(a->path + ": shape must be [" + std::to_string(n) + "] like logprob.npy");
    }
  }
  for (const NpyArray* a : {&seq, &pos, &tok}) {
    if (a->kind == 'f') throw UsageError(a->path + ": must hold integers");
  }
  if (vocab && (vocab->shape.size() != 2 || vocab->shape[0] != static_cast<std::int64_t>(n) ||
                vocab->shape[1] == 0)) {
    throw UsageError(vocab->path + ": shape must be [" + std::to_string(n) + ", V]");
  }
  for (std::size_t i = 0; i < n; ++i) {
    LogprobRecord r;
    const std::int64_t fields[3] = {seq.at<std::int64_t>(i), pos.at<std::int64_t>(i),
                                    tok.at<std::int64_t>(i)};
    for (int f = 0; f < 3; ++f) {
      const NpyArray& a = f == 0 ? seq : f == 1 ? pos : tok;
      if (fields[f] < 0 || (a.kind == 'u' && a.itemsize == 8 && a.at<std::uint64_t>(i) >> 63))
        throw UsageError(dir + " row " + std::to_string(i) + ": " +
                         std::filesystem::path(a.path).filename().string() + " is negative");
    }
    r.sequence = fields[0];
    r.position = fields[1];
    r.token_id = fields[2];
    r.logprob = lp.at<double>(i);
    if (active) r.active = active->at<std::int64_t>(i) != 0;
    s.records.push_back(r);
    s.vocab_row.push_back(vocab ? static_cast<std::int64_t>(i) : -1);
  }
  const std::optional<NpyArray> top_ids = column("top_ids", false);
  const std::optional<NpyArray> top_lp = column("top_logprobs", false);
  if (top_ids.has_value() != top_lp.has_value())
    throw UsageError(dir + ": top_ids.npy and top_logprobs.npy go together");
  if (top_ids) {
    if (top_ids->shape.size() != 2 || top_ids->shape[0] != static_cast<std::int64_t>(n) ||
        top_lp->shape != top_ids->shape || top_ids->kind == 'f') {
      throw UsageError(dir + ": top_ids.npy (integers) and top_logprobs.npy must both be [" +
                       std::to_string(n) + ", K]");
    }
    std::vector<std::int64_t> ids(top_ids->count());
    std::vector<double> lps(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = top_ids->at<std::int64_t>(i);
      lps[i] = top_lp->at<double>(i);
    }
    take_top_columns(ids, lps, n, static_cast<std::size_t>(top_ids->shape[1]), dir, s);
  }
  if (vocab) {
    s.vocab_size = vocab->shape[1];
    s.vocab.resize(vocab->count());
    for (std::size_t i = 0; i < s.vocab.size(); ++i) s.vocab[i] = vocab->at<double>(i);
  }
}

}  // namespace cpd::stream_io
