// What `minincl topo` prints: the device matrix in `nvidia-smi topo -m` form, CPU/NUMA
// facts, and the rings and trees of the search; or the same facts as JSON.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "paths.h"
#include "topo.h"

namespace mncl::topo {
namespace {

std::string deviceLabel(const System& sys, int node) {
  const Node& n = sys.nodes[node];
  const auto& ids = n.type == NodeType::Gpu ? sys.gpuIds : sys.nicIds;
  size_t i = std::find(ids.begin(), ids.end(), node) - ids.begin();
  return (n.type == NodeType::Gpu ? "GPU" : "NIC") + std::to_string(i);
}

int numaOf(const System& sys, int node) {
  int cpu = sys.cpuOf(node);
  return cpu < 0 ? -1 : sys.nodes[cpu].numaId;
}

std::string affinityOf(const System& sys, int node) {
  int cpu = sys.cpuOf(node);
  return cpu < 0 || sys.nodes[cpu].cpus.empty() ? "N/A" : formatCpuList(sys.nodes[cpu].cpus);
}

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s + " " : s + std::string(width - s.size(), ' ');
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// ------------------------------------------------------------------------ text

void textMatrix(const System& sys, const PathMatrix& m, std::ostringstream& out) {
  size_t n = m.devices.size();
  if (n == 0) return;
  std::vector<std::string> labels;
  for (int d : m.devices) labels.push_back(deviceLabel(sys, d));
  size_t w = 8;
  out << pad("", w);
  for (const auto& l : labels) out << pad(l, w);
  out << pad("CPU Affinity", 16) << "NUMA Affinity\n";
  for (size_t i = 0; i < n; ++i) {
    out << pad(labels[i], w);
    for (size_t j = 0; j < n; ++j) out << pad(routeLabel(m.routes[i][j]), w);
    int numa = numaOf(sys, m.devices[i]);
    out << pad(affinityOf(sys, m.devices[i]), 16) << (numa < 0 ? "N/A" : std::to_string(numa));
    if (sys.hostNames.size() > 1) out << "  " << sys.hostNames[sys.nodes[m.devices[i]].host];
    out << "\n";
  }
  out << "\nLegend:\n"
         "  X    = self\n"
         "  NV#  = NVLink, # links (directly or through an NVSwitch)\n"
         "  PIX  = PCIe through at most one PCIe switch\n"
         "  PXB  = PCIe through several PCIe switches, not the host bridge\n"
         "  PHB  = PCIe through the CPU's host bridge\n"
         "  NODE = PCIe across host bridges of one NUMA node\n"
         "  SYS  = PCIe and the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)\n"
         "  NET  = through the network (another host)\n";
  if (!sys.nicIds.empty()) {
    out << "\nNIC Legend:\n";
    for (int nic : sys.nicIds) {
      const Node& x = sys.nodes[nic];
      out << "  " << deviceLabel(sys, nic) << ": " << x.name;
      if (x.speedMbps > 0) out << " (" << x.speedMbps / 1000 << " Gb/s)";
      if (sys.hostNames.size() > 1) out << " on " << sys.hostNames[x.host];
      out << "\n";
    }
  }
}

void textCpus(const System& sys, std::ostringstream& out) {
  out << "\nCPUs:\n";
  for (int c : sys.cpuIds()) {
    const Node& cpu = sys.nodes[c];
    out << "  ";
    if (sys.hostNames.size() > 1) out << sys.hostNames[cpu.host] << " ";
    out << "NUMA " << cpu.numaId << ": CPUs " << (cpu.cpus.empty() ? "?" : formatCpuList(cpu.cpus));
    if (!cpu.vendor.empty()) out << ", " << cpu.vendor;
    if (cpu.familyId >= 0) out << " family " << cpu.familyId;
    if (cpu.modelId >= 0) out << " model " << cpu.modelId;
    if (!cpu.arch.empty()) out << ", " << cpu.arch;
    out << "\n";
  }
}

std::string treeText(const std::vector<TreeNode>& tree) {
  std::string s;
  for (size_t r = 0; r < tree.size(); ++r) {
    std::string kids;
    for (int c : tree[r].children) kids += (kids.empty() ? "" : "/") + std::to_string(c);
    if (kids.empty()) kids = "-1";
    s += " " + kids + "->" + std::to_string(r) + "->" + std::to_string(tree[r].parent);
  }
  return s;
}

void textSearch(const System& sys, const SearchResult& r, std::ostringstream& out) {
  if (sys.gpuIds.empty()) return;
  out << "\nChannels: " << r.nChannels << " (" << fixed1(r.channelBw) << " GB/s each)\n";
  for (size_t c = 0; c < r.rings.size(); ++c) {
    out << "  Ring " << c << ":";
    for (int x : r.rings[c]) out << " " << x;
    out << "   hops:";
    for (const auto& h : r.ringHops[c]) out << " " << h;
    for (const NetHop& n : r.ringNet[c])
      out << "   " << n.fromRank << "->NIC" << n.nicOut << "~NIC" << n.nicIn << "->" << n.toRank;
    out << "\n";
  }
  out << "Trees (children->rank->parent):\n";
  for (size_t c = 0; c < r.trees.size(); ++c) out << "  Tree " << c << ":" << treeText(r.trees[c]) << "\n";
}

// ------------------------------------------------------------------------ JSON

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += c;
  }
  return out + "\"";
}

