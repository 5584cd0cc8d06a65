// The rings a communicator runs: load or detect the topology, place the ranks on it, search
// rings over the distinct places, and widen each place back into its ranks.
#include "comm_plan.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>

#include "topo.h"

namespace mncl::topo {
namespace {

// Detection reads a few hundred sysfs files; the machine does not change under a process.
System detectedSystem() {
  static std::mutex mutex;
  static std::unique_ptr<System> cached;
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached) cached = detect();
  return *cached;
}

std::string deviceName(const System& sys, int node) {
  const Node& n = sys.nodes[node];
  if (n.type == NodeType::Gpu) {
    auto it = std::find(sys.gpuIds.begin(), sys.gpuIds.end(), node);
    return "GPU" + std::to_string(it - sys.gpuIds.begin());
  }
  if (n.type == NodeType::Cpu) return "NUMA" + std::to_string(n.numaId < 0 ? 0 : n.numaId);
  return nodeTypeName(n.type);
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

// Ranks that share a node are neighbours in every ring (their hop is free), so the search
// runs over the distinct nodes, in order of their first rank.
struct Groups {
  std::vector<int> nodes;
  std::vector<std::vector<int>> ranks;
};

Groups groupByNode(const std::vector<int>& rankNodes) {
  Groups g;
  for (size_t r = 0; r < rankNodes.size(); ++r) {
    auto it = std::find(g.nodes.begin(), g.nodes.end(), rankNodes[r]);
    if (it == g.nodes.end()) {
      g.nodes.push_back(rankNodes[r]);
      g.ranks.emplace_back();
      it = g.nodes.end() - 1;
    }
    g.ranks[it - g.nodes.begin()].push_back(static_cast<int>(r));
  }
  return g;
}

bool isPermutation(std::vector<int> ring, size_t n) {
  std::sort(ring.begin(), ring.end());
  for (size_t i = 0; i < ring.size(); ++i)
    if (ring[i] != static_cast<int>(i)) return false;
  return ring.size() == n;
}

// A search ring over groups, widened into ranks; hops inside a group are "X".
void widen(const Groups& g, const std::vector<int>& ring, const std::vector<std::string>& hops,
           CommPlan& plan) {
  std::vector<int> ranks;
  std::vector<std::string> labels;
  for (size_t i = 0; i < ring.size(); ++i) {
    const std::vector<int>& members = g.ranks[ring[i]];
    ranks.insert(ranks.end(), members.begin(), members.end());
    labels.insert(labels.end(), members.size() - 1, "X");
    labels.push_back(i < hops.size() ? hops[i] : "?");
  }
  plan.rings.push_back(ranks);
  plan.ringHops.push_back(labels);
}

// Ends a warning that made the plan fall back (a failed dump is a warning that does not).
constexpr const char* kFallback = "; rings use rank order";

CommPlan planOnSystem(System& sys, const PlanInput& in) {
  int n = static_cast<int>(in.ranks.size());
  RankMap map = mapRanks(sys, in.ranks, in.rankMap, !in.topoFile.empty());
  if (!map.error.empty()) {
    CommPlan p = rankOrderPlan(n, "rank order: the ranks could not be placed on the topology");
    p.warnings.push_back(map.error + kFallback);
    return p;
  }
  std::vector<std::string> devices;
  for (int node : map.nodes) devices.push_back(deviceName(sys, node));
  Groups g = groupByNode(map.nodes);
  if (g.nodes.size() == 1) {
    CommPlan p = rankOrderPlan(n, "rank order: all ranks on " + devices[0] + " (" + map.rule + ")");
    p.devices = devices;
    return p;
  }
  SearchResult res = searchNodes(sys, g.nodes);
  bool ok = res.nChannels > 0;
  for (const auto& ring : res.rings) ok = ok && isPermutation(ring, g.nodes.size());
  if (!ok) {
    CommPlan p = rankOrderPlan(n, "rank order: the search found no ring over " + join(devices, ","));
    for (const std::string& w : res.warnings) p.warnings.push_back(w + kFallback);
    if (p.warnings.empty()) p.warnings.push_back(std::string("the search found no ring over the ranks' devices") + kFallback);
    p.devices = devices;
    return p;
  }
  CommPlan plan;
  plan.searched = true;
  plan.onGpus = map.onGpus;
  plan.searchChannels = res.nChannels;
  plan.bwGBs = res.channelBw;
  plan.devices = devices;
  plan.notes = res.warnings;
  for (int c = 0; c < res.nChannels; ++c) widen(g, res.rings[c], res.ringHops[c], plan);
  char bw[32];
  std::snprintf(bw, sizeof(bw), "%.1f", res.channelBw);
  plan.why = map.rule + "; search over " + std::to_string(g.nodes.size()) + " devices: " +
             std::to_string(res.nChannels) + " ring(s) at " + bw + " GB/s per channel";
  return plan;
}

void dumpTo(const System& sys, const std::string& path, CommPlan& plan) {
  std::ofstream out(path);
  out << dumpXml(sys);
  out.close();  // (a short dump sits in the buffer until then: a full disk shows only at the flush)
  if (!out) plan.warnings.push_back("cannot write MININCL_TOPO_DUMP_FILE " + path);
}

// The plan of ranks that share a host; sys is null where the topology could not be read.
CommPlan planOneHost(System* sys, const std::string& readError, const PlanInput& in) {
  std::string error = readError;
  if (sys) {
    try {
      return planOnSystem(*sys, in);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  CommPlan p = rankOrderPlan(static_cast<int>(in.ranks.size()), "rank order: the topology could not be read");
  p.warnings.push_back(error + kFallback);
  return p;
}

// MININCL_TOPO_RANK_MAP's entries for some of the ranks (a list of the wrong length stays
// whole, so that the error names it).
std::string mapEntriesOf(const std::string& spec, const std::vector<int>& ranks, size_t nranks) {
  std::vector<std::string> items;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) items.push_back(item);
  if (spec.empty() || items.size() != nranks) return spec;
  std::vector<std::string> picked;
  for (int r : ranks) picked.push_back(items[r]);
  return join(picked, ",");
}

// One host's ranks (global numbers, in order) and their plan, in which they are 0..k-1.
struct HostPart {
  std::vector<int> ranks;
  CommPlan plan;
};

// Channel c's ring: each host's ring c, entered at its (c mod size)-th rank, the hosts in
// order; the hop that leaves a host is "NET".
void chainHosts(const std::vector<HostPart>& hosts, int c, CommPlan& plan) {
  std::vector<int> ring;
  std::vector<std::string> hops;
  for (const HostPart& h : hosts) {
    const std::vector<int>& local = h.plan.rings[c % h.plan.rings.size()];
    const std::vector<std::string>* localHops =
        h.plan.ringHops.empty() ? nullptr : &h.plan.ringHops[c % h.plan.ringHops.size()];
    int k = static_cast<int>(local.size()), first = c % k;
    for (int i = 0; i < k; ++i) {
      int at = (first + i) % k;
      ring.push_back(h.ranks[local[at]]);
      bool leaves = i == k - 1;
      hops.push_back(leaves ? "NET" : localHops && at < (int)localHops->size() ? (*localHops)[at] : "?");
    }
  }
  plan.rings.push_back(ring);
  plan.ringHops.push_back(hops);
}

CommPlan planAcrossHosts(System* sys, const std::string& readError, const PlanInput& in, int nHosts) {
  std::vector<HostPart> hosts(nHosts);
  for (size_t r = 0; r < in.ranks.size(); ++r) hosts[in.ranks[r].host].ranks.push_back(static_cast<int>(r));
  CommPlan plan;
  plan.onGpus = true;
  size_t nRings = 1;
  for (size_t h = 0; h < hosts.size(); ++h) {
    PlanInput mine = in;
    mine.ranks.clear();
    for (int r : hosts[h].ranks) mine.ranks.push_back(in.ranks[r]);
    mine.rankMap = mapEntriesOf(in.rankMap, hosts[h].ranks, in.ranks.size());
    CommPlan& p = hosts[h].plan = planOneHost(sys, readError, mine);
    plan.searched = plan.searched || p.searched;
    plan.onGpus = plan.onGpus && p.onGpus;
    plan.searchChannels = h == 0 ? p.searchChannels : std::min(plan.searchChannels, p.searchChannels);
    plan.bwGBs = h == 0 ? p.bwGBs : std::min(plan.bwGBs, p.bwGBs);
    nRings = std::max({nRings, p.rings.size(), hosts[h].ranks.size()});
    std::string tag = "host " + std::to_string(h) + ": ";
    for (const std::string& w : p.warnings) plan.warnings.push_back(tag + w);
    for (const std::string& w : p.notes) plan.notes.push_back(tag + w);
  }
  plan.devices.resize(in.ranks.size());
  for (const HostPart& h : hosts)
    for (size_t i = 0; i < h.ranks.size(); ++i) plan.devices[h.ranks[i]] = h.plan.devices[i];
  for (size_t c = 0; c < std::min<size_t>(nRings, 64); ++c) chainHosts(hosts, static_cast<int>(c), plan);
  plan.why = std::to_string(nHosts) + " hosts, each ring through them in turn; within host 0: " + hosts[0].plan.why;
  return plan;
}

}  // namespace

CommPlan rankOrderPlan(int nranks, const std::string& why) {
  CommPlan p;
  p.rings.emplace_back(nranks);
  std::iota(p.rings[0].begin(), p.rings[0].end(), 0);
  p.devices.assign(nranks, "?");
  p.hosts.assign(nranks, 0);
  p.why = why;
  return p;
}

CommPlan planComm(const PlanInput& in) {
  std::string source = in.topoFile.empty() ? "detected" : in.topoFile;
  std::unique_ptr<System> sys;
  std::string readError;
  try {
    sys = in.topoFile.empty() ? std::make_unique<System>(detectedSystem()) : loadXml(in.topoFile);
  } catch (const std::exception& e) {
    readError = e.what();
  }
  int nHosts = 1;
  for (const RankPlace& r : in.ranks) nHosts = std::max(nHosts, r.host + 1);
  CommPlan plan = nHosts > 1 ? planAcrossHosts(sys.get(), readError, in, nHosts) : planOneHost(sys.get(), readError, in);
  plan.hosts.clear();
  for (const RankPlace& r : in.ranks) plan.hosts.push_back(r.host);
  plan.source = source;
  if (sys) {
    if (!in.dumpFile.empty()) dumpTo(*sys, in.dumpFile, plan);
    plan.notes.insert(plan.notes.begin(), sys->warnings.begin(), sys->warnings.end());
  }
  return plan;
}

int ranksPerHost(const CommPlan& plan) {
  std::vector<int> count;
  for (int h : plan.hosts) {
    if (h >= (int)count.size()) count.resize(h + 1, 0);
    ++count[h];
  }
  bool equal = std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; });
  return count.size() > 1 && equal ? count[0] : 0;
}

