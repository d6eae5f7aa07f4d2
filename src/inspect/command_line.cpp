// cpdrift-inspect's command line: the subcommands' table and help, the parser, and the dispatch
// where every way a command can fail ends as one line and status 2.
#include "inspect/command_line.h"

#include <algorithm>
#include <exception>
#include <new>
#include <thread>

#include "inspect/dump_reader.h"

namespace cpd::inspect {
namespace {

// The options that take a value, each a bit of CommandSpec::value_options.
enum : unsigned { kCase = 1, kAtol = 2, kOutput = 4 };
constexpr std::pair<const char*, unsigned> kValueOptions[] = {
    {"--case", kCase}, {"--atol", kAtol}, {"-o", kOutput}, {"--output", kOutput}};

struct CommandSpec {
  const char* name;
  std::size_t operands;
  unsigned value_options;  // the kValueOptions it takes
  bool json;               // accepts --json
  int (*run)(const Arguments&, std::FILE*);
  const char* help;
};

const std::vector<CommandSpec> kCommands = {
    {"list", 1, 0, true, list_command, R"(usage: cpdrift-inspect list DUMP.h5 [--json]

The dump's run (schema, producer, problem), then every case with its attributes and
every tensor with its shape, original dtype and attributes.

  --json    the same as a JSON document on stdout
)"},
    {"summary", 1, kCase, true, summary_command,
     R"(usage: cpdrift-inspect summary DUMP.h5 [--case NAME]... [--json]

The report's drift figures recomputed from the dumped tensors with cpdrift's own
statistics and pairing: max/mean/p95/p99 |diff|, active count, mismatch count, max ULP,
bitwise flag and SHA-256 digest, equal bit for bit to the JSON report's. Lists the
figures a dump cannot reproduce (the merge-order probe, the FP64 oracle, ...).

  --case NAME   only this case (repeatable)
  --json        every figure with its path in the report's case object
)"},
    {"diff", 2, kAtol, true, diff_command,
     R"(usage: cpdrift-inspect diff A.h5 B.h5 [--atol X] [--json]

Compares two dumps tensor by tensor (two runs, two machines, CPU vs GPU): per tensor
max and mean |A - B|, mismatch count, bitwise flag and the digests of both.
Exit status 0 when they agree, 1 when they differ, 2 on an error.

  --atol X   agree within X (max |A - B| <= X); without it, agree means bitwise equal
  --json     the comparison as a JSON document
)"},
    {"export", 2, kOutput, false, export_command,
     R"(usage: cpdrift-inspect export DUMP.h5 TENSOR -o OUT.npy

Writes one tensor as a NumPy .npy file (format 1.0, '<f4', C order, the dump's
shape): numpy.load(OUT.npy). TENSOR is a dataset path (/inputs/q,
/cases/CASE/LEG/NAME) or CASE/LEG/NAME of a prefill or paged case.

  -o, --output OUT.npy   where to write it (replaced atomically)
)"},
    {"plot", 1, kOutput | kCase, false, plot_command,
     R"(usage: cpdrift-inspect plot DUMP.h5 -o OUT.svg [--case NAME]...

An SVG: per prefill case, the max |diff| of out, LSE, dlogp, dq, dk and dv on a log
axis for the FP32 CP merge, the dtype path and the BF16 kernel, each gate's threshold
drawn (from the report inside the dump), and one strip per CP rank.

  -o, --output OUT.svg   where to write it (replaced atomically)
  --case NAME            only this case (repeatable)
)"},
};

constexpr const char* kHelp = R"(usage: cpdrift-inspect COMMAND [ARGS] (no MPI: run it directly)

Reads the HDF5 dumps cpdrift writes (cpdrift --dump PATH).

commands:
  list DUMP.h5                  cases, tensors, shapes and attributes
  summary DUMP.h5               the report's drift figures, recomputed from the dump
  diff A.h5 B.h5 [--atol X]     two dumps tensor by tensor (exit 1 when they differ)
  export DUMP.h5 TENSOR -o X.npy   one tensor as a NumPy .npy file
  plot DUMP.h5 -o X.svg         the drift per case and CP rank, as an SVG

cpdrift-inspect COMMAND --help says more. Exit status: 0 done (diff: the same), 1 diff:
they differ, 2 an error (bad arguments; a file that is missing, truncated, corrupted or
not a cpdrift dump). docs/inspect.md describes the tool and the dump's layout.
)";

const CommandSpec* find_command(const std::string& name) {
  for (const CommandSpec& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

// Parses `args` (without the program name). Throws InspectError on an unknown subcommand or
// option, a missing option value, or the wrong number of operands; sets `help` when asked for.
Arguments parse_arguments(const std::vector<std::string>& args, std::string& help) {
  Arguments a;
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    const CommandSpec* c = args.size() > 1 && args[0] == "help" ? find_command(args[1]) : nullptr;
    if (c == nullptr && args.size() > 1 && args[0] == "help")
      throw InspectError("unknown command \"" + args[1] + "\" (see cpdrift-inspect --help)");
    help = c != nullptr ? c->help : kHelp;
    return a;
  }
  const CommandSpec* spec = find_command(args[0]);
  if (spec == nullptr) {
    throw InspectError("unknown command \"" + args[0] +
                       "\": list, summary, diff, export or plot (see cpdrift-inspect --help)");
  }
  a.command = spec->name;
  const std::string see = " (see cpdrift-inspect " + a.command + " --help)";
  for (std::size_t i = 1; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help = spec->help;
      return a;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      a.operands.push_back(arg);
      continue;
    }
    if (arg == "--json" && spec->json) {
      a.json = true;
      continue;
    }
    std::optional<std::string> value;
    if (const std::size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    const auto known = std::find_if(std::begin(kValueOptions), std::end(kValueOptions),
                                    [&](const auto& o) { return arg == o.first; });
    if (known == std::end(kValueOptions) || (spec->value_options & known->second) == 0)
      throw InspectError(a.command + ": unknown option " + arg + see);
    if (!value) {
      if (i + 1 == args.size()) throw InspectError(a.command + ": " + arg + " needs a value" + see);
      value = args[++i];
    }
    a.options[arg == "-o" ? "--output" : arg].push_back(*value);
  }
  if (a.operands.size() != spec->operands) {
    throw InspectError(a.command + ": expects " + std::to_string(spec->operands) +
                       (spec->operands == 1 ? " file" : " operands") + ", got " +
                       std::to_string(a.operands.size()) + see);
  }
  return a;
}

// One printable line: a corrupted file's names can hold any byte (shown as \xNN).
std::string printable(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", u);
    out += u >= 0x20 && u < 0x7f ? std::string(1, c) : hex;
  }
  return out;
}

}  // namespace

std::optional<std::string> Arguments::value(const std::string& name) const {
  const std::vector<std::string> all = values(name);
  return all.empty() ? std::nullopt : std::optional(all.back());
}

std::vector<std::string> Arguments::values(const std::string& name) const {
  const auto at = options.find(name);
  return at == options.end() ? std::vector<std::string>{} : at->second;
}

std::string sci(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", value);
  return buf;
}

std::string max_abs_text(const DiffStats& s) { return s.finite() ? sci(s.max_abs) : "nonfinite"; }

int measure_threads() {
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

int inspect_main(const std::vector<std::string>& args, std::FILE* out, std::FILE* err) {
  const auto error = [&](const std::string& what) {
    std::fprintf(err, "cpdrift-inspect: error: %s\n", printable(what).c_str());
    return kExitError;
  };
  try {
    std::string help;
    const Arguments a = parse_arguments(args, help);
    if (!help.empty()) {
      std::fputs(help.c_str(), out);
      return kExitOk;
    }
    const int status = find_command(a.command)->run(a, out);
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