template <class T, class F>
std::string list(const std::vector<T>& items, F toJson) {
  std::string s = "[";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + toJson(items[i]);
  return s + "]";
}

std::string num(double v) { return std::isfinite(v) ? fixed1(v) : "null"; }
std::string integer(int v) { return std::to_string(v); }

// A NIC port has no bus id of its own: it is its card's.
std::string busIdOf(const System& sys, const Node& n) {
  if (n.type == NodeType::Nic && n.parent >= 0) return sys.nodes[n.parent].busId;
  return n.busId;
}

std::string jsonDevice(const System& sys, int node) {
  const Node& n = sys.nodes[node];
  std::string s = "{\"name\": " + quote(deviceLabel(sys, node)) +
                  ", \"type\": " + quote(nodeTypeName(n.type)) +
                  ", \"busid\": " + quote(busIdOf(sys, n)) +
                  ", \"numa\": " + integer(numaOf(sys, node)) + ", \"host\": " + integer(n.host) +
                  ", \"cpu_affinity\": " + quote(affinityOf(sys, node));
  if (n.type == NodeType::Gpu) s += ", \"dev\": " + integer(n.dev) + ", \"sm\": " + integer(n.sm);
  else s += ", \"ifname\": " + quote(n.name) + ", \"speed_mbps\": " + std::to_string(n.speedMbps);
  return s + "}";
}

std::string jsonCpu(const System& sys, int c) {
  const Node& cpu = sys.nodes[c];
  return "{\"host\": " + integer(cpu.host) + ", \"numa\": " + integer(cpu.numaId) +
         ", \"affinity\": " + quote(formatCpuList(cpu.cpus)) + ", \"vendor\": " + quote(cpu.vendor) +
         ", \"arch\": " + quote(cpu.arch) + ", \"family\": " + integer(cpu.familyId) +
         ", \"model\": " + integer(cpu.modelId) + "}";
}

std::string jsonTree(const std::vector<TreeNode>& tree) {
  std::string s = "[";
  for (size_t r = 0; r < tree.size(); ++r)
    s += std::string(r ? ", " : "") + "{\"rank\": " + std::to_string(r) + ", \"parent\": " +
         integer(tree[r].parent) + ", \"children\": " + list(tree[r].children, integer) + "}";
  return s + "]";
}

std::string jsonNetHop(const NetHop& h) {
  return "{\"from\": " + integer(h.fromRank) + ", \"nic_out\": " + integer(h.nicOut) +
         ", \"nic_in\": " + integer(h.nicIn) + ", \"to\": " + integer(h.toRank) + "}";
}

std::string envOr(const std::string& value, const char* var) {
  if (!value.empty()) return value;
  const char* v = std::getenv(var);
  return v ? v : "";
}

}  // namespace

