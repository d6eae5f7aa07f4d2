#include "cli/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>

namespace cpd {
namespace {

[[noreturn]] void refuse(const std::string& flag, const std::string& words, const std::string& why,
                         const std::string& text) {
  bad(flag + ": must be " + words + (why.empty() ? "" : " (" + why + ")") + ", got " + text);
}

std::string number_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

}  // namespace

void check_range(const std::string& flag, std::int64_t value, std::int64_t min, std::int64_t max,
                 const std::string& why) {
  if (value < min || value > max) {
    refuse(flag, "from " + std::to_string(min) + " to " + std::to_string(max), why,
           std::to_string(value));
  }
}

template <class Int>
Int parse_int(const std::string& flag, const std::string& text, Int min, Int max,
              const std::string& why) {
  Int value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  const bool digits = !text.empty() && text != "-" &&
                      std::all_of(text.begin() + (text[0] == '-' ? 1 : 0), text.end(),
                                  [](char c) { return c >= '0' && c <= '9'; });
  // An integer, but not one the type holds (a negative one for an unsigned type included).
  const bool overflow = digits && (ec == std::errc::result_out_of_range ||
                                   (std::is_unsigned_v<Int> && text[0] == '-' && text != "-0"));
  if (!overflow && (ec != std::errc() || ptr != end || text.empty()))
    bad(flag + ": expected an integer, got '" + text + "'");
  if (overflow || value < min || value > max) {
    const bool bounded = max != std::numeric_limits<Int>::max() || overflow;
    refuse(flag,
           bounded ? "from " + std::to_string(min) + " to " + std::to_string(max)
                   : "at least " + std::to_string(min),
           why, text);
  }
  return value;
}

template int parse_int<int>(const std::string&, const std::string&, int, int, const std::string&);
template std::int64_t parse_int<std::int64_t>(const std::string&, const std::string&, std::int64_t,
                                              std::int64_t, const std::string&);
template std::uint64_t parse_int<std::uint64_t>(const std::string&, const std::string&,
                                                std::uint64_t, std::uint64_t, const std::string&);

double parse_number(const std::string& flag, const std::string& text, const NumberRange& r) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !std::isfinite(value))
    bad(flag + ": expected a finite number, got '" + text + "'");
  const bool low = r.above_min ? !(value > r.min) : !(value >= r.min);
  const bool high = r.below_max ? !(value < r.max) : !(value <= r.max);
  if (low || high) {
    std::string words = (r.above_min ? "more than " : "at least ") + number_text(r.min);
    if (!r.above_min && !r.below_max && r.max < std::numeric_limits<double>::max()) {
      words = "from " + number_text(r.min) + " to " + number_text(r.max);
    } else if (r.max < std::numeric_limits<double>::max()) {
      words += (r.below_max ? " and less than " : " and at most ") + number_text(r.max);
    }
    refuse(flag, words, r.why, text);
  }
  return value;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  for (std::size_t start = 0, comma = 0; comma != std::string::npos; start = comma + 1) {
    comma = text.find(',', start);
    items.push_back(text.substr(start, comma - start));  // to the end when there is no comma
    if (items.back().empty()) bad(flag + ": malformed list '" + text + "' (empty item)");
  }
  return items;
}

std::vector<std::optional<std::int64_t>> parse_splits(const std::string& flag,
                                                      const std::string& text) {
  // none, full and no_split are one item
  return parse_list<std::optional<std::int64_t>>(flag, text, [&](const std::string& item) {
    if (item == "none" || item == "full" || item == "no_split")
      return std::optional<std::int64_t>();
    return std::optional(parse_int<std::int64_t>(flag + " (split size)", item, 1));
  });
}

FaultSpec parse_fault(const std::string& flag, const std::string& text) {
  const std::size_t at = text.find('@');
  if (at == std::string::npos) bad(flag + ": '" + text + "' is not KIND@RANK[:WHEN]");
  FaultSpec f;
  f.kind = parse_name(flag, text.substr(0, at), "fault", kFaultKindNames);
  const std::string place = text.substr(at + 1);
  const std::size_t colon = place.find(':');
  f.rank = parse_int<int>(flag + " RANK", place.substr(0, colon), 0);
  if (colon != std::string::npos)
    f.when = parse_int<int>(flag + " WHEN", place.substr(colon + 1), 1);
  return f;
}

void FlagReader::path(const std::string& name, std::string& slot) {
  value(name, [&slot](const std::string& f, const std::string& v) {
    if (v.empty()) bad(f + ": empty path");
    slot = v;
  });
}

std::string FlagReader::first_given(std::initializer_list<const char*> names) const {
  for (const std::string& flag : given_) {
    if (std::find(names.begin(), names.end(), flag) != names.end()) return flag;
  }
  return "";
}

void FlagReader::read(const std::vector<std::string>& args, std::size_t first) {
  for (std::size_t i = first; i < args.size(); ++i) {
    std::string flag = args[i], inline_value;
    bool has_inline = false;
    if (const std::size_t eq = flag.find('=');
        flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_inline = true;
    }
    if (const auto t = toggles_.find(flag); t != toggles_.end()) {
      if (has_inline) bad(flag + " takes no value");
      t->second();
      given_.push_back(flag);
    } else if (const auto v = values_.find(flag); v != values_.end()) {
      if (!has_inline && i + 1 >= args.size()) bad(flag + ": missing value");
      v->second(flag, has_inline ? inline_value : args[++i]);
      given_.push_back(flag);
    } else if (positional_ && !args[i].empty() && args[i][0] != '-') {
      positional_(args[i]);
    } else {
      bad("unknown option '" + args[i] + "' (see cpdrift --help)");
    }
  }
}

}  // namespace cpd
