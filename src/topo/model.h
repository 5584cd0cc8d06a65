// The topology graph: nodes for CPUs (NUMA nodes), PCI bridges/devices, GPUs, NICs,
// NVSwitches and the network, joined by typed links that carry a bandwidth.
//
// Besides the links, CPU/PCI nodes keep the tree they were found in (parent/children):
// the tree is what XML dumps and nvidia-smi style path classes (PIX, PXB, PHB, ...) are
// defined on, while the links are what routes and bandwidths are computed on.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mncl::topo {

// Base of every error the topology code throws.
class TopoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class NodeType { Cpu, PciBridge, PciDevice, Gpu, Nic, NvSwitch, Net };
enum class LinkType { NvLink, Pcie, InterSocket, Network, Internal };

const char* nodeTypeName(NodeType t);
const char* linkTypeName(LinkType t);

// One <nvlink> element of a GPU: the far end is a GPU (by bus id) or an NVSwitch.
struct NvLinkRecord {
  std::string target;       // bus id of the remote device
  int count = 1;            // number of NVLinks to it
  std::string targetClass;  // PCI class of the remote: 0x030200 GPU, 0x068000 NVSwitch
};

using Attributes = std::vector<std::pair<std::string, std::string>>;

// One fat node type keeps the code short; fields only mean something for the types named.
struct Node {
  NodeType type = NodeType::PciDevice;
  int id = -1;             // index in System::nodes
  int host = 0;            // index in System::hostNames
  int parent = -1;         // tree parent (-1: CPU, NVSwitch, network)
  std::vector<int> children;  // tree children, in document order
  std::vector<int> links;     // indices in System::links

  // PCI (bridges, devices, GPUs): identity and upstream link.
  std::string busId, pciClass, vendorId, deviceId;
  std::string linkSpeed;   // as sysfs writes it, e.g. "16.0 GT/s PCIe"
  int linkWidth = 0;
  std::string hostBridge;  // top-level PCI nodes: which host bridge they hang off

  // CPU (one per NUMA node).
  int numaId = -1;
  std::vector<int> cpus;   // logical CPU numbers
  std::string arch, vendor;
  int familyId = -1, modelId = -1;

  // GPU.
  int dev = -1, sm = 0, rank = -1;
  bool gdr = false;
  std::vector<NvLinkRecord> nvlinks;

  // NIC (one per network port).
  std::string name;
  int netDev = -1, port = 1, maxConn = 0;
  long long speedMbps = 0;  // port speed in Mb/s
  std::string guid;
  bool nicGdr = false;

  Attributes extra;         // attributes we do not interpret, kept for the XML round trip
};

struct Link {
  int a = -1, b = -1;       // node ids; a link carries `bw` in each direction
  LinkType type = LinkType::Pcie;
  double bw = 0;            // GB/s per direction
  int nvlinkCount = 0;      // NVLink links only
};

// A directed use of a link: 2*link for a->b, 2*link+1 for b->a.
inline int directedLink(int link, bool fromA) { return 2 * link + (fromA ? 0 : 1); }

struct System {
  std::vector<Node> nodes;
  std::vector<Link> links;
  std::vector<std::string> hostNames;
  std::vector<std::string> warnings;
  std::string source;            // file it was loaded from, or "detected"

  // Devices in the order the outside world numbers them (GPUs by host then dev).
  std::vector<int> gpuIds;
  std::vector<int> nicIds;

  int addNode(NodeType type, int host, int parent);
  int addLink(int a, int b, LinkType type, double bw, int nvlinkCount = 0);
  int linkBetween(int a, int b) const;   // -1 if none
  int otherEnd(int link, int node) const;
  int cpuOf(int node) const;             // CPU ancestor in the tree, -1 if none
  int netNode() const;                   // the network node, -1 if single host
  std::vector<int> cpuIds(int host = -1) const;  // host -1: all

  // Builds the links from the tree, GPUs' NVLink records and CPU/host structure,
  // and numbers the devices. Called once after loading or detecting.
  void finalize();
};

// Bandwidth model (GB/s per direction). Nominal figures; see model.cc.
double pcieBandwidth(const std::string& linkSpeed, int linkWidth);
double nvlinkBandwidth(int sm);
double interSocketBandwidth(const std::string& cpuVendor);
double networkBandwidth(long long speedMbps);

// CPU sets: "0-3,8" lists and "ffffffff,00000000" masks (32-bit groups, high first).
std::vector<int> parseCpuList(const std::string& text);
std::string formatCpuList(const std::vector<int>& cpus);
std::vector<int> parseCpuMask(const std::string& text);
std::string formatCpuMask(const std::vector<int>& cpus);

// PCI helpers.
std::string normalizeBusId(const std::string& busId);  // "00000000:07:00.0" -> "0000:07:00.0"
bool pciClassIs(const std::string& pciClass, unsigned prefix16);  // prefix16 e.g. 0x0302
long parseHex(const std::string& text, long fallback);

}  // namespace mncl::topo
