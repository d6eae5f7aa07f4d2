// What the fuzz targets do with a dump the reader accepted: everything cpdrift-inspect does with
// one — read every tensor and the report, measure every summary figure, gather and draw the plot.
// A refusal (InspectError) is the expected outcome of most inputs; any other exception escaping
// is a bug, and aborts so that libFuzzer keeps the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "inspect/drift_plot.h"
#include "inspect/dump_reader.h"
#include "inspect/figures.h"

namespace inspect_fuzz {

inline void exercise(const cpd::inspect::DumpFile& dump) {
  using namespace cpd::inspect;
  for (const TensorInfo& t : dump.tensors()) {
    if (dump.read(t).size() != static_cast<std::size_t>(t.elements())) std::abort();
  }
  (void)dump.report_json();
  FigureMeter meter(dump, nullptr);
  bool prefill = false;
  for (const CaseInfo& c : dump.cases()) {
    prefill = prefill || !c.paged;
    for (const FigureSpec& f : report_figures(dump, c)) (void)meter.measure(f);
    (void)missing_figures(dump, c);
    meter.forget();
  }
  if (prefill) (void)render_svg(gather_plot(dump, {}, nullptr));
}

// Runs `open` then exercise(); refusals return, anything else aborts.
template <class Open>
int run_one(Open&& open) {
  try {
    exercise(open());
  } catch (const cpd::inspect::InspectError&) {
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an exception other than InspectError escaped: %s\n", e.what());
    std::abort();
  }
  return 0;
}

}  // namespace inspect_fuzz
