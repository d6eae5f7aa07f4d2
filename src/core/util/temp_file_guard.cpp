#include "core/util/temp_file_guard.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace cpd {
namespace {

// Read by the handler: only fixed buffers and flags (async-signal-safe).
char g_path[4096];
volatile std::sig_atomic_t g_armed = 0, g_announce = 0, g_written = 0;

// "cpdrift: interrupted by signal N; no report written" (or, once the outputs are in place,
// "... after its outputs were written") with write(2) alone.
void say_interrupted(int sig) {
  char line[96] = "cpdrift: interrupted by signal ";
  std::size_t n = std::strlen(line);
  char digits[12];
  int d = 0;
  for (unsigned v = static_cast<unsigned>(sig); d == 0 || v > 0; v /= 10)
    digits[d++] = static_cast<char>('0' + v % 10);
  while (d > 0) line[n++] = digits[--d];
  const char none[] = "; no report written\n", after[] = " after its outputs were written\n";
  const char* tail = g_written != 0 ? after : none;
  const std::size_t len = g_written != 0 ? sizeof after - 1 : sizeof none - 1;
  std::memcpy(line + n, tail, len);
  n += len;
  const ssize_t written = ::write(STDERR_FILENO, line, n);
  (void)written;
}

extern "C" void unlink_and_die(int sig) {
  if (g_armed != 0) ::unlink(g_path);
  if (g_announce != 0) say_interrupted(sig);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action {};
    action.sa_handler = unlink_and_die;
    sigemptyset(&action.sa_mask);
    sigaction(sig, &action, nullptr);
  }
}

}  // namespace

TempFileGuard::TempFileGuard(const std::string& path) {
  static const bool installed = (install(), true);  // once: a later guard keeps what is there
  (void)installed;
  g_armed = 0;
  if (path.size() >= sizeof g_path) return;  // too long to keep: left to the normal cleanup
  std::memcpy(g_path, path.c_str(), path.size() + 1);
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the path is whole before it is armed
  g_armed = 1;
}

TempFileGuard::~TempFileGuard() { g_armed = 0; }

void handle_interrupts(bool announce) {
  install();  // again if another handler took the signals meanwhile (a test harness's)
  g_announce = announce ? 1 : 0;
}

void note_outputs_written() { g_written = 1; }

}  // namespace cpd
