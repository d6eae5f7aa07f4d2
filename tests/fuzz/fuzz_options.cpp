// libFuzzer target: the command-line parser (cli/options.h). The input is argv after the
// program's name, its items separated by NUL bytes. Any input must either parse or be refused
// with a UsageError (one line for the user); any other exception, a crash, or undefined
// behaviour (the build adds ASan and UBSan) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cli/options.h"
#include "core/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> args(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.emplace_back();
    } else {
      args.back().push_back(static_cast<char>(data[i]));
    }
  }
  try {
    (void)cpd::parse_command_line(args);
  } catch (const cpd::UsageError&) {
    // The expected refusal.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parse_command_line threw a non-usage error: %s\n", e.what());
    std::abort();
  }
  return 0;
}
