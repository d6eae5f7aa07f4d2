#include "inspect/command_line.h"

#include <algorithm>

#include "inspect/dump_reader.h"

namespace cpd::inspect {
namespace {

struct CommandSpec {
  const char* name;
  std::size_t min_operands, max_operands;
  std::vector<std::string> value_options;  // options that take a value
  bool json;                               // accepts --json
  const char* help;
};

const std::vector<CommandSpec>& commands() {
  static const std::vector<CommandSpec> specs = {
      {"list",
       1,
       1,
       {},
       true,
       "usage: cpdrift-inspect list DUMP.h5 [--json]\n"
       "\n"
       "The dump's run (schema, producer, problem), then every case with its attributes and\n"
       "every tensor with its shape, original dtype and attributes.\n"
       "\n"
       "  --json    the same as a JSON document on stdout\n"},
      {"summary",
       1,
       1,
       {"--case"},
       true,
       "usage: cpdrift-inspect summary DUMP.h5 [--case NAME]... [--json]\n"
       "\n"
       "The report's drift figures recomputed from the dumped tensors with cpdrift's own\n"
       "statistics and pairing: max/mean/p95/p99 |diff|, active count, mismatch count, max ULP,\n"
       "bitwise flag and SHA-256 digest, equal bit for bit to the JSON report's. Lists the\n"
       "figures a dump cannot reproduce (the merge-order probe, the FP64 oracle, ...).\n"
       "\n"
       "  --case NAME   only this case (repeatable)\n"
       "  --json        every figure with its path in the report's case object\n"},
      {"diff",
       2,
       2,
       {"--atol"},
       true,
       "usage: cpdrift-inspect diff A.h5 B.h5 [--atol X] [--json]\n"
       "\n"
       "Compares two dumps tensor by tensor (two runs, two machines, CPU vs GPU): per tensor\n"
       "max and mean |A - B|, mismatch count, bitwise flag and the digests of both.\n"
       "Exit status 0 when they agree, 1 when they differ, 2 on an error.\n"
       "\n"
       "  --atol X   agree within X (max |A - B| <= X); without it, agree means bitwise equal\n"
       "  --json     the comparison as a JSON document\n"},
      {"export",
       2,
       2,
       {"-o", "--output"},
       false,
       "usage: cpdrift-inspect export DUMP.h5 TENSOR -o OUT.npy\n"
       "\n"
       "Writes one tensor as a NumPy .npy file (format 1.0, '<f4', C order, the dump's\n"
       "shape): numpy.load(OUT.npy). TENSOR is a dataset path (/inputs/q,\n"
       "/cases/CASE/LEG/NAME) or CASE/LEG/NAME of a prefill or paged case.\n"
       "\n"
       "  -o, --output OUT.npy   where to write it (replaced atomically)\n"},
      {"plot",
       1,
       1,
       {"-o", "--output", "--case"},
       false,
       "usage: cpdrift-inspect plot DUMP.h5 -o OUT.svg [--case NAME]...\n"
       "\n"
       "An SVG: per prefill case, the max |diff| of out, LSE, dlogp, dq, dk and dv on a log\n"
       "axis for the FP32 CP merge, the dtype path and the BF16 kernel, each gate's threshold\n"
       "drawn (from the report inside the dump), and one strip per CP rank.\n"
       "\n"
       "  -o, --output OUT.svg   where to write it (replaced atomically)\n"
       "  --case NAME            only this case (repeatable)\n"},
  };
  return specs;
}

const CommandSpec* find_command(const std::string& name) {
  for (const CommandSpec& c : commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace

std::optional<std::string> Arguments::value(const std::string& name) const {
  const auto at = options.find(name);
  if (at == options.end() || at->second.empty()) return std::nullopt;
  return at->second.back();
}

std::string help_text(const std::string& command) {
  if (const CommandSpec* c = find_command(command); c != nullptr) return c->help;
  return "usage: cpdrift-inspect COMMAND [ARGS] (no MPI: run it directly)\n"
         "\n"
         "Reads the HDF5 dumps cpdrift writes (cpdrift --dump PATH).\n"
         "\n"
         "commands:\n"
         "  list DUMP.h5                  cases, tensors, shapes and attributes\n"
         "  summary DUMP.h5               the report's drift figures, recomputed from the dump\n"
         "  diff A.h5 B.h5 [--atol X]     two dumps tensor by tensor (exit 1 when they differ)\n"
         "  export DUMP.h5 TENSOR -o X.npy   one tensor as a NumPy .npy file\n"
         "  plot DUMP.h5 -o X.svg         the drift per case and CP rank, as an SVG\n"
         "\n"
         "cpdrift-inspect COMMAND --help says more. Exit status: 0 done (diff: the same), 1 diff:\n"
         "they differ, 2 an error (bad arguments; a file that is missing, truncated, corrupted or\n"
         "not a cpdrift dump). docs/inspect.md describes the tool and the dump's layout.\n";
}

Arguments parse_arguments(const std::vector<std::string>& args) {
  Arguments a;
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    a.help = true;
    if (args.size() > 1 && args[0] == "help") a.command = args[1];
    if (!a.command.empty() && find_command(a.command) == nullptr)
      throw InspectError("unknown command \"" + a.command + "\" (see cpdrift-inspect --help)");
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
      a.help = true;
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
    const auto& takes = spec->value_options;
    if (std::find(takes.begin(), takes.end(), arg) == takes.end())
      throw InspectError(a.command + ": unknown option " + arg + see);
    if (!value) {
      if (i + 1 == args.size()) throw InspectError(a.command + ": " + arg + " needs a value" + see);
      value = args[++i];
    }
    a.options[arg == "-o" ? "--output" : arg].push_back(*value);
  }
  if (a.operands.size() < spec->min_operands || a.operands.size() > spec->max_operands) {
    const std::size_t want = spec->min_operands;
    throw InspectError(a.command + ": expects " + std::to_string(want) +
                       (want == 1 ? " file" : " operands") + ", got " +
                       std::to_string(a.operands.size()) + see);
  }
  return a;
}

}  // namespace cpd::inspect
