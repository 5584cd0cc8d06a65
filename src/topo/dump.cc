// System -> topology XML, the inverse of load.cc. Derived nodes (the merged NVSwitch, the
// network) are not written: they are rebuilt from the NVLink records and host list.
#include <fstream>

#include "topo.h"
#include "xml.h"

namespace mncl::topo {
namespace {

void addUnknown(XmlElement& e, const Node& n, const std::string& prefix) {
  for (const auto& [k, v] : n.extra) {
    bool prefixed = k.rfind("gpu.", 0) == 0;
    if (prefix.empty() && !prefixed) e.set(k, v);
    if (!prefix.empty() && k.rfind(prefix, 0) == 0) e.set(k.substr(prefix.size()), v);
  }
}

void addIfSet(XmlElement& e, const char* key, const std::string& v) {
  if (!v.empty()) e.set(key, v);
}

XmlElement netElement(const Node& n) {
  XmlElement e;
  e.name = "net";
  e.set("name", n.name);
  e.set("dev", std::to_string(n.netDev));
  if (n.speedMbps > 0) e.set("speed", std::to_string(n.speedMbps));
  e.set("port", std::to_string(n.port));
  addIfSet(e, "guid", n.guid);
  if (n.maxConn > 0) e.set("maxconn", std::to_string(n.maxConn));
  e.set("gdr", n.nicGdr ? "1" : "0");
  addUnknown(e, n, "");
  return e;
}

XmlElement gpuElement(const Node& g) {
  XmlElement e;
  e.name = "gpu";
  e.set("dev", std::to_string(g.dev));
  e.set("sm", std::to_string(g.sm));
  if (g.rank >= 0) e.set("rank", std::to_string(g.rank));
  e.set("gdr", g.gdr ? "1" : "0");
  addUnknown(e, g, "gpu.");
  for (const NvLinkRecord& r : g.nvlinks) {
    XmlElement& l = e.add("nvlink");
    l.set("target", r.target);
    l.set("count", std::to_string(r.count));
    l.set("tclass", r.targetClass);
  }
  return e;
}

void addChildren(const System& sys, const Node& parent, XmlElement& out);

XmlElement pciElement(const System& sys, const Node& n) {
  XmlElement e;
  e.name = "pci";
  e.set("busid", n.busId);
  std::string cls = n.pciClass;
  if (cls.empty()) cls = n.type == NodeType::Gpu ? "0x030200"
                         : n.type == NodeType::PciBridge ? "0x060400" : "";
  addIfSet(e, "class", cls);
  addIfSet(e, "vendor", n.vendorId);
  addIfSet(e, "device", n.deviceId);
  addIfSet(e, "link_speed", n.linkSpeed);
  if (n.linkWidth > 0) e.set("link_width", std::to_string(n.linkWidth));
  addIfSet(e, "hostbridge", n.hostBridge);
  addUnknown(e, n, "");
  if (n.type == NodeType::Gpu) e.children.push_back(gpuElement(n));
  addChildren(sys, n, e);
  return e;
}

// PCI children in order, then the NIC ports gathered in one <nic>.
void addChildren(const System& sys, const Node& parent, XmlElement& out) {
  XmlElement nic;
  nic.name = "nic";
  for (int c : parent.children) {
    const Node& child = sys.nodes[c];
    if (child.type == NodeType::Nic) nic.children.push_back(netElement(child));
    else out.children.push_back(pciElement(sys, child));
  }
  if (!nic.children.empty()) out.children.push_back(nic);
}

XmlElement cpuElement(const System& sys, const Node& cpu) {
  XmlElement e;
  e.name = "cpu";
  e.set("numaid", std::to_string(cpu.numaId));
  e.set("affinity", formatCpuMask(cpu.cpus));
  addIfSet(e, "arch", cpu.arch);
  addIfSet(e, "vendor", cpu.vendor);
  if (cpu.familyId >= 0) e.set("familyid", std::to_string(cpu.familyId));
  if (cpu.modelId >= 0) e.set("modelid", std::to_string(cpu.modelId));
  addUnknown(e, cpu, "");
  addChildren(sys, cpu, e);
  return e;
}

XmlElement systemElement(const System& sys, int host) {
  XmlElement e;
  e.name = "system";
  e.set("version", "1");
  if (sys.hostNames.size() > 1) e.set("hostname", sys.hostNames[host]);
  for (int cpu : sys.cpuIds(host)) e.children.push_back(cpuElement(sys, sys.nodes[cpu]));
  return e;
}

}  // namespace

std::string dumpXml(const System& sys) {
  if (sys.hostNames.size() <= 1) return writeXml(systemElement(sys, 0));
  XmlElement cluster;
  cluster.name = "cluster";
  cluster.set("version", "1");
  for (size_t h = 0; h < sys.hostNames.size(); ++h)
    cluster.children.push_back(systemElement(sys, static_cast<int>(h)));
  return writeXml(cluster);
}

}  // namespace mncl::topo
