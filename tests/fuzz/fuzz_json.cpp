// libFuzzer target: the JSON reader (report/json.h) that reads reports back. Any input must
// either parse or be refused with std::runtime_error; what parses must write out and read
// back to the same text (the round trip the report tests rely on, here over any document).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "report/json.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cpd::json::Value value;
  try {
    value = cpd::json::parse(text);
  } catch (const std::runtime_error&) {
    return 0;  // refused, as malformed input must be
  }
  const std::string written = cpd::json::to_string(value);
  std::string again;
  try {
    again = cpd::json::to_string(cpd::json::parse(written));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "what to_string wrote does not parse: %s\n%s\n", e.what(),
                 written.c_str());
    std::abort();
  }
  if (again != written) {
    std::fprintf(stderr, "round trip changed the document:\n%s\n%s\n", written.c_str(),
                 again.c_str());
    std::abort();
  }
  return 0;
}
