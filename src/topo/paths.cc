#include "paths.h"

#include <algorithm>
#include <limits>

namespace mncl::topo {

const char* pathTypeName(PathType t) {
  static const char* names[kPathTypes] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "NET"};
  return names[static_cast<int>(t)];
}

std::string routeLabel(const Route& r) {
  if (r.type == PathType::NvLink) return "NV" + std::to_string(r.nvlinks);
  return pathTypeName(r.type);
}

namespace {

std::vector<int> ancestors(const System& sys, int node) {
  std::vector<int> chain;
  for (int n = node; n >= 0; n = sys.nodes[n].parent) chain.push_back(n);
  return chain;
}

// The host bridge a node hangs off: named by its top-level PCI node, or shared by all
// top-level nodes of a CPU when the file does not say (then the class is PHB, as NCCL).
std::string hostBridgeOf(const System& sys, const std::vector<int>& chain) {
  if (chain.size() < 2) return "";
  return sys.nodes[chain[chain.size() - 2]].hostBridge;
}

bool allNvLink(const System& sys, const std::vector<int>& hops, int* minCount) {
  *minCount = std::numeric_limits<int>::max();
  for (int h : hops) {
    const Link& l = sys.links[h / 2];
    if (l.type != LinkType::NvLink) return false;
    *minCount = std::min(*minCount, l.nvlinkCount);
  }
  return !hops.empty();
}

}  // namespace

PathType treePathType(const System& sys, int a, int b) {
  if (a == b) return PathType::Self;
  if (sys.nodes[a].host != sys.nodes[b].host) return PathType::Net;
  std::vector<int> upA = ancestors(sys, a), upB = ancestors(sys, b);
  int cpuA = sys.cpuOf(a), cpuB = sys.cpuOf(b);
  if (cpuA < 0 || cpuA != cpuB) return PathType::Sys;
  auto inB = [&](int n) { return std::find(upB.begin(), upB.end(), n) != upB.end(); };
  int lca = *std::find_if(upA.begin(), upA.end(), inB);
  if (sys.nodes[lca].type == NodeType::Cpu) {
    std::string hbA = hostBridgeOf(sys, upA), hbB = hostBridgeOf(sys, upB);
    return (!hbA.empty() && !hbB.empty() && hbA != hbB) ? PathType::Node : PathType::Phb;
  }
  if (lca == a || lca == b) return PathType::Pix;
  // Below one CPU: count the PCI switches between the two (endpoints excluded, the
  // common ancestor counted once).
  int bridges = 0;
  auto countUpTo = [&](const std::vector<int>& up, bool includeLca) {
    for (size_t i = 1; i < up.size(); ++i) {
      if (up[i] == lca && !includeLca) break;
      if (sys.nodes[up[i]].type == NodeType::PciBridge) ++bridges;
      if (up[i] == lca) break;
    }
  };
  countUpTo(upA, true);
  countUpTo(upB, false);
  return bridges <= 1 ? PathType::Pix : PathType::Pxb;
}

Route findRoute(const System& sys, int src, int dst) {
  Route route;
  if (src == dst) {
    route.type = PathType::Self;
    route.reachable = true;
    route.bw = std::numeric_limits<double>::infinity();
    return route;
  }
  bool crossHost = sys.nodes[src].host != sys.nodes[dst].host;
  size_t n = sys.nodes.size();
  std::vector<double> bw(n, -1);
  std::vector<int> hopCount(n, 0), viaLink(n, -1);
  std::vector<bool> done(n, false);
  bw[src] = std::numeric_limits<double>::infinity();
  // Label-setting search; a dense scan is fine for graphs of a few hundred nodes.
  for (;;) {
    int u = -1;
    for (size_t i = 0; i < n; ++i) {
      if (done[i] || bw[i] < 0) continue;
      if (u < 0 || bw[i] > bw[u] || (bw[i] == bw[u] && hopCount[i] < hopCount[u]))
        u = static_cast<int>(i);
    }
    if (u < 0 || u == dst) break;
    done[u] = true;
    const Node& node = sys.nodes[u];
    if (u != src && node.type == NodeType::Gpu) continue;  // GPUs do not forward
    for (int l : node.links) {
      int v = sys.otherEnd(l, u);
      if (done[v]) continue;
      if (sys.nodes[v].type == NodeType::Net && !crossHost) continue;
      double b = std::min(bw[u], sys.links[l].bw);
      if (b > bw[v] || (b == bw[v] && hopCount[u] + 1 < hopCount[v])) {
        bw[v] = b;
        hopCount[v] = hopCount[u] + 1;
        viaLink[v] = l;
      }
    }
  }
  if (bw[dst] < 0) return route;
  for (int v = dst; v != src;) {
    int l = viaLink[v];
    int u = sys.otherEnd(l, v);
    route.hops.push_back(directedLink(l, sys.links[l].a == u));
    v = u;
  }
  std::reverse(route.hops.begin(), route.hops.end());
  route.bw = bw[dst];
  route.reachable = true;
  int nv = 0;
  if (crossHost) route.type = PathType::Net;
  else if (allNvLink(sys, route.hops, &nv)) { route.type = PathType::NvLink; route.nvlinks = nv; }
  else route.type = treePathType(sys, src, dst);
  return route;
}

PathMatrix computePaths(const System& sys) {
  PathMatrix m;
  m.devices = sys.gpuIds;
  m.devices.insert(m.devices.end(), sys.nicIds.begin(), sys.nicIds.end());
  size_t n = m.devices.size();
  m.routes.assign(n, std::vector<Route>(n));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) m.routes[i][j] = findRoute(sys, m.devices[i], m.devices[j]);
  return m;
}

}  // namespace mncl::topo