// ---- the plan as text, one "key value" per line (rank 0 sends it to the others) ----

namespace {
std::string oneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}
}  // namespace

std::string encodePlan(const CommPlan& p) {
  std::ostringstream out;
  char bw[64];
  std::snprintf(bw, sizeof(bw), "%a", p.bwGBs);  // exact: every rank's tuner must agree
  out << "searched " << p.searched << "\nongpus " << p.onGpus << "\nchannels " << p.searchChannels
      << "\nbw " << bw << "\nsource " << oneLine(p.source) << "\nwhy " << oneLine(p.why) << "\n";
  for (const std::string& d : p.devices) out << "device " << d << "\n";
  for (int h : p.hosts) out << "host " << h << "\n";
  for (size_t c = 0; c < p.rings.size(); ++c) {
    out << "ring";
    for (int r : p.rings[c]) out << " " << r;
    out << "\nhops";
    if (c < p.ringHops.size())
      for (const std::string& h : p.ringHops[c]) out << " " << h;
    out << "\n";
  }
  for (const std::string& w : p.warnings) out << "warn " << oneLine(w) << "\n";
  for (const std::string& w : p.notes) out << "note " << oneLine(w) << "\n";
  return out.str();
}

CommPlan decodePlan(const std::string& text) {
  CommPlan p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t space = line.find(' ');
    std::string key = line.substr(0, space), value = space == std::string::npos ? "" : line.substr(space + 1);
    std::istringstream words(value);
    if (key == "searched") p.searched = value == "1";
    else if (key == "ongpus") p.onGpus = value == "1";
    else if (key == "channels") p.searchChannels = std::atoi(value.c_str());
    else if (key == "bw") p.bwGBs = std::strtod(value.c_str(), nullptr);
    else if (key == "source") p.source = value;
    else if (key == "why") p.why = value;
    else if (key == "device") p.devices.push_back(value);
    else if (key == "host") p.hosts.push_back(std::atoi(value.c_str()));
    else if (key == "ring") p.rings.emplace_back(std::istream_iterator<int>(words), std::istream_iterator<int>());
    else if (key == "hops")
      p.ringHops.emplace_back(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>());
    else if (key == "warn") p.warnings.push_back(value);
    else if (key == "note") p.notes.push_back(value);
  }
  return p;
}

}  // namespace mncl::topo
