#include "cpdrift/engine/run_progress.h"

#include <algorithm>

namespace cpd {
namespace {

double sum(const std::vector<std::uint64_t>& v) {
  double s = 0;
  for (const std::uint64_t x : v) s += static_cast<double>(x);
  return s;
}

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

RunProgress::RunProgress(double total_flops, std::size_t cases, std::FILE* out,
                         double quiet_seconds)
    : total_(total_flops),
      cases_(cases),
      out_(out),
      quiet_seconds_(quiet_seconds),
      started_(std::chrono::steady_clock::now()),
      last_line_(started_) {}

void RunProgress::start_case(std::size_t index, const std::string& name) {
  index_ = index;
  name_ = name;
  if (out_ == nullptr) return;
  std::fprintf(out_, "cpdrift: [%zu/%zu] %s ...\n", index_ + 1, cases_, name_.c_str());
  std::fflush(out_);
  last_line_ = std::chrono::steady_clock::now();
}

void RunProgress::phase_done(const char* phase, double flops) {
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
               index_ + 1, cases_, name_.c_str(), phase, 100 * fraction,
               clock_text(elapsed).c_str(), left.c_str());
  std::fflush(out_);
}

double RunProgress::forward_pass_flops(const Problem& p, const CaseWork& w) {
  return 4.0 * p.dims.head_dim * static_cast<double>(w.forward.total_pairs());
}

double RunProgress::reference_flops(const Problem& p, const CaseWork& w) {
  return 4.0 * p.dims.head_dim * sum(w.reference_forward_pairs);
}

double RunProgress::backward_flops(const Problem& p, const CaseWork& w) {
  return 10.0 * p.dims.head_dim * static_cast<double>(w.backward.total_pairs()) +
         14.0 * p.dims.head_dim * sum(w.reference_backward_pairs);
}

double RunProgress::case_flops(const Problem& p, const CaseWork& w, std::size_t forward_paths) {
  return static_cast<double>(forward_paths) * forward_pass_flops(p, w) + reference_flops(p, w) +
         backward_flops(p, w);
}

}  // namespace cpd
