// Settings that init reads where their phase comes, in comm_gpu.cc and comm_pointer_steps.cc,
// and checks early too, with the rest, in comm.cc (Comm::checkLaterSettings).
#pragma once

#include <cstdint>
#include <string>

namespace mncl {

// MININCL_POINTER_STEPS, MININCL_DIRECT_WRITES and MININCL_POINTER_STEP_BYTES, checked.
struct PointerStepSettings {
  int64_t mode, directWrites;
  // The smallest pointer step a receiver reads through the kernel or a network proxy sends,
  // and the smallest one it reads as its own memory (DevChannel::mappedPointerStepMinBytes):
  // MININCL_POINTER_STEP_BYTES where set, both.
  int64_t minBytes, mappedMinBytes;
  bool modeChosen;  // MININCL_POINTER_STEPS is set
  int64_t readBytes, netPointerBytes;  // MININCL_POINTER_READ_BYTES, MININCL_NET_POINTER_BYTES
};
// (The defaults: a GPU's, 0; a CPU's, see comm_pointer_steps.cc.)
PointerStepSettings pointerStepSettings(int64_t defaultMinBytes, int64_t defaultMappedMinBytes);  // comm_pointer_steps.cc

// MININCL_GPU_TRANSPORT: "ipc" or "host" forces one; unset, IPC where it works.
std::string gpuTransportFromEnv();  // comm_gpu.cc

}  // namespace mncl
