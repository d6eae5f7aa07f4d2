// Facts about this build and launch that every report carries (docs/style.md, "output is data").
#pragma once

#include <string>
#include <vector>

#include "comm/comm_context.h"
#include "report/run_report.h"

namespace cpd {

/// argv joined shell-style (arguments quoted when they need it).
std::string shell_join(const std::vector<std::string>& args);

/// ISO-8601 UTC time now, e.g. 2026-11-29T21:44:26Z.
std::string utc_now();

/// This machine's OS as Python's platform.platform() writes it on Linux, e.g.
/// "Linux-6.1.0-x86_64-with-glibc2.36" (the report's runtime.platform).
std::string platform_name();

/// Launch and build facts; transport, device and threads are left for the caller.
Provenance gather_provenance(const CommContext& comm, const std::string& command_line);

/// The build's `git describe` (baked in at build time).
const char* git_describe();

}  // namespace cpd
