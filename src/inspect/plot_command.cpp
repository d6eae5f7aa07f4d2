// `cpdrift-inspect plot`: the drift of every prefill case, whole and per CP rank, as an SVG.
#include <algorithm>
#include <stdexcept>
#include <thread>

#include "core/util/thread_pool.h"
#include "inspect/command_line.h"
#include "inspect/drift_plot.h"
#include "report/json.h"

namespace cpd::inspect {

int plot_command(const Arguments& a, std::FILE* out) {
  const std::optional<std::string> output = a.value("--output");
  if (!output) throw InspectError("plot: -o OUT.svg is required (see cpdrift-inspect plot --help)");
  const DumpFile dump = DumpFile::open(a.operands[0]);
  const auto cases = a.options.find("--case");
  ThreadPool pool(static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u)));
  const DriftPlot plot = gather_plot(
      dump, cases == a.options.end() ? std::vector<std::string>{} : cases->second, &pool);
  const std::string svg = render_svg(plot);
  try {
    json::write_file_atomic(*output, svg);
  } catch (const std::runtime_error& e) {
    throw InspectError(e.what());
  }
  std::fprintf(out, "wrote %s: %zu case%s\n", output->c_str(), plot.cases.size(),
               plot.cases.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace cpd::inspect