std::string renderText(const System& sys, const SearchResult& result) {
  std::ostringstream out;
  size_t numa = sys.cpuIds().size();
  out << "minincl topology (" << sys.source << "): " << sys.hostNames.size() << " host(s), "
      << numa << " NUMA node(s), " << sys.gpuIds.size() << " GPU(s), " << sys.nicIds.size()
      << " NIC(s)\n\n";
  if (sys.gpuIds.empty()) out << "No GPUs found.\n\n";
  textMatrix(sys, computePaths(sys), out);
  textCpus(sys, out);
  textSearch(sys, result, out);
  std::vector<std::string> warnings = sys.warnings;
  warnings.insert(warnings.end(), result.warnings.begin(), result.warnings.end());
  if (!warnings.empty()) {
    out << "\nWarnings:\n";
    for (const auto& w : warnings) out << "  " << w << "\n";
  }
  return out.str();
}

std::string renderJson(const System& sys, const SearchResult& result) {
  PathMatrix m = computePaths(sys);
  std::vector<std::string> labels;
  std::vector<std::vector<std::string>> cells;
  std::vector<std::vector<double>> bw;
  for (size_t i = 0; i < m.devices.size(); ++i) {
    labels.push_back(deviceLabel(sys, m.devices[i]));
    cells.emplace_back();
    bw.emplace_back();
    for (const Route& r : m.routes[i]) {
      cells.back().push_back(routeLabel(r));
      bw.back().push_back(r.reachable ? r.bw : 0);
    }
  }
  std::vector<std::string> warnings = sys.warnings;
  warnings.insert(warnings.end(), result.warnings.begin(), result.warnings.end());
  auto str = [](const std::string& s) { return quote(s); };
  auto strList = [&](const std::vector<std::string>& v) { return list(v, str); };
  auto intList = [](const std::vector<int>& v) { return list(v, integer); };
  auto numList = [](const std::vector<double>& v) { return list(v, num); };
  std::ostringstream out;
  out << "{\"source\": " << quote(sys.source) << ",\n"
      << " \"hosts\": " << strList(sys.hostNames) << ",\n"
      << " \"cpus\": " << list(sys.cpuIds(), [&](int c) { return jsonCpu(sys, c); }) << ",\n"
      << " \"devices\": " << list(m.devices, [&](int d) { return jsonDevice(sys, d); }) << ",\n"
      << " \"matrix\": {\"labels\": " << strList(labels) << ",\n  \"cells\": "
      << list(cells, strList) << ",\n  \"bandwidth\": " << list(bw, numList) << "},\n"
      << " \"nchannels\": " << result.nChannels << ",\n"
      << " \"channel_bw\": " << num(result.channelBw) << ",\n"
      << " \"rings\": " << list(result.rings, intList) << ",\n"
      << " \"ring_hops\": " << list(result.ringHops, strList) << ",\n"
      << " \"ring_net\": "
      << list(result.ringNet, [](const std::vector<NetHop>& v) { return list(v, jsonNetHop); })
      << ",\n \"trees\": " << list(result.trees, jsonTree) << ",\n"
      << " \"warnings\": " << strList(warnings) << "}\n";
  return out.str();
}

std::string report(const ReportOptions& options) {
  std::string xmlPath = envOr(options.xmlPath, "MININCL_TOPO_FILE");
  std::string dumpPath = envOr(options.dumpPath, "MININCL_TOPO_DUMP_FILE");
  std::unique_ptr<System> sys = xmlPath.empty() ? detect() : loadXml(xmlPath);
  if (!dumpPath.empty()) {
    std::ofstream f(dumpPath);
    f << dumpXml(*sys);
    f.close();  // (a short dump sits in the buffer until then: a full disk shows only at the flush)
    if (!f) throw TopoError("cannot write the topology dump to " + dumpPath);
  }
  SearchResult result = search(*sys, options.nRanks);
  return options.json ? renderJson(*sys, result) : renderText(*sys, result);
}

}  // namespace mncl::topo
