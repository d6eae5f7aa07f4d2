#include "cpdrift/util/temp_file_guard.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace cpd {
namespace {

// Read by the handler: only a fixed buffer and a flag (async-signal-safe).
char g_path[4096];
volatile std::sig_atomic_t g_armed = 0;

extern "C" void unlink_and_die(int sig) {
  if (g_armed != 0) ::unlink(g_path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_once() {
  static const bool installed = [] {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction action {};
      action.sa_handler = unlink_and_die;
      sigemptyset(&action.sa_mask);
      sigaction(sig, &action, nullptr);
    }
    return true;
  }();
  (void)installed;
}

}  // namespace

TempFileGuard::TempFileGuard(const std::string& path) {
  install_once();
  g_armed = 0;
  if (path.size() >= sizeof g_path) return;  // too long to keep: left to the normal cleanup
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  g_armed = 1;
}

TempFileGuard::~TempFileGuard() { g_armed = 0; }

}  // namespace cpd
