// Topology XML -> System. The format is NCCL's:
//   <system version="1">
//     <cpu numaid affinity arch vendor familyid modelid>
//       <pci busid class link_speed link_width>        (bridges nest)
//         <pci busid class=0x0302xx ...><gpu dev sm rank gdr><nvlink target count tclass/></gpu></pci>
//         <pci busid class=0x0207xx ...><nic><net name dev speed port gdr .../></nic></pci>
//       <nic><net .../></nic>                            (a NIC without a PCI parent)
// Cloud providers publish partial files where a GPU or NIC is just a <pci> leaf with its
// class; those load too. Several hosts: a <cluster> root holding one <system> per host
// (our extension; each <system> is a valid NCCL file on its own).
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <set>

#include "topo.h"
#include "xml.h"

namespace mncl::topo {
namespace {

struct Loader {
  System& sys;
  const std::string& path;

  [[noreturn]] void fail(const XmlElement& e, const std::string& what) const {
    throw XmlError(path + ":" + std::to_string(e.line) + ": " + what);
  }

  // An integer attribute, at least `lowest` (-1 where the format uses it for "unknown").
  int toInt(const XmlElement& e, const char* key, int fallback, int lowest = 0) const {
    const std::string* v = e.find(key);
    if (!v || v->empty()) return fallback;
    char* end = nullptr;
    errno = 0;
    long x = std::strtol(v->c_str(), &end, 0);
    std::string what = std::string("attribute ") + key + "=\"" + *v + "\"";
    if (*end != '\0') fail(e, what + " is not a number");
    if (errno == ERANGE || x < lowest || x > std::numeric_limits<int>::max())
      fail(e, what + " is out of range (" + std::to_string(lowest) + " to " +
                  std::to_string(std::numeric_limits<int>::max()) + ")");
    return static_cast<int>(x);
  }

  static void keepUnknown(const XmlElement& e, const std::set<std::string>& known, Node& n,
                          const std::string& prefix = "") {
    for (const auto& [k, v] : e.attrs)
      if (!known.count(k)) n.extra.emplace_back(prefix + k, v);
  }

  void warnIgnored(const XmlElement& e, const char* where) {
    sys.warnings.push_back(path + ":" + std::to_string(e.line) + ": ignored <" + e.name +
                           "> inside <" + where + ">");
  }

  void loadHost(const XmlElement& e) {
    int host = static_cast<int>(sys.hostNames.size());
    auto taken = [&](const std::string& name) {
      return std::find(sys.hostNames.begin(), sys.hostNames.end(), name) != sys.hostNames.end();
    };
    std::string name = e.get("hostname");
    if (name.empty()) {  // (a default name clear of those the file gives)
      name = "host" + std::to_string(host);
      for (int k = 2; taken(name); ++k) name = "host" + std::to_string(host) + "-" + std::to_string(k);
    } else if (taken(name)) {
      fail(e, "<system hostname=\"" + name + "\">: an earlier <system> names the same host");
    }
    sys.hostNames.push_back(name);
    for (const XmlElement& c : e.children) {
      if (c.name == "cpu") loadCpu(c, host);
      else warnIgnored(c, "system");
    }
  }

  void loadCpu(const XmlElement& e, int host) {
    int id = sys.addNode(NodeType::Cpu, host, -1);
    Node& cpu = sys.nodes[id];
    cpu.numaId = toInt(e, "numaid", static_cast<int>(sys.cpuIds(host).size()) - 1, -1);
    std::string affinity = e.get("affinity");
    cpu.cpus = parseCpuMask(affinity);
    if (affinity.find_first_not_of("0123456789abcdefABCDEFxX, ") != std::string::npos)
      sys.warnings.push_back(path + ":" + std::to_string(e.line) + ": affinity=\"" + affinity +
                             "\" is not a hexadecimal CPU mask (its other characters are skipped)");
    cpu.arch = e.get("arch");
    cpu.vendor = e.get("vendor");
    cpu.familyId = toInt(e, "familyid", -1, -1);
    cpu.modelId = toInt(e, "modelid", -1, -1);
    keepUnknown(e, {"numaid", "affinity", "arch", "vendor", "familyid", "modelid"}, cpu);
    loadChildren(e, host, id);
  }

  void loadChildren(const XmlElement& e, int host, int parent) {
    for (const XmlElement& c : e.children) {
      if (c.name == "pci") loadPci(c, host, parent);
      else if (c.name == "nic") loadNic(c, host, parent);
      else if (c.name != "gpu" || e.name != "pci") warnIgnored(c, e.name.c_str());  // (loadPci reads a <pci>'s <gpu>)
    }
  }

  static const XmlElement* child(const XmlElement& e, const char* name) {
    for (const XmlElement& c : e.children)
      if (c.name == name) return &c;
    return nullptr;
  }

