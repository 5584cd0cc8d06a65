// NVLink discovery through NVML, loaded at run time with dlopen so that minincl neither
// links against nor requires the NVIDIA driver.
#pragma once

#include <string>
#include <vector>

#include "model.h"

namespace mncl::topo {

struct NvmlGpu {
  std::string busId;                 // in: the GPU to query
  int sm = 0;                        // out: compute capability * 10, 0 if unknown
  std::vector<NvLinkRecord> nvlinks; // out: active NVLinks grouped by remote device
};

// Fills in what NVML knows about `gpus`. Returns false, with the reason in *why, when
// NVML cannot be loaded or initialised; that is normal on machines without the driver.
bool queryNvml(std::vector<NvmlGpu>& gpus, std::string* why);

}  // namespace mncl::topo
