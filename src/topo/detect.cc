// Topology detection on Linux, from /sys (PCI tree, NUMA nodes, network and InfiniBand
// devices), /proc/cpuinfo, and NVML when the driver is there.
//
// Containers and VMs often show a flattened or partial /sys. Nothing here throws for a
// missing or odd file: whatever cannot be read becomes a warning and a sensible default.
#include <sys/utsname.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "nvml.h"
#include "topo.h"

namespace mncl::topo {
namespace {

namespace fs = std::filesystem;

bool isBusId(const std::string& s) {
  static const std::regex pattern("[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-9a-fA-F]");
  return std::regex_match(s, pattern);
}

bool isHostBridgeDir(const std::string& s) {  // "pci0000:00"
  return s.rfind("pci", 0) == 0 && s.find(':') != std::string::npos;
}

// Reads below a root so that tests can point detection at a fake tree.
class Sysfs {
 public:
  explicit Sysfs(std::string root) : root_(std::move(root)) {
    while (!root_.empty() && root_.back() == '/') root_.pop_back();
  }
  bool isReal() const { return root_.empty(); }

  std::string readLine(const std::string& path) const {
    std::ifstream in(root_ + path);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    return line;
  }
  std::vector<std::string> readLines(const std::string& path) const {
    std::ifstream in(root_ + path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  std::vector<std::string> list(const std::string& dir) const {
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(root_ + dir, ec), end; !ec && it != end; it.increment(ec))
      names.push_back(it->path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  bool exists(const std::string& path) const {
    std::error_code ec;
    return fs::exists(root_ + path, ec);
  }
  // Path components of the resolved path, below the root; empty if it does not resolve.
  std::vector<std::string> resolve(const std::string& path) const {
    std::error_code ec;
    fs::path real = fs::canonical(root_ + path, ec);
    if (ec) return {};
    std::string s = real.string();
    if (!root_.empty()) {
      std::error_code ec2;
      std::string base = fs::canonical(root_, ec2).string();
      if (!ec2 && s.rfind(base, 0) == 0) s = s.substr(base.size());
    }
    std::vector<std::string> parts;
    for (const auto& p : fs::path(s)) {
      std::string part = p.string();
      if (!part.empty() && part != "/") parts.push_back(part);
    }
    return parts;
  }

 private:
  std::string root_;
};

class Detector {
 public:
  Detector(const std::string& root, System& sys) : fs_(root), sys_(sys) {}

  void run() {
    sys_.hostNames.push_back(hostName());
    step("NUMA nodes", [&] { detectCpus(); });
    step("GPUs", [&] { detectGpus(); });
    step("InfiniBand devices", [&] { detectInfiniband(); });
    step("network interfaces", [&] { detectNetInterfaces(); });
    step("NVML", [&] { detectNvLinks(); });
  }

 private:
  Sysfs fs_;
  System& sys_;
  std::map<int, int> cpuOfNuma_;
  std::map<std::string, int> pciNode_;     // bus id -> node (merged switch ports map to one)
  std::set<std::string> nicBusIds_;        // PCI functions already holding a NIC
  bool warnedFlat_ = false;
  bool gdr_ = false;

  template <class F>
  void step(const char* what, F f) {
    try {
      f();
    } catch (const std::exception& e) {
      sys_.warnings.push_back(std::string("detecting ") + what + " failed: " + e.what());
    }
  }

  std::string hostName() const {
    std::string h = fs_.isReal() ? fs_.readLine("/proc/sys/kernel/hostname") : "";
    return h.empty() ? "host0" : h;
  }

  // ------------------------------------------------------------------ CPUs

  void detectCpus() {
    for (const std::string& name : fs_.list("/sys/devices/system/node")) {
      if (name.size() < 5 || name.rfind("node", 0) != 0 ||
          name.find_first_not_of("0123456789", 4) != std::string::npos)
        continue;
      int numa = std::stoi(name.substr(4));
      addCpu(numa, parseCpuList(fs_.readLine("/sys/devices/system/node/" + name + "/cpulist")));
    }
    if (cpuOfNuma_.empty()) {
      sys_.warnings.push_back("no NUMA nodes under /sys/devices/system/node; assuming one");
      std::vector<int> cpus = parseCpuList(fs_.readLine("/sys/devices/system/cpu/online"));
      if (cpus.empty())
        for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c)
          cpus.push_back(static_cast<int>(c));
      addCpu(0, cpus);
    }
    describeCpus();
  }

  void addCpu(int numa, std::vector<int> cpus) {
    int id = sys_.addNode(NodeType::Cpu, 0, -1);
    sys_.nodes[id].numaId = numa;
    sys_.nodes[id].cpus = std::move(cpus);
    cpuOfNuma_[numa] = id;
  }

  void describeCpus() {
    std::string vendor, family, model;
    for (const std::string& line : fs_.readLines("/proc/cpuinfo")) {
      size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
      std::string value = line.substr(std::min(line.size(), colon + 2));
      if (key == "vendor_id" && vendor.empty()) vendor = value;
      else if (key == "CPU implementer" && vendor.empty()) vendor = "ARM";
      else if (key == "cpu family" && family.empty()) family = value;
      else if (key == "model" && model.empty()) model = value;
    }
    struct utsname u {};
    std::string arch = uname(&u) == 0 ? u.machine : "";
    for (auto [numa, id] : cpuOfNuma_) {
      Node& cpu = sys_.nodes[id];
      cpu.vendor = vendor;
      cpu.arch = arch;
      cpu.familyId = family.empty() ? -1 : std::atoi(family.c_str());
      cpu.modelId = model.empty() ? -1 : std::atoi(model.c_str());
    }
  }

  int cpuForNuma(int numa) const {
    auto it = cpuOfNuma_.find(numa);
    return it != cpuOfNuma_.end() ? it->second : cpuOfNuma_.begin()->second;
  }

  // ------------------------------------------------------------------ PCI tree

  std::string devicePath(const std::string& busId) const { return "/sys/bus/pci/devices/" + busId; }

  void readPciAttributes(Node& n, const std::string& busId) const {
    std::string dir = devicePath(busId);
    n.busId = normalizeBusId(busId);
    n.pciClass = fs_.readLine(dir + "/class");
    n.vendorId = fs_.readLine(dir + "/vendor");
    n.deviceId = fs_.readLine(dir + "/device");
    n.linkSpeed = fs_.readLine(dir + "/current_link_speed");
    if (n.linkSpeed.empty() || n.linkSpeed.find("Unknown") != std::string::npos)
      n.linkSpeed = fs_.readLine(dir + "/max_link_speed");
    if (n.linkSpeed.find("Unknown") != std::string::npos) n.linkSpeed.clear();
    n.linkWidth = std::atoi(fs_.readLine(dir + "/current_link_width").c_str());
  }

  // A switch shows in sysfs as an upstream port and one downstream port per slot, all
  // with the same vendor:device; fold them into one node so that two GPUs behind one
  // switch are PIX, as nvidia-smi says.
  int bridgeNode(const std::string& busId, int parent, const std::string& hostBridge) {
    if (auto it = pciNode_.find(busId); it != pciNode_.end()) return it->second;
    Node probe;
    readPciAttributes(probe, busId);
    const Node& up = sys_.nodes[parent];
    bool underCpu = up.type == NodeType::Cpu;
    if (up.type == NodeType::PciBridge && !probe.vendorId.empty() &&
        up.vendorId == probe.vendorId && up.deviceId == probe.deviceId) {
      pciNode_[busId] = parent;
      return parent;
    }
    int id = sys_.addNode(NodeType::PciBridge, 0, parent);
    Node& n = sys_.nodes[id];
    std::vector<int> keepChildren = std::move(n.children);
    n = std::move(probe);
    n.type = NodeType::PciBridge;
    n.id = id;
    n.parent = parent;
    n.children = std::move(keepChildren);
    if (underCpu) n.hostBridge = hostBridge;
    pciNode_[busId] = id;
    return id;
  }

  // Creates the device and the bridges above it; returns the device's node.
  int attachPciDevice(const std::string& busId, NodeType type) {
    if (auto it = pciNode_.find(busId); it != pciNode_.end()) return it->second;
    std::vector<std::string> chain;
    std::string hostBridge;
    for (const std::string& part : fs_.resolve(devicePath(busId))) {
      if (isHostBridgeDir(part)) hostBridge = part;
      else if (isBusId(part)) chain.push_back(part);
    }
    if (chain.empty() || chain.back() != busId || hostBridge.empty()) {
      if (!warnedFlat_)
        sys_.warnings.push_back("PCI hierarchy not visible in /sys (flattened sysfs?): devices "
                                "are shown attached directly to their CPU");
      warnedFlat_ = true;
      chain = {busId};
    }
    int numa = std::atoi(fs_.readLine(devicePath(busId) + "/numa_node").c_str());
    if (fs_.readLine(devicePath(busId) + "/numa_node").empty()) numa = -1;
    int parent = cpuForNuma(numa);
    for (size_t i = 0; i + 1 < chain.size(); ++i) parent = bridgeNode(chain[i], parent, hostBridge);
    int id = sys_.addNode(type, 0, parent);
    std::vector<int> keep = std::move(sys_.nodes[id].children);
    readPciAttributes(sys_.nodes[id], busId);
    sys_.nodes[id].children = std::move(keep);
    if (parent == cpuForNuma(numa)) sys_.nodes[id].hostBridge = hostBridge;
    pciNode_[busId] = id;
    return id;
  }

  // ------------------------------------------------------------------ devices

  void detectGpus() {
    gdr_ = fs_.exists("/sys/kernel/mm/memory_peers/nv_mem/version") ||
           fs_.exists("/sys/module/nvidia_peermem");
    for (const std::string& busId : fs_.list("/sys/bus/pci/devices")) {
      std::string dir = devicePath(busId);
      long vendor = parseHex(fs_.readLine(dir + "/vendor"), -1);
      std::string cls = fs_.readLine(dir + "/class");
      if (vendor != 0x10de || !(pciClassIs(cls, 0x0302) || pciClassIs(cls, 0x0300))) continue;
      int id = attachPciDevice(busId, NodeType::Gpu);
      sys_.nodes[id].gdr = gdr_;
    }
  }

  std::string pciFunctionOf(const std::string& path) const {
    std::string last;
    for (const std::string& part : fs_.resolve(path))
      if (isBusId(part)) last = part;
    return last;
  }

  int addNic(int parent, const std::string& name) {
    int id = sys_.addNode(NodeType::Nic, 0, parent);
    sys_.nodes[id].name = name;
    sys_.nodes[id].nicGdr = gdr_;
    return id;
  }

  void detectInfiniband() {
    for (const std::string& dev : fs_.list("/sys/class/infiniband")) {
      std::string base = "/sys/class/infiniband/" + dev;
      std::string busId = pciFunctionOf(base + "/device");
      int parent = busId.empty() ? cpuForNuma(-1) : attachPciDevice(busId, NodeType::PciDevice);
      if (!busId.empty()) nicBusIds_.insert(busId);
      std::vector<std::string> ports = fs_.list(base + "/ports"), active;
      for (const std::string& p : ports)
        if (fs_.readLine(base + "/ports/" + p + "/state").find("ACTIVE") != std::string::npos)
          active.push_back(p);
      if (active.empty() && !ports.empty()) {
        sys_.warnings.push_back(dev + ": no active port");
        active = {ports.front()};
      }
      for (const std::string& p : active) {
        int id = addNic(parent, dev);
        Node& nic = sys_.nodes[id];
        nic.port = std::atoi(p.c_str());
        // "400 Gb/sec (4X NDR)" -> 400000 Mb/s
        nic.speedMbps = static_cast<long long>(
            std::atof(fs_.readLine(base + "/ports/" + p + "/rate").c_str()) * 1000);
        std::string guid = fs_.readLine(base + "/node_guid");
        guid.erase(std::remove(guid.begin(), guid.end(), ':'), guid.end());
        if (!guid.empty()) nic.guid = "0x" + guid;
      }
    }
  }

  void detectNetInterfaces() {
    std::vector<std::string> virtualIfs;
    for (const std::string& ifname : fs_.list("/sys/class/net")) {
      if (ifname == "lo") continue;
      std::string base = "/sys/class/net/" + ifname;
      std::string busId = pciFunctionOf(base + "/device");
      if (busId.empty()) { virtualIfs.push_back(ifname); continue; }
      if (nicBusIds_.count(busId)) continue;  // the Ethernet face of an RDMA device
      int id = addNic(attachPciDevice(busId, NodeType::PciDevice), ifname);
      sys_.nodes[id].speedMbps = std::max(0, std::atoi(fs_.readLine(base + "/speed").c_str()));
    }
    if (hasNic()) return;
    // No physical NIC (a container or a VM): show the interfaces that are up.
    for (const std::string& ifname : virtualIfs) {
      std::string state = fs_.readLine("/sys/class/net/" + ifname + "/operstate");
      if (state != "up" && state != "unknown") continue;
      int id = addNic(cpuForNuma(-1), ifname);
      std::string speed = fs_.readLine("/sys/class/net/" + ifname + "/speed");
      sys_.nodes[id].speedMbps = std::max(0, std::atoi(speed.c_str()));
      sys_.warnings.push_back("network interface " + ifname +
                              " has no PCI device (virtual); shown attached to CPU " +
                              std::to_string(sys_.nodes[cpuForNuma(-1)].numaId));
    }
    if (!hasNic()) sys_.warnings.push_back("no network interface found besides loopback");
  }

  bool hasNic() const {
    return std::any_of(sys_.nodes.begin(), sys_.nodes.end(),
                       [](const Node& n) { return n.type == NodeType::Nic; });
  }

  // ------------------------------------------------------------------ NVLink

  void detectNvLinks() {
    std::vector<NvmlGpu> query;
    for (const Node& n : sys_.nodes)
      if (n.type == NodeType::Gpu) query.push_back({n.busId, 0, {}});
    if (query.empty() || !fs_.isReal()) return;
    std::string why;
    if (!queryNvml(query, &why)) {
      sys_.warnings.push_back("NVML unavailable (" + why +
                              "): NVLinks and SM versions not detected");
      return;
    }
    for (const NvmlGpu& q : query)
      for (Node& n : sys_.nodes)
        if (n.type == NodeType::Gpu && n.busId == q.busId) {
          n.sm = q.sm;
          n.nvlinks = q.nvlinks;
        }
  }
};

}  // namespace

std::unique_ptr<System> detectFrom(const std::string& sysRoot) {
  auto sys = std::make_unique<System>();
  std::string root = sysRoot == "/" ? "" : sysRoot;
  sys->source = root.empty() ? "detected" : "detected under " + root;
  try {
    Detector(root, *sys).run();
    sys->finalize();
  } catch (const std::exception& e) {
    // Last resort: a detection bug must not take the caller down.
    auto fallback = std::make_unique<System>();
    fallback->source = sys->source;
    fallback->warnings = sys->warnings;
    fallback->warnings.push_back(std::string("topology detection failed: ") + e.what());
    int cpu = fallback->addNode(NodeType::Cpu, 0, -1);
    fallback->nodes[cpu].numaId = 0;
    fallback->finalize();
    return fallback;
  }
  return sys;
}

std::unique_ptr<System> detect() { return detectFrom("/"); }

}  // namespace mncl::topo
