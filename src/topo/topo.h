// minincl topology: public entry points.
//
//   auto sys = mncl::topo::loadXml(path);   // or detect()
//   auto result = mncl::topo::search(*sys, 0);
//   std::string text = mncl::topo::report({});   // what `minincl topo` prints
//
// Errors are TopoError (XmlError for malformed files, naming file and line).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model.h"

namespace mncl::topo {

// Detection from /sys (and NVML when present). Never throws for missing or odd files:
// what could not be found is recorded in System::warnings. `sysRoot` prefixes every
// path read ("/" for the real machine; a folder holding a fake sys/ tree in tests).
std::unique_ptr<System> detect();
std::unique_ptr<System> detectFrom(const std::string& sysRoot);

std::unique_ptr<System> loadXml(const std::string& path);
std::string dumpXml(const System& sys);

struct TreeNode {
  int parent = -1;            // rank, -1 at the root
  std::vector<int> children;  // ranks
};

// A ring hop that leaves the host: from `fromRank` out through NIC `nicOut`, into the
// next host through NIC `nicIn`, to `toRank`. NICs are indices in System::nicIds.
struct NetHop {
  int fromRank = -1, nicOut = -1, nicIn = -1, toRank = -1;
};

struct SearchResult {
  int nChannels = 0;
  double channelBw = 0;                      // GB/s each channel can move
  std::vector<std::vector<int>> rings;       // per channel, ranks (GPU indices) in order
  std::vector<std::vector<std::string>> ringHops;  // per channel, path class of ring[i]->ring[i+1]
  std::vector<std::vector<NetHop>> ringNet;  // per channel, hops between hosts
  std::vector<std::vector<TreeNode>> trees;  // per channel, indexed by rank
  std::vector<std::string> warnings;
};

// nRanks: how many GPUs take part (the first nRanks in GPU order); 0 = all.
SearchResult search(System& sys, int nRanks);

// The same search over any distinct nodes of the graph (GPUs, or CPU nodes for ranks that
// run on CPUs); rank r of the result is nodes[r].
SearchResult searchNodes(System& sys, const std::vector<int>& nodes);

struct ReportOptions {
  std::string xmlPath;   // load this instead of detecting
  std::string dumpPath;  // write the topology as XML here
  bool json = false;
  int nRanks = 0;
};

// What `minincl topo` prints. Empty xmlPath/dumpPath fall back to MININCL_TOPO_FILE /
// MININCL_TOPO_DUMP_FILE.
std::string report(const ReportOptions& options);

// The pieces of report(), for callers that already hold a System.
std::string renderText(const System& sys, const SearchResult& result);
std::string renderJson(const System& sys, const SearchResult& result);

}  // namespace mncl::topo
