#include "metrics/gates.h"

#include <cmath>
#include <cstdio>

namespace cpd {
namespace {

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

std::string gate_failure(const std::string& what, std::optional<double> value, double limit) {
  if (!value) return "missing metric " + what;
  if (!std::isfinite(*value)) return "non-finite metric " + what;
  if (*value < 0) return "negative metric " + what;
  if (*value > limit) return what + " = " + number(*value) + " exceeds " + number(limit);
  return "";
}

}  // namespace cpd
