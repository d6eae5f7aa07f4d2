#include "engine/run_progress.h"

#include <algorithm>
#include <utility>

namespace cpd {
namespace {

// "42 s", "3 min 05 s", "1 h 02 min".
std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s < 60) {
    std::snprintf(text, sizeof text, "%ld s", s);
  } else if (s < 3600) {
    std::snprintf(text, sizeof text, "%ld min %02ld s", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%ld h %02ld min", s / 3600, s / 60 % 60);
  }
  return text;
}

}  // namespace

RunProgress::RunProgress(std::vector<double> cases, std::FILE* out, double quiet_seconds)
    : cases_(std::move(cases)),
      out_(out),
      quiet_seconds_(quiet_seconds),
      started_(std::chrono::steady_clock::now()),
      last_line_(started_) {
  for (const double c : cases_) total_ += c;
}

void RunProgress::start_case(std::size_t index, const std::string& name) {
  index_ = index;
  name_ = name;
  if (out_ == nullptr) return;
  std::fprintf(out_, "cpdrift: [%zu/%zu] %s ...\n", index_ + 1, cases_.size(), name_.c_str());
  std::fflush(out_);
  last_line_ = std::chrono::steady_clock::now();
}

void RunProgress::phase_done(const std::string& phase, double flops) {
  done_ += flops;
  const auto now = std::chrono::steady_clock::now();
  if (out_ == nullptr || std::chrono::duration<double>(now - last_line_).count() < quiet_seconds_)
    return;
  last_line_ = now;
  const double elapsed = std::chrono::duration<double>(now - started_).count();
  const double fraction = total_ > 0 ? std::min(1.0, done_ / total_) : 1.0;
  std::string left;
  if (fraction > 0 && fraction < 1)
    left = ", about " + clock_text(elapsed * (1 - fraction) / fraction) + " left";
  std::fprintf(out_, "cpdrift: [%zu/%zu] %s: %s done; %.0f%% of the run's work in %s%s\n",
               index_ + 1, cases_.size(), name_.c_str(), phase.c_str(), 100 * fraction,
               clock_text(elapsed).c_str(), left.c_str());
  std::fflush(out_);
}

}  // namespace cpd