  NodeType pciNodeType(const XmlElement& e) const {
    std::string cls = e.get("class");
    std::string vendor = e.get("vendor");
    bool display = pciClassIs(cls, 0x0302) || pciClassIs(cls, 0x0300);
    if (child(e, "gpu") || (display && (vendor.empty() || parseHex(vendor, 0) == 0x10de)))
      return NodeType::Gpu;
    if (pciClassIs(cls, 0x0604)) return NodeType::PciBridge;
    return NodeType::PciDevice;
  }

  void loadPci(const XmlElement& e, int host, int parent) {
    if (!e.find("busid")) fail(e, "<pci> has no busid attribute");
    NodeType type = pciNodeType(e);
    int id = sys.addNode(type, host, parent);
    {
      Node& n = sys.nodes[id];
      n.busId = normalizeBusId(e.get("busid"));
      n.pciClass = e.get("class");
      n.vendorId = e.get("vendor");
      n.deviceId = e.get("device");
      n.linkSpeed = e.get("link_speed");
      n.linkWidth = toInt(e, "link_width", 0);
      n.hostBridge = e.get("hostbridge");
      keepUnknown(e, {"busid", "class", "vendor", "device", "link_speed", "link_width",
                      "hostbridge"}, n);
    }
    if (type == NodeType::Gpu) {
      bool loaded = false;  // (a <pci> is one GPU: its first <gpu>)
      for (const XmlElement& c : e.children) {
        if (c.name != "gpu") continue;
        if (loaded) sys.warnings.push_back(path + ":" + std::to_string(c.line) + ": ignored a second <gpu> inside one <pci>");
        else loadGpu(c, id);
        loaded = true;
      }
    }
    bool isNic = pciClassIs(e.get("class"), 0x0207) || pciClassIs(e.get("class"), 0x0200);
    if (isNic && !child(e, "nic")) addBareNic(id);
    loadChildren(e, host, id);
  }

  void loadGpu(const XmlElement& e, int id) {
    Node& g = sys.nodes[id];
    g.dev = toInt(e, "dev", -1, -1);
    g.sm = toInt(e, "sm", 0);
    g.rank = toInt(e, "rank", -1, -1);
    g.gdr = toInt(e, "gdr", 0) != 0;
    keepUnknown(e, {"dev", "sm", "rank", "gdr"}, g, "gpu.");
    for (const XmlElement& c : e.children) {
      if (c.name != "nvlink") { warnIgnored(c, "gpu"); continue; }
      if (!c.find("target")) fail(c, "<nvlink> has no target attribute");
      NvLinkRecord rec;
      rec.target = normalizeBusId(c.get("target"));
      rec.count = toInt(c, "count", 1);
      rec.targetClass = c.get("tclass", "0x068000");
      sys.nodes[id].nvlinks.push_back(rec);
    }
  }

  // A partial file's NIC: a PCI device of network class with nothing inside.
  void addBareNic(int pciId) {
    int id = sys.addNode(NodeType::Nic, sys.nodes[pciId].host, pciId);
    sys.nodes[id].name = sys.nodes[pciId].busId;
  }

  void loadNic(const XmlElement& e, int host, int parent) {
    for (const XmlElement& c : e.children) {
      if (c.name != "net") { warnIgnored(c, "nic"); continue; }
      int id = sys.addNode(NodeType::Nic, host, parent);
      Node& n = sys.nodes[id];
      n.name = c.get("name", "net" + std::to_string(id));
      n.netDev = toInt(c, "dev", -1, -1);
      n.speedMbps = toInt(c, "speed", 0);
      n.port = toInt(c, "port", 1);
      n.guid = c.get("guid");
      n.maxConn = toInt(c, "maxconn", 0);
      n.nicGdr = toInt(c, "gdr", 0) != 0;
      keepUnknown(c, {"name", "dev", "speed", "port", "guid", "maxconn", "gdr"}, n);
    }
  }
};

}  // namespace

std::unique_ptr<System> loadXml(const std::string& path) {
  XmlElement root = parseXmlFile(path);
  auto sys = std::make_unique<System>();
  sys->source = path;
  Loader loader{*sys, path};
  if (root.name == "system") {
    loader.loadHost(root);
  } else if (root.name == "cluster") {
    for (const XmlElement& c : root.children) {
      if (c.name == "system") loader.loadHost(c);
      else loader.warnIgnored(c, "cluster");
    }
    if (sys->hostNames.empty()) loader.fail(root, "<cluster> holds no <system>");
  } else {
    loader.fail(root, "root element is <" + root.name + ">, expected <system> or <cluster>");
  }
  if (sys->cpuIds().empty()) sys->warnings.push_back(path + ": no <cpu> element found");
  sys->finalize();
  return sys;
}

}  // namespace mncl::topo
