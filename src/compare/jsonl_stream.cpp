// JSON Lines logprob records: one object per line, blank lines skipped.
#include <charconv>

#include "compare/logprob_stream.h"
#include "core/errors.h"
#include "report/json.h"

namespace cpd::stream_io {
namespace {

std::int64_t index_member(const json::Value& o, const char* key, const std::string& where) {
  if (!o.contains(key)) throw UsageError(where + ": no \"" + key + "\"");
  const json::Value& v = o.at(key);
  if (!v.is_integer() || v.as_double() < 0) {
    throw UsageError(where + ": \"" + key + "\" must be an integer >= 0");
  }
  if (v.as_double() >= 0x1p63) throw UsageError(where + ": \"" + key + "\" is too large");
  return v.as_int64();
}

double number_member(const json::Value& v, const std::string& where, const char* what) {
  if (!v.is_number()) throw UsageError(where + ": " + what + " must be a number");
  return v.as_double();
}

}  // namespace

void read_jsonl(const std::string& path, LogprobStream& s) {
  const std::string text = read_source(path, s);

  std::int64_t line = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view row(text.data() + begin, end - begin);
    begin = end + 1;
    ++line;
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    if (row.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = path + " line " + std::to_string(line);
    json::Value v;
    try {
      v = json::parse(row);
    } catch (const std::exception& e) {
      // Python's json.dumps writes NaN and Infinity, which JSON (and this parser) refuse.
      for (const char* word : {"NaN", "Infinity"}) {
        if (row.find(word) != std::string_view::npos) {
          throw UsageError(where + ": a non-finite number (" + word +
                           "): invalid comparison, a logprob must be finite");
        }
      }
      throw UsageError(where + ": not JSON (" + e.what() + ")");
    }
    if (!v.is_object()) throw UsageError(where + ": not a JSON object");
    LogprobRecord r;
    r.source_line = line;
    r.sequence = index_member(v, "sequence", where);
    r.position = index_member(v, "position", where);
    r.token_id = index_member(v, "token_id", where);
    if (!v.contains("logprob")) throw UsageError(where + ": no \"logprob\"");
    r.logprob = number_member(v.at("logprob"), where, "\"logprob\"");
    if (v.contains("active")) {
      if (!v.at("active").is_bool()) throw UsageError(where + ": \"active\" must be true or false");
      r.active = v.at("active").as_bool();
    }
    std::int64_t row_index = -1;
    if (v.contains("vocab_logprobs")) {
      const json::Value& a = v.at("vocab_logprobs");
      if (!a.is_array() || a.size() == 0) {
        throw UsageError(where + ": \"vocab_logprobs\" must be a non-empty array of numbers");
      }
      const auto n = static_cast<std::int64_t>(a.size());
      if (s.vocab_size == 0) s.vocab_size = n;
      if (n != s.vocab_size) {
        throw UsageError(where + ": \"vocab_logprobs\" has " + std::to_string(n) +
                         " entries, earlier records " + std::to_string(s.vocab_size));
      }
      row_index = static_cast<std::int64_t>(s.vocab.size()) / n;
      for (std::size_t i = 0; i < a.size(); ++i)
        s.vocab.push_back(number_member(a.at(i), where, "\"vocab_logprobs\" entry"));
    }
    if (v.contains("top_logprobs")) {
      const json::Value& t = v.at("top_logprobs");
      const auto add = [&](std::int64_t id, const json::Value& lp) {
        if (id < 0) throw UsageError(where + ": a \"top_logprobs\" token id is negative");
        s.top_ids.push_back(id);
        s.top_logprobs.push_back(number_member(lp, where, "a \"top_logprobs\" logprob"));
      };
      // Records before the first list have none.
      if (s.top_begin.empty()) s.top_begin.assign(s.records.size() + 1, 0);
      if (t.is_object()) {
        for (const auto& [key, lp] : t.as_object()) {
          std::int64_t id = -1;
          const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
          if (error != std::errc() || end != key.data() + key.size())
            throw UsageError(where + ": \"top_logprobs\" key \"" + key + "\" is not a token id");
          add(id, lp);
        }
      } else if (t.is_array()) {
        for (const json::Value& e : t.as_array()) {
          if (!e.is_array() || e.size() != 2 || !e.at(0).is_integer())
            throw UsageError(where + ": \"top_logprobs\" entries must be [token_id, logprob]");
          add(e.at(0).as_int64(), e.at(1));
        }
      } else {
        throw UsageError(where + ": \"top_logprobs\" must be an object or an array of pairs");
      }
    }
    s.records.push_back(r);
    s.vocab_row.push_back(row_index);
    if (!s.top_begin.empty()) s.top_begin.push_back(s.top_ids.size());
  }
}

}  // namespace cpd::stream_io
