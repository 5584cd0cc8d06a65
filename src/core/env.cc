#include "env.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "error.h"

namespace mncl::env {

std::string str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

namespace {
[[noreturn]] void bad(const char* name, const std::string& v, const char* expect) {
  throwError(mnclInvalidArgument, std::string(name) + "=\"" + v + "\" is not " + expect);
}

// A number's text without the spaces around it (" 2" and "2 " alike).
std::string numberText(const char* name) {
  std::string v = str(name);
  size_t first = v.find_first_not_of(" \t"), last = v.find_last_not_of(" \t");
  return first == std::string::npos ? "" : v.substr(first, last - first + 1);
}
}  // namespace

int64_t integer(const char* name, int64_t fallback) {
  std::string v = numberText(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0') bad(name, v, "an integer");
  if (errno == ERANGE) bad(name, v, "an integer that fits in 64 bits");  // (not clamped, then echoed back)
  return x;
}

double seconds(const char* name, double fallback) {
  std::string v = numberText(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  std::string unit(end);
  // (strtod also reads hexadecimal and NaN, and no number from "ms": none is a duration.)
  bool number = end != v.c_str() && v.find_first_of("xX") == std::string::npos && !std::isnan(x);
  if (number && unit == "ms") return x / 1000;
  if (number && (unit == "" || unit == "s")) return x;
  bad(name, v, "a duration such as 5, 2.5s or 500ms");
}

double limit(const char* name, double fallback, double lowest) {
  double x = seconds(name, fallback);
  bool inRange = (lowest > 0 ? x >= lowest : x > 0) && x < 1e9;
  if (!inRange) {
    char from[64] = "above 0";
    if (lowest > 0) std::snprintf(from, sizeof(from), "of at least %gms", lowest * 1000);
    bad(name, str(name), (std::string("a time limit ") + from + " and below 1e9 s (such as 5, 2.5s or 500ms)").c_str());
  }
  return x;
}

int64_t bytes(const char* name, int64_t fallback) {
  std::string v = numberText(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  std::string unit(end);
  int shift = unit == "K" || unit == "k"   ? 10
              : unit == "M" || unit == "m" ? 20
              : unit == "G" || unit == "g" ? 30
              : unit == "T" || unit == "t" ? 40
                                           : 0;
  bool known = shift > 0 || unit.empty();
  // (Negative or past 2^62: a size cast to an unsigned one wrapped into terabytes.)
  if (!known || end == v.c_str() || errno == ERANGE || x < 0 || x > (int64_t{1} << (62 - shift))) {
    bad(name, v, "a size such as 65536, 64K or 1M");
  }
  return x << shift;
}

}  // namespace mncl::env
