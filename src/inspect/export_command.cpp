// `cpdrift-inspect export`: one tensor of a dump as a NumPy .npy file.
#include <stdexcept>

#include "inspect/command_line.h"
#include "inspect/dump_reader.h"
#include "inspect/npy.h"
#include "inspect/output_format.h"
#include "report/json.h"

namespace cpd::inspect {
namespace {

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

int export_command(const Arguments& a, std::FILE* out) {
  const std::optional<std::string> output = a.value("--output");
  if (!output)
    throw InspectError("export: -o OUT.npy is required (see cpdrift-inspect export --help)");
  const DumpFile dump = DumpFile::open(a.operands[0]);
  const TensorInfo& t = resolve(dump, a.operands[1]);
  const std::string bytes = npy_bytes(dump.read(t), t.shape);
  try {
    json::write_file_atomic(*output, bytes);
  } catch (const std::runtime_error& e) {
    throw InspectError(e.what());
  }
  std::fprintf(out, "wrote %s: %s %s float32%s, %zu bytes\n", output->c_str(), t.path.c_str(),
               shape_text(t.shape).c_str(), t.bf16 ? " (BF16-exact values)" : "", bytes.size());
  return 0;
}

}  // namespace cpd::inspect
