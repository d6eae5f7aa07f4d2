// cpdrift-inspect's arguments: a subcommand, its operands and options, and the help texts.
#pragma once

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cpd::inspect {

/// One subcommand's parsed arguments.
struct Arguments {
  std::string command;                // "list", "summary", "diff", "export", "plot"
  std::vector<std::string> operands;  // files, tensor names
  std::map<std::string, std::vector<std::string>> options;  // "--atol" → its values
  bool json = false;
  bool help = false;

  /// The last value of `name`, if given.
  std::optional<std::string> value(const std::string& name) const;
};

/// Parses `args` (without the program name). Throws InspectError on an unknown subcommand or
/// option, a missing option value, or the wrong number of operands; `help` set when asked for.
Arguments parse_arguments(const std::vector<std::string>& args);

/// The tool's help (`command` empty) or a subcommand's.
std::string help_text(const std::string& command);

// The subcommands; each returns the exit status (inspect_main.h).
int list_command(const Arguments& a, std::FILE* out);
int summary_command(const Arguments& a, std::FILE* out);
int diff_command(const Arguments& a, std::FILE* out);
int export_command(const Arguments& a, std::FILE* out);
int plot_command(const Arguments& a, std::FILE* out);

}  // namespace cpd::inspect
