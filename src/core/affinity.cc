// Optional binding of a rank's thread to one core (MININCL_CPU_BIND=1). Two freshly started
// rank processes often share one core for their first milliseconds, until the scheduler's
// load balancing separates them; every wait in that time costs a context switch (a 0.4 us
// allreduce takes 3-9 us). Bound to distinct cores, they never share. Off by default: it
// changes the affinity of the caller's own thread.
#include <sched.h>

#include <vector>

#include "affinity.h"
#include "env.h"
#include "error.h"
#include "log.h"

namespace mncl {

bool cpuBindRequested() {
  int64_t bind = env::integer("MININCL_CPU_BIND", 0);
  MNCL_CHECK(bind == 0 || bind == 1, mnclInvalidArgument,
             "MININCL_CPU_BIND must be 0 (no binding) or 1 (each rank's thread on a core of its own), not " +
                 std::to_string(bind));
  return bind == 1;
}

void maybeBindToCore(int localIndex) {
  if (!cpuBindRequested()) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.empty()) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  int cpu = cpus[(size_t)localIndex % cpus.size()];
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one) == 0) MNCL_INFO(kInit, "local rank %d bound to CPU %d", localIndex, cpu);
}

}  // namespace mncl
