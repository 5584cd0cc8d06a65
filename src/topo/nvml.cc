#include "nvml.h"

#include <dlfcn.h>

#include <map>
#include <set>

namespace mncl::topo {
namespace {

// The few NVML declarations we use, written out so no NVML header is needed.
using nvmlReturn = int;            // 0 = NVML_SUCCESS
using nvmlDevice = struct nvmlDeviceOpaque*;
struct nvmlPciInfo {               // nvmlPciInfo_t since the v2 API
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr int kMaxNvLinks = 18;    // NVML_NVLINK_MAX_LINKS on current drivers
constexpr int kRemoteGpu = 0, kRemoteNpu = 1, kRemoteSwitch = 2;

struct Nvml {
  void* lib = nullptr;
  bool initialised = false;
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  nvmlReturn (*byBusId)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*capability)(nvmlDevice, int*, int*) = nullptr;
  nvmlReturn (*linkState)(nvmlDevice, unsigned, int*) = nullptr;
  nvmlReturn (*remotePci)(nvmlDevice, unsigned, nvmlPciInfo*) = nullptr;
  nvmlReturn (*remoteType)(nvmlDevice, unsigned, int*) = nullptr;  // newer drivers only

  template <class F>
  void load(F& fn, const char* name, const char* fallback = nullptr) {
    void* sym = dlsym(lib, name);
    if (!sym && fallback) sym = dlsym(lib, fallback);
    fn = reinterpret_cast<F>(sym);
  }

  bool open(std::string* why) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { *why = "libnvidia-ml.so.1 not found"; return false; }
    load(init, "nvmlInit_v2", "nvmlInit");
    load(shutdown, "nvmlShutdown");
    load(byBusId, "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId");
    load(capability, "nvmlDeviceGetCudaComputeCapability");
    load(linkState, "nvmlDeviceGetNvLinkState");
    load(remotePci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo");
    load(remoteType, "nvmlDeviceGetNvLinkRemoteDeviceType");
    if (!init || !shutdown || !byBusId || !linkState || !remotePci) {
      *why = "libnvidia-ml.so.1 lacks the NVLink functions";
      return false;
    }
    if (init() != 0) { *why = "nvmlInit failed (no driver loaded?)"; return false; }
    initialised = true;
    return true;
  }

  ~Nvml() {
    if (initialised) shutdown();
    if (lib) dlclose(lib);
  }
};

std::string remoteClass(const Nvml& nvml, nvmlDevice dev, unsigned link, const std::string& busId,
                        const std::set<std::string>& gpuBusIds) {
  int type = -1;
  if (nvml.remoteType && nvml.remoteType(dev, link, &type) == 0) {
    if (type == kRemoteGpu) return "0x030200";
    if (type == kRemoteSwitch) return "0x068000";
    if (type == kRemoteNpu) return "0x060400";  // NVLink to the CPU
  }
  return gpuBusIds.count(busId) ? "0x030200" : "0x068000";
}

void queryGpu(const Nvml& nvml, NvmlGpu& gpu, const std::set<std::string>& gpuBusIds) {
  nvmlDevice dev = nullptr;
  if (nvml.byBusId(gpu.busId.c_str(), &dev) != 0) return;
  int major = 0, minor = 0;
  if (nvml.capability && nvml.capability(dev, &major, &minor) == 0) gpu.sm = major * 10 + minor;
  std::map<std::string, NvLinkRecord> byTarget;
  for (unsigned link = 0; link < kMaxNvLinks; ++link) {
    int active = 0;
    if (nvml.linkState(dev, link, &active) != 0 || !active) continue;
    nvmlPciInfo pci{};
    if (nvml.remotePci(dev, link, &pci) != 0) continue;
    std::string target = normalizeBusId(pci.busId);
    NvLinkRecord& rec = byTarget[target];
    if (rec.target.empty()) {
      rec = {target, 0, remoteClass(nvml, dev, link, target, gpuBusIds)};
    }
    ++rec.count;
  }
  for (auto& [target, rec] : byTarget) gpu.nvlinks.push_back(rec);
}

}  // namespace

bool queryNvml(std::vector<NvmlGpu>& gpus, std::string* why) {
  Nvml nvml;
  if (!nvml.open(why)) return false;
  std::set<std::string> gpuBusIds;
  for (const NvmlGpu& g : gpus) gpuBusIds.insert(g.busId);
  for (NvmlGpu& g : gpus) queryGpu(nvml, g, gpuBusIds);
  return true;
}

}  // namespace mncl::topo
