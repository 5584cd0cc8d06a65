// Routes between devices and their nvidia-smi style classes.
#pragma once

#include <string>
#include <vector>

#include "model.h"

namespace mncl::topo {

// Best to worst, as `nvidia-smi topo -m` names them.
enum class PathType { Self, NvLink, Pix, Pxb, Phb, Node, Sys, Net };
constexpr int kPathTypes = 8;
const char* pathTypeName(PathType t);  // "X", "NV", "PIX", ...

struct Route {
  std::vector<int> hops;   // directed links (see directedLink) from source to destination
  double bw = 0;           // bottleneck bandwidth, GB/s
  PathType type = PathType::Sys;
  int nvlinks = 0;         // NvLink routes: the fewest NVLinks on any hop
  bool reachable = false;
};

std::string routeLabel(const Route& r);  // "X", "NV18", "PIX", ...

// Widest (max-bottleneck, then fewest hops) route. GPUs never relay traffic, and the
// network is only crossed between hosts.
Route findRoute(const System& sys, int src, int dst);

// Class of the PCI/CPU tree path between two nodes of one host (PIX ... SYS).
PathType treePathType(const System& sys, int a, int b);

struct PathMatrix {
  std::vector<int> devices;                // node ids: GPUs (in gpuIds order), then NICs
  std::vector<std::vector<Route>> routes;  // [i][j] from devices[i] to devices[j]
};
PathMatrix computePaths(const System& sys);

}  // namespace mncl::topo
