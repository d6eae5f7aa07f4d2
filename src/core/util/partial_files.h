// Partial files: every output is written under a name that says it is partial and whose it is,
// `PATH.cpdrift-partial.PID.N@HOST`, then renamed onto PATH. A process killed outright (SIGKILL,
// the OOM killer, a lost node) cannot clean up, so what it leaves is recognisable: the next run
// that writes PATH finds such files and says which are stale (their process is gone).
#pragma once

#include <string>

namespace cpd {

/// This host's name, as gethostname gives it ("unknown" when it gives none).
std::string host_name();

/// The name to write `path` under, unique to this process (and to this call in it).
std::string partial_path(const std::string& path);

/// One line about a partial `path` left behind ("" when none was): what they are, whose, and
/// that they can go. For rank 0 to print before it writes `path`.
std::string stale_partials_warning(const std::string& path);

}  // namespace cpd
