// Which node of the topology each rank of a communicator sits on (rules in comm_plan.h).
#include <algorithm>
#include <sstream>

#include "comm_plan.h"

namespace mncl::topo {
namespace {

bool parseGpuList(const std::string& spec, std::vector<int>* out) {
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 65535) return false;  // (no cast wraps it onto a GPU)
    out->push_back(static_cast<int>(v));
  }
  return !out->empty();
}

RankMap fromSpec(const System& sys, const std::string& spec, size_t nranks) {
  RankMap m;
  std::vector<int> gpus;
  size_t nGpus = sys.gpuIds.size();
  if (!parseGpuList(spec, &gpus))
    m.error = "MININCL_TOPO_RANK_MAP=\"" + spec + "\" is not a comma list of GPU indices (0 to 65535)";
  else if (gpus.size() != nranks)
    m.error = "MININCL_TOPO_RANK_MAP names " + std::to_string(gpus.size()) + " GPUs for " +
              std::to_string(nranks) + " ranks";
  else if (*std::max_element(gpus.begin(), gpus.end()) >= static_cast<int>(nGpus))
    m.error = "MININCL_TOPO_RANK_MAP names a GPU the topology does not have (it has " +
              std::to_string(nGpus) + ")";
  if (!m.error.empty()) return m;
  for (int g : gpus) m.nodes.push_back(sys.gpuIds[g]);
  m.onGpus = true;
  m.rule = "MININCL_TOPO_RANK_MAP: rank i on GPU map[i]";
  return m;
}

int gpuWithDevice(const System& sys, int device) {
  for (int g : sys.gpuIds)
    if (sys.nodes[g].dev == device && sys.nodes[g].host == 0) return g;
  return -1;
}

bool holds(const Node& cpu, int c) { return std::find(cpu.cpus.begin(), cpu.cpus.end(), c) != cpu.cpus.end(); }

// The NUMA node of a CPU rank on host 0 (ranks of one communicator share a host).
int numaNodeOf(const System& sys, const RankPlace& p) {
  std::vector<int> cpus = sys.cpuIds(0);
  if (cpus.size() == 1) return cpus[0];
  for (int n : cpus) {
    const Node& node = sys.nodes[n];
    bool all = !p.affinity.empty();
    for (int c : p.affinity) all = all && holds(node, c);
    if (all) return n;
  }
  for (int n : cpus)
    if (p.cpu >= 0 && holds(sys.nodes[n], p.cpu)) return n;
  return -1;
}

}  // namespace

RankMap mapRanks(const System& sys, const std::vector<RankPlace>& ranks, const std::string& mapSpec,
                 bool fromFile) {
  if (!mapSpec.empty()) return fromSpec(sys, mapSpec, ranks.size());
  RankMap m;
  bool standIn = fromFile && sys.gpuIds.size() >= ranks.size();
  int cudaRanks = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankPlace& p = ranks[r];
    int node = p.device >= 0 ? gpuWithDevice(sys, p.device) : standIn ? sys.gpuIds[r] : numaNodeOf(sys, p);
    cudaRanks += p.device >= 0;
    if (node < 0) {
      m.error = "rank " + std::to_string(r) + (p.device >= 0 ? " uses CUDA device " + std::to_string(p.device) +
                                                                   ", which the topology does not list"
                                                             : " runs on CPU " + std::to_string(p.cpu) +
                                                                   ", which no NUMA node of the topology lists");
      m.nodes.clear();
      return m;
    }
    m.nodes.push_back(node);
  }
  m.onGpus = std::all_of(m.nodes.begin(), m.nodes.end(),
                         [&](int n) { return sys.nodes[n].type == NodeType::Gpu; });
  m.rule = cudaRanks > 0 ? "CUDA ranks on their devices"
           : standIn     ? "rank i on GPU i of the file (CPU ranks stand in for its GPUs)"
                         : "CPU ranks on the NUMA node of their affinity / CPU";
  return m;
}

}  // namespace mncl::topo
