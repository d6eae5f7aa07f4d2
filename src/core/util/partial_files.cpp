#include "core/util/partial_files.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <vector>

namespace cpd {
namespace {

constexpr const char* kMarker = ".cpdrift-partial.";

// Whether process `pid` still runs here: it exists and is not a zombie (dead, not yet reaped
// by a parent that may never do so, as in a container whose init does not).
bool process_runs(int pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const std::size_t paren = line.rfind(')');   // "pid (comm) S ...": comm may hold spaces
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

}  // namespace

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string partial_path(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + kMarker + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) +
         "@" + host_name();
}

std::string stale_partials_warning(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + kMarker;
  const std::string here = host_name();
  std::vector<std::string> stale;  // this host's, whose process is gone
  std::string elsewhere;           // other hosts', maybe still being written
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());  // PID.N@HOST
    const std::size_t at = rest.find('@');
    int pid = 0;
    if (at == std::string::npos ||
        std::from_chars(rest.data(), rest.data() + rest.size(), pid).ec != std::errc() || pid <= 0)
      continue;
    const std::string quoted = "\"" + it->path().string() + "\"";
    if (rest.substr(at + 1) != here) {
      elsewhere += (elsewhere.empty() ? "" : ", ") + quoted;
    } else if (!process_runs(pid)) {
      stale.push_back(quoted);
    }
  }
  std::string line;
  if (!stale.empty()) {
    const bool one = stale.size() == 1;
    line = std::string(one ? "a partial file" : "partial files") + " of \"" + path +
           "\" left by a run that was killed while writing it: " + stale[0];
    for (std::size_t i = 1; i < stale.size(); ++i) line += ", " + stale[i];
    line += std::string(" (its process is gone; remove ") + (one ? "it" : "them") + ")";
  }
  if (!elsewhere.empty()) {
    line += std::string(line.empty() ? "" : "; ") + "partial files of \"" + path +
            "\" from other hosts, maybe still being written: " + elsewhere;
  }
  return line;
}

}  // namespace cpd
