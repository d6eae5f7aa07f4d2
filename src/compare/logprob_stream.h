// Per-token logprob records that an engine wrote (a trainer, a rollout engine), as
// `cpdrift compare TRAIN ROLLOUT` reads them (docs/compare.md):
//   JSON Lines   one object per line: {"sequence", "position", "token_id", "logprob"}, optional
//                "active" (default true), "vocab_logprobs" (the full vocabulary's logprobs at
//                that position) and "top_logprobs" ({"id": logprob, …} or [[id, logprob], …]);
//                other members are ignored
//   HDF5         datasets /sequence, /position, /token_id, /logprob, [/active], [N] each,
//                [/vocab_logprobs] [N, V], [/top_ids] (-1 pads) and [/top_logprobs] [N, K]
//   .npy         a directory of the same names with .npy: sequence.npy, …
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace cpd {

struct LogprobRecord {
  std::int64_t sequence = 0, position = 0, token_id = 0;
  double logprob = 0;
  bool active = true;
  std::int64_t source_line = 0;  // JSON Lines: the line it came from (1-based); else 0
};

/// A file read, as the comparison's report names it.
struct SourceFile {
  std::string path;
  std::uint64_t size_bytes = 0;
  std::string sha256;
};

struct LogprobStream {
  std::string path;    // as given on the command line
  std::string format;  // "jsonl", "hdf5" or "npy"
  std::vector<SourceFile> files;
  std::vector<LogprobRecord> records;  // in file order
  /// Full-vocabulary logprobs, `vocab_size` per record that has them; vocab_row[i] is record
  /// i's row index or -1.
  std::int64_t vocab_size = 0;
  std::vector<double> vocab;
  std::vector<std::int64_t> vocab_row;
  /// Top-k lists (a rollout engine's `top_logprobs`): record i's entries are top_ids and
  /// top_logprobs [top_begin[i], top_begin[i + 1]); top_begin is empty when no record has one.
  std::vector<std::int64_t> top_ids;
  std::vector<double> top_logprobs;
  std::vector<std::size_t> top_begin;

  /// Where record i came from, for a message: "train.jsonl line 12", "train.h5 row 11".
  std::string where(std::size_t i) const;
};

/// Reads `path`: a directory of .npy columns, an HDF5 file (by its signature), else JSON Lines.
/// Throws UsageError with one line naming the file and, for a bad record, where it is.
LogprobStream read_logprob_stream(const std::string& path);

namespace stream_io {
// The readers read_logprob_stream dispatches to; each fills records, vocab, top-k lists, files.
void read_jsonl(const std::string& path, LogprobStream& s);
void read_hdf5_columns(const std::string& path, LogprobStream& s);
/// The bytes of the file `path`, recorded (size, SHA-256) in s.files.
std::string read_source(const std::string& path, LogprobStream& s);

/// One column of a columnar stream (an HDF5 dataset, a .npy file): its extents and its values.
struct Column {
  std::string label;  // for messages: "train.h5: /sequence", "train/sequence.npy"
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> ints;  // read as integers
  std::vector<double> reals;       // read as numbers
};
/// Column `name` ("sequence", "vocab_logprobs", …) read as integers (refused when it holds
/// floats) or as numbers; nothing when the stream has none and it is not `required`.
using ColumnReader =
    std::function<std::optional<Column>(const std::string& name, bool integers, bool required)>;
/// The records, vocabulary rows and top-k lists of a columnar stream, from its columns, checked:
/// [N] each (sequence, position, token_id integers ≥ 0, logprob, optional active: non-zero),
/// optional vocab_logprobs [N, V], optional top_ids (integers, -1 pads) with top_logprobs [N, K].
void take_columns(const ColumnReader& read, LogprobStream& s);
}  // namespace stream_io

}  // namespace cpd
