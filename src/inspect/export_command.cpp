// `cpdrift-inspect export` (one tensor of a dump as a NumPy .npy file) and `plot` (the drift of
// every prefill case, whole and per CP rank, as an SVG): the subcommands that write a file.
#include <bit>
#include <cstring>
#include <stdexcept>

#include "core/util/thread_pool.h"
#include "inspect/command_line.h"
#include "inspect/drift_plot.h"
#include "report/json.h"

namespace cpd::inspect {
namespace {

// The -o path, which the subcommand requires (checked before any file is read).
std::string output_path(const Arguments& a, const char* what) {
  const std::optional<std::string> output = a.value("--output");
  if (!output) {
    throw InspectError(a.command + ": -o " + what + " is required (see cpdrift-inspect " +
                       a.command + " --help)");
  }
  return *output;
}

void write_output(const std::string& path, const std::string& bytes) {
  try {
    json::write_file_atomic(path, bytes);
  } catch (const std::runtime_error& e) {
    throw InspectError(e.what());
  }
}

// A dataset path ("/inputs/q", "/cases/CASE/LEG/NAME") or CASE/LEG/NAME of a prefill or paged
// case; "inputs/q" works too.
const TensorInfo& resolve(const DumpFile& dump, const std::string& name) {
  const std::vector<std::string> tries =
      name.rfind('/', 0) == 0
          ? std::vector<std::string>{name}
          : std::vector<std::string>{"/" + name, "/cases/" + name, "/paged_cases/" + name};
  for (const std::string& path : tries) {
    if (const TensorInfo* t = dump.find(path); t != nullptr) return *t;
  }
  throw InspectError(dump.path() + ": no tensor " + name +
                     " (cpdrift-inspect list names them: /inputs/q, CASE/LEG/NAME)");
}

}  // namespace

std::string npy_bytes(std::span<const float> values, const std::vector<std::int64_t>& shape) {
  std::string dims;  // "a, b, c"; "n," for one axis (a Python tuple either way)
  for (const std::int64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // The magic, the version and the length take 10 bytes; the data starts 64-byte aligned.
  constexpr std::size_t kPreamble = 10, kAlign = 64;
  const std::size_t total = (kPreamble + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - kPreamble - header.size() - 1, ' ');
  header += '\n';
  if (header.size() > 0xffff) throw InspectError("export: the .npy header is too long");
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const std::size_t at = out.size();
  out.resize(at + values.size() * sizeof(float));
  static_assert(std::endian::native == std::endian::little, "'<f4' is this host's float");
  std::memcpy(out.data() + at, values.data(), values.size() * sizeof(float));
  return out;
}

int export_command(const Arguments& a, std::FILE* out) {
  const std::string output = output_path(a, "OUT.npy");
  const DumpFile dump = DumpFile::open(a.operands[0]);
  const TensorInfo& t = resolve(dump, a.operands[1]);
  const std::string bytes = npy_bytes(dump.read(t), t.shape);
  write_output(output, bytes);
  std::fprintf(out, "wrote %s: %s %s float32%s, %zu bytes\n", output.c_str(), t.path.c_str(),
               shape_text(t.shape).c_str(), t.bf16 ? " (BF16-exact values)" : "", bytes.size());
  return 0;
}

int plot_command(const Arguments& a, std::FILE* out) {
  const std::string output = output_path(a, "OUT.svg");
  const DumpFile dump = DumpFile::open(a.operands[0]);
  ThreadPool pool(measure_threads());
  const DriftPlot plot = gather_plot(dump, a.values("--case"), &pool);
  write_output(output, render_svg(plot));
  std::fprintf(out, "wrote %s: %zu case%s\n", output.c_str(), plot.cases.size(),
               plot.cases.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace cpd::inspect
