#include "log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstring>
#include <string>

#include "env.h"

namespace mncl::log {
namespace {

struct Settings {
  Level level = kWarn;
  unsigned subsys = kAll;
  Settings() {
    std::string l = env::str("MININCL_DEBUG");
    if (l == "NONE") level = kNone;
    else if (l == "INFO") level = kInfo;
    else if (l == "TRACE") level = kTrace;
    std::string s = env::str("MININCL_DEBUG_SUBSYS");
    if (!s.empty()) {
      subsys = 0;
      const char* names[] = {"INIT", "COLL", "P2P", "NET", "TOPO", "TUNE"};
      for (unsigned i = 0; i < 6; ++i)
        if (s.find(names[i]) != std::string::npos) subsys |= 1u << i;
      if (s.find("ALL") != std::string::npos) subsys = kAll;
    }
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
