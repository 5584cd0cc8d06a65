// MININCL_DEBUG=WARN|INFO|TRACE and MININCL_DEBUG_SUBSYS=INIT,COLL,P2P,NET,TOPO,TUNE (or ALL).
#pragma once

#include <cstdio>

namespace mncl::log {

enum Level { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
enum Subsys : unsigned { kInit = 1, kColl = 2, kP2p = 4, kNet = 8, kTopo = 16, kTune = 32, kAll = 63,
                         kInitTopo = kInit | kTopo };  // (said under either: what the topology search made)

bool enabled(Level level, Subsys sub);
void write(Level level, Subsys sub, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace mncl::log

#define MNCL_WARN(sub, ...) ::mncl::log::write(::mncl::log::kWarn, ::mncl::log::sub, __VA_ARGS__)
#define MNCL_INFO(sub, ...)                                                       \
  do {                                                                            \
    if (::mncl::log::enabled(::mncl::log::kInfo, ::mncl::log::sub))               \
      ::mncl::log::write(::mncl::log::kInfo, ::mncl::log::sub, __VA_ARGS__);      \
  } while (0)
