#include "device.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "minincl.h"

namespace perf {
namespace {

// Page-aligned host memory, touched once so first-touch page faults stay out of the timings.
class HostDevice final : public Device {
 public:
  const char* name() const override { return "cpu"; }
  int mnclDevice() const override { return MNCL_DEVICE_CPU; }
  void* alloc(size_t bytes) override {
    size_t rounded = (bytes + 4095) & ~size_t{4095};
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void copyFromHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copyToHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void* stream() override { return nullptr; }
  void synchronize() override {}
};

}  // namespace

std::unique_ptr<Device> makeDevice(const std::string& kind, int rank) {
  (void)rank;
  if (kind == "cpu") return std::make_unique<HostDevice>();
  if (kind == "cuda") {
    throw std::runtime_error("-D cuda: the CUDA buffer allocator is not written yet (bench/device.cc)");
  }
  throw std::runtime_error("-D " + kind + ": expected cpu or cuda");
}

}  // namespace perf
