// A communicator's view of the topology: where its ranks sit (rank_map.cc) and the ring
// order, channel count and bandwidth the search gives for them (comm_plan.cc).
//
// Rank 0 computes the plan and sends it to the others as text (encodePlan/decodePlan), so
// every rank runs the same rings even if their views of the machine differ.
#pragma once

#include <string>
#include <vector>

#include "model.h"

namespace mncl::topo {

// What a rank reports about where it runs.
struct RankPlace {
  int device = -1;            // CUDA device index, -1 for a CPU rank
  int cpu = -1;               // CPU it ran on at init (sched_getcpu), -1 unknown
  std::vector<int> affinity;  // CPUs it may run on
  int host = 0;               // its host: 0 for rank 0's, then numbered in order of first rank
};

// A node of the graph per rank, or an error saying why the ranks could not be placed.
struct RankMap {
  std::vector<int> nodes;  // node id per rank
  bool onGpus = false;     // every rank sits on a GPU
  std::string rule;        // which rule placed them, for the log
  std::string error;       // non-empty: no placement
};

// The rules, first match wins:
//   1. mapSpec (MININCL_TOPO_RANK_MAP) "g0,g1,...": rank i on GPU g_i of the topology;
//   2. a CUDA rank: the GPU with its device index;
//   3. fromFile and the file has at least nranks GPUs: rank i on GPU i (CPU ranks stand in
//      for the file's GPUs, which is how a file drives a CPU communicator);
//   4. a CPU rank: the NUMA node holding all CPUs of its affinity, else the one holding
//      the CPU it ran on; a host with one NUMA node holds every rank.
RankMap mapRanks(const System& sys, const std::vector<RankPlace>& ranks, const std::string& mapSpec,
                 bool fromFile);

struct PlanInput {
  std::vector<RankPlace> ranks;
  std::string topoFile;  // MININCL_TOPO_FILE (empty: detect)
  std::string rankMap;   // MININCL_TOPO_RANK_MAP
  std::string dumpFile;  // MININCL_TOPO_DUMP_FILE
};

// The most one channel moves in the search's model (GB/s): a bottleneck at it means the
// paths are as fast as the search can tell.
constexpr double kSearchChannelBw = 12.0;

struct CommPlan {
  bool searched = false;     // rings come from the search; false: rank order
  bool onGpus = false;       // the search's channel count and bandwidth apply
  int searchChannels = 0;    // channels the search found (0: none)
  double bwGBs = 0;          // per channel, the search's bottleneck (0: unknown)
  std::vector<std::vector<int>> rings;            // never empty; channel c uses rings[c % size]
  std::vector<std::vector<std::string>> ringHops;  // path class of ring[i] -> ring[i+1]
  std::vector<std::string> devices;               // per rank: "GPU3", "NUMA1", "?"
  std::vector<int> hosts;                         // per rank: RankPlace::host
  std::string source;        // the topology file, or "detected"
  std::string why;           // one line: how the order was chosen
  std::vector<std::string> warnings;  // why it fell back to rank order; a failed dump (log as WARN)
  std::vector<std::string> notes;     // what detection could not find (log as INFO)
};

// Never throws: anything that goes wrong falls back to rank order with a warning.
//
// Ranks on several hosts: each host's ranks are ordered as if they were alone (on the
// topology of rank 0's host: the hosts are taken to look alike), and each channel's ring
// runs through the hosts one after another, so it leaves each host once ("NET" hops).
// Channel c enters every host at the host ring's c-th rank, which spreads the network hops
// over the ranks (each rank's proxy carries some channels' traffic, not all of it).
CommPlan planComm(const PlanInput& in);
CommPlan rankOrderPlan(int nranks, const std::string& why);

// Ranks on several hosts of equal rank counts: that count (each ring then visits the hosts
// one after another, that many ranks each); 0 for one host, or hosts of different sizes.
int ranksPerHost(const CommPlan& plan);

std::string encodePlan(const CommPlan& plan);
CommPlan decodePlan(const std::string& text);

}  // namespace mncl::topo
