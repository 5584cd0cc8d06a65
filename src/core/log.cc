#include "log.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "env.h"

namespace mncl::log {
namespace {

// MININCL_DEBUG and MININCL_DEBUG_SUBSYS, in any case; a value that names nothing known is
// said once on stderr (not an error: logging must not stop a program), with what is known.
struct Settings {
  Level level = kWarn;
  unsigned subsys = kAll;
  Settings() {
    std::string given = env::str("MININCL_DEBUG"), l = upper(given);
    if (l == "NONE") level = kNone;
    else if (l == "INFO") level = kInfo;
    else if (l == "TRACE") level = kTrace;
    else if (!l.empty() && l != "WARN") unknown("MININCL_DEBUG", given, "NONE, WARN, INFO, TRACE; using WARN");
    std::string s = env::str("MININCL_DEBUG_SUBSYS");
    if (!s.empty()) subsys = subsystems(s);
  }

  static std::string upper(std::string s) {
    for (char& c : s) c = (char)std::toupper((unsigned char)c);
    return s;
  }

  // "INIT,NET" (or "init, net") -> their bits; ALL -> every one.
  static unsigned subsystems(const std::string& list) {
    const char* names[] = {"INIT", "COLL", "P2P", "NET", "TOPO", "TUNE"};
    unsigned bits = 0;
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = std::min(list.find(',', start), list.size());
      std::string given = list.substr(start, end - start);
      size_t first = given.find_first_not_of(" \t"), last = given.find_last_not_of(" \t");
      given = first == std::string::npos ? "" : given.substr(first, last - first + 1);
      std::string name = upper(given);
      unsigned bit = name == "ALL" ? kAll : 0;
      for (unsigned i = 0; i < 6; ++i) bit |= name == names[i] ? 1u << i : 0;
      if (!bit && !name.empty()) unknown("MININCL_DEBUG_SUBSYS", given, "INIT, COLL, P2P, NET, TOPO, TUNE, ALL");
      bits |= bit;
      start = end + 1;
    }
    return bits;
  }

  static void unknown(const char* variable, const std::string& value, const char* known) {
    std::fprintf(stderr, "minincl WARN %s: '%s' is none of %s\n", variable, value.c_str(), known);
  }
};

const Settings& settings() {
  static Settings s;
  return s;
}

}  // namespace

bool enabled(Level level, Subsys sub) {
  return level <= settings().level && (settings().subsys & sub);
}

void write(Level level, Subsys sub, const char* fmt, ...) {
  if (!enabled(level, sub)) return;
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  const char* tag = level == kWarn ? "WARN" : level == kInfo ? "INFO" : "TRACE";
  std::fprintf(stderr, "%s:%d minincl %s %s\n", host, (int)getpid(), tag, msg);
}

}  // namespace mncl::log
