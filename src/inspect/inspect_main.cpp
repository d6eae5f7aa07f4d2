// Dispatches a command line; every way a command can fail ends here as one line and status 2.
#include "inspect/inspect_main.h"

#include <exception>
#include <new>

#include "inspect/command_line.h"
#include "inspect/dump_reader.h"

namespace cpd::inspect {
namespace {

// One printable line: a corrupted file's names can hold any byte (shown as \xNN).
std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
  return out;
}

int dispatch(const Arguments& a, std::FILE* out) {
  if (a.command == "list") return list_command(a, out);
  if (a.command == "summary") return summary_command(a, out);
  if (a.command == "diff") return diff_command(a, out);
  if (a.command == "export") return export_command(a, out);
  return plot_command(a, out);
}

}  // namespace

int inspect_main(const std::vector<std::string>& args, std::FILE* out, std::FILE* err) {
  const auto error = [&](const std::string& what) {
    std::fprintf(err, "cpdrift-inspect: error: %s\n", printable(what).c_str());
    return kExitError;
  };
  try {
    const Arguments a = parse_arguments(args);
    if (a.help) {
      std::fputs(help_text(a.command).c_str(), out);
      return kExitOk;
    }
    const int status = dispatch(a, out);
    if (std::fflush(out) != 0) return error("cannot write the output");
    return status;
  } catch (const InspectError& e) {
    return error(e.what());
  } catch (const std::bad_alloc&) {
    return error("out of memory");
  } catch (const std::exception& e) {
    // Not expected: every failure the tool knows of is an InspectError. Still one line.
    return error(std::string("internal error: ") + e.what());
  } catch (...) {
    return error("internal error");
  }
}

}  // namespace cpd::inspect
