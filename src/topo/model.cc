#include "model.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace mncl::topo {

const char* nodeTypeName(NodeType t) {
  switch (t) {
    case NodeType::Cpu: return "CPU";
    case NodeType::PciBridge: return "PCI-bridge";
    case NodeType::PciDevice: return "PCI";
    case NodeType::Gpu: return "GPU";
    case NodeType::Nic: return "NIC";
    case NodeType::NvSwitch: return "NVS";
    case NodeType::Net: return "NET";
  }
  return "?";
}

const char* linkTypeName(LinkType t) {
  switch (t) {
    case LinkType::NvLink: return "NVLink";
    case LinkType::Pcie: return "PCIe";
    case LinkType::InterSocket: return "SMP";
    case LinkType::Network: return "network";
    case LinkType::Internal: return "internal";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// Bandwidth model. Nominal per-direction figures from the public specifications; the
// search only needs them to be right relative to each other.

double pcieBandwidth(const std::string& linkSpeed, int linkWidth) {
  double gts = std::atof(linkSpeed.c_str());          // "16.0 GT/s PCIe" -> 16
  if (!(gts > 0 && gts <= 1024)) gts = 8.0;           // unknown (or "nan", "inf"): assume Gen3
  if (linkWidth <= 0) linkWidth = 16;
  // Line encoding: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT mode (~242/256) for Gen6.
  double efficiency = gts <= 5.0 ? 0.8 : gts <= 32.0 ? 128.0 / 130.0 : 242.0 / 256.0;
  return gts * linkWidth * efficiency / 8.0;
}

double nvlinkBandwidth(int sm) {
  if (sm >= 100) return 50.0;  // NVLink 5
  if (sm >= 70) return 25.0;   // NVLink 2, 3, 4: 25 GB/s per link and direction
  if (sm >= 60) return 20.0;   // NVLink 1
  return 25.0;                 // unknown architecture
}

double interSocketBandwidth(const std::string& cpuVendor) {
  // What GPU peer traffic actually gets across the SMP interconnect, which is well below
  // the interconnect's peak on most platforms.
  if (cpuVendor == "GenuineIntel") return 24.0;  // UPI
  if (cpuVendor == "AuthenticAMD") return 32.0;  // xGMI
  return 20.0;
}

double networkBandwidth(long long speedMbps) {
  if (speedMbps <= 0) return 1.25;  // unknown: assume 10 Gb/s
  return static_cast<double>(speedMbps) / 8000.0;
}

// ---------------------------------------------------------------------------------------
// CPU sets.

std::vector<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  size_t i = 0;
  auto readInt = [&](int& out) {
    size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (start == i) return false;
    out = std::atoi(text.substr(start, i - start).c_str());
    return true;
  };
  while (i < text.size()) {
    int first = 0, last = 0;
    if (!readInt(first)) { ++i; continue; }
    last = first;
    if (i < text.size() && text[i] == '-') { ++i; if (!readInt(last)) last = first; }
    for (int c = first; c <= last && c - first < 65536; ++c) cpus.insert(c);
  }
  return {cpus.begin(), cpus.end()};
}

std::string formatCpuList(const std::vector<int>& cpusIn) {
  std::vector<int> cpus = cpusIn;
  std::sort(cpus.begin(), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> parseCpuMask(const std::string& text) {
  std::string hex;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '0' && i + 1 < text.size() && (text[i + 1] == 'x' || text[i + 1] == 'X')) {
      ++i;
      continue;
    }
    if (std::isxdigit(static_cast<unsigned char>(text[i]))) hex += text[i];
  }
  std::vector<int> cpus;
  int bit = 0;
  for (auto it = hex.rbegin(); it != hex.rend(); ++it, bit += 4) {
    int nibble = std::stoi(std::string(1, *it), nullptr, 16);
    for (int b = 0; b < 4; ++b)
      if (nibble & (1 << b)) cpus.push_back(bit + b);
  }
  return cpus;
}

std::string formatCpuMask(const std::vector<int>& cpus) {
  int maxCpu = cpus.empty() ? 0 : *std::max_element(cpus.begin(), cpus.end());
  int groups = maxCpu / 32 + 1;
  std::vector<unsigned> words(groups, 0);
  for (int c : cpus)
    if (c >= 0) words[c / 32] |= 1u << (c % 32);
  std::string out;
  for (int g = groups - 1; g >= 0; --g) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", words[g]);
    out += buf;
    if (g) out += ",";
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// PCI helpers.

std::string normalizeBusId(const std::string& busIdIn) {
  std::string busId;
  for (char c : busIdIn) busId += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Domain is 4 hex digits in sysfs; NVML and some tools print 8.
  size_t colon = busId.find(':');
  if (colon != std::string::npos && busId.find(':', colon + 1) != std::string::npos) {
    std::string domain = busId.substr(0, colon);
    if (domain.size() > 4) domain = domain.substr(domain.size() - 4);
    while (domain.size() < 4) domain = "0" + domain;
    busId = domain + busId.substr(colon);
  } else if (colon != std::string::npos) {
    busId = "0000:" + busId;  // "07:00.0" without a domain
  }
  return busId;
}

long parseHex(const std::string& text, long fallback) {
  if (text.empty()) return fallback;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 16);
  return end == text.c_str() ? fallback : v;
}

bool pciClassIs(const std::string& pciClass, unsigned prefix16) {
  long cls = parseHex(pciClass, -1);
  if (cls < 0) return false;
  // Accept both the 24-bit form (0x030200) and a bare 16-bit one (0x0302).
  if (cls > 0xffff) cls >>= 8;
  return static_cast<unsigned>(cls) == prefix16;
}

// ---------------------------------------------------------------------------------------
// Graph building.

int System::addNode(NodeType type, int host, int parent) {
  Node n;
  n.type = type;
  n.id = static_cast<int>(nodes.size());
  n.host = host;
  n.parent = parent;
  nodes.push_back(std::move(n));
  if (parent >= 0) nodes[parent].children.push_back(nodes.back().id);
  return nodes.back().id;
}

int System::addLink(int a, int b, LinkType type, double bw, int nvlinkCount) {
  Link l{a, b, type, bw, nvlinkCount};
  links.push_back(l);
  int id = static_cast<int>(links.size()) - 1;
  nodes[a].links.push_back(id);
  nodes[b].links.push_back(id);
  return id;
}

int System::linkBetween(int a, int b) const {
  for (int l : nodes[a].links)
    if (otherEnd(l, a) == b) return l;
  return -1;
}

int System::otherEnd(int link, int node) const {
  return links[link].a == node ? links[link].b : links[link].a;
}

int System::cpuOf(int node) const {
  while (node >= 0 && nodes[node].type != NodeType::Cpu) node = nodes[node].parent;
  return node;
}

int System::netNode() const {
  for (const Node& n : nodes)
    if (n.type == NodeType::Net) return n.id;
  return -1;
}

std::vector<int> System::cpuIds(int host) const {
  std::vector<int> out;
  for (const Node& n : nodes)
    if (n.type == NodeType::Cpu && (host < 0 || n.host == host)) out.push_back(n.id);
  return out;
}

namespace {

double treeLinkBandwidth(const System& sys, const Node& child) {
  const Node& parent = sys.nodes[child.parent];
  if (child.type != NodeType::Nic) return pcieBandwidth(child.linkSpeed, child.linkWidth);
  // A NIC port: bounded by its card's PCIe link, or by its own speed when it has no card.
  if (parent.type == NodeType::Cpu) return networkBandwidth(child.speedMbps);
  return pcieBandwidth(parent.linkSpeed, parent.linkWidth);
}

void addTreeLinks(System& sys) {
  for (size_t i = 0; i < sys.nodes.size(); ++i) {
    const Node& n = sys.nodes[i];
    if (n.parent < 0) continue;
    bool internal = n.type == NodeType::Nic && sys.nodes[n.parent].type != NodeType::Cpu;
    sys.addLink(n.parent, n.id, internal ? LinkType::Internal : LinkType::Pcie,
                treeLinkBandwidth(sys, n));
  }
}

void addInterSocketLinks(System& sys) {
  for (size_t h = 0; h < sys.hostNames.size(); ++h) {
    std::vector<int> cpus = sys.cpuIds(static_cast<int>(h));
    for (size_t i = 0; i < cpus.size(); ++i)
      for (size_t j = i + 1; j < cpus.size(); ++j)
        sys.addLink(cpus[i], cpus[j], LinkType::InterSocket,
                    interSocketBandwidth(sys.nodes[cpus[i]].vendor));
  }
}

int findGpu(const System& sys, int host, const std::string& busId) {
  for (const Node& n : sys.nodes)
    if (n.type == NodeType::Gpu && n.host == host && n.busId == busId) return n.id;
  return -1;
}

// GPU-GPU NVLinks become direct links; links to NVSwitches (there are several switch
// chips per board) are merged into one non-blocking switch node per host.
void addNvLinks(System& sys) {
  std::map<int, int> switchLinks;  // GPU node -> NVLinks to switches
  std::vector<int> gpus;
  for (const Node& n : sys.nodes)
    if (n.type == NodeType::Gpu) gpus.push_back(n.id);
  for (int g : gpus) {
    for (const NvLinkRecord& rec : sys.nodes[g].nvlinks) {
      int peer = findGpu(sys, sys.nodes[g].host, normalizeBusId(rec.target));
      if (peer == g) continue;
      if (peer >= 0) {
        if (sys.linkBetween(g, peer) >= 0) continue;  // listed from both ends
        int sm = sys.nodes[g].sm ? sys.nodes[g].sm : sys.nodes[peer].sm;
        sys.addLink(g, peer, LinkType::NvLink, rec.count * nvlinkBandwidth(sm), rec.count);
      } else if (pciClassIs(rec.targetClass, 0x0604)) {
        int cpu = sys.cpuOf(g);  // NVLink to the CPU (e.g. POWER9)
        if (cpu >= 0 && sys.linkBetween(g, cpu) < 0)
          sys.addLink(g, cpu, LinkType::NvLink, rec.count * nvlinkBandwidth(sys.nodes[g].sm),
                      rec.count);
      } else {
        switchLinks[g] += rec.count;
      }
    }
  }
  std::map<int, int> switchOfHost;
  for (auto [g, count] : switchLinks) {
    int host = sys.nodes[g].host;
    if (!switchOfHost.count(host)) switchOfHost[host] = sys.addNode(NodeType::NvSwitch, host, -1);
    sys.addLink(g, switchOfHost[host], LinkType::NvLink,
                count * nvlinkBandwidth(sys.nodes[g].sm), count);
  }
}

void addNetwork(System& sys) {
  bool anyNic = false;
  for (const Node& n : sys.nodes) anyNic |= n.type == NodeType::Nic;
  if (sys.hostNames.size() < 2 || !anyNic) return;
  int net = sys.addNode(NodeType::Net, -1, -1);
  for (size_t i = 0; i < sys.nodes.size(); ++i)
    if (sys.nodes[i].type == NodeType::Nic)
      sys.addLink(static_cast<int>(i), net, LinkType::Network,
                  networkBandwidth(sys.nodes[i].speedMbps));
}

void numberGpus(System& sys) {
  for (size_t h = 0; h < sys.hostNames.size(); ++h) {
    std::vector<int> unnumbered;
    std::set<int> used;
    int next = 0;
    for (const Node& n : sys.nodes) {
      if (n.type != NodeType::Gpu || n.host != static_cast<int>(h)) continue;
      if (n.dev < 0) unnumbered.push_back(n.id);
      else if (!used.insert(n.dev).second)
        sys.warnings.push_back("two GPUs claim dev " + std::to_string(n.dev) + " on host " +
                               sys.hostNames[h]);
      next = std::max(next, n.dev + 1);
    }
    std::sort(unnumbered.begin(), unnumbered.end(),
              [&](int a, int b) { return sys.nodes[a].busId < sys.nodes[b].busId; });
    for (int g : unnumbered) sys.nodes[g].dev = next++;
  }
  sys.gpuIds.clear();
  for (const Node& n : sys.nodes)
    if (n.type == NodeType::Gpu) sys.gpuIds.push_back(n.id);
  std::stable_sort(sys.gpuIds.begin(), sys.gpuIds.end(), [&](int a, int b) {
    const Node &x = sys.nodes[a], &y = sys.nodes[b];
    return std::tie(x.host, x.dev) < std::tie(y.host, y.dev);
  });
}

void numberNics(System& sys) {
  sys.nicIds.clear();
  for (const Node& n : sys.nodes)
    if (n.type == NodeType::Nic) sys.nicIds.push_back(n.id);
  std::stable_sort(sys.nicIds.begin(), sys.nicIds.end(),
                   [&](int a, int b) { return sys.nodes[a].host < sys.nodes[b].host; });
  std::map<int, int> nextDev;
  for (int id : sys.nicIds) {
    Node& n = sys.nodes[id];
    if (n.netDev < 0) n.netDev = nextDev[n.host];
    nextDev[n.host] = std::max(nextDev[n.host], n.netDev + 1);
  }
}

}  // namespace

void System::finalize() {
  if (hostNames.empty()) hostNames.push_back("host0");
  numberGpus(*this);
  numberNics(*this);
  addTreeLinks(*this);
  addInterSocketLinks(*this);
  addNvLinks(*this);
  addNetwork(*this);
}

}  // namespace mncl::topo
