// Where the benchmark's buffers live. The host implementation is here; a CUDA one
// (cudaMalloc, cudaMemcpy, a stream per rank) implements the same interface and is chosen
// by makeDevice("cuda", ...), so nothing else in the benchmark changes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "minincl.h"

namespace perf {

class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // The device argument for mnclCommInitRankDevice (MNCL_DEVICE_CPU or a CUDA ordinal).
  virtual int mnclDevice() const = 0;
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void copyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void copyToHost(void* dst, const void* src, size_t bytes) = 0;
  // The stream argument of collective calls (null on the CPU).
  virtual void* stream() = 0;
  // Waits until everything enqueued on stream() has finished.
  virtual void synchronize() = 0;
};

// kind "cpu" (rank unused) or "cuda" (rank picks the GPU); throws if it is not available.
std::unique_ptr<Device> makeDevice(const std::string& kind, int rank);

// A device allocation freed by its destructor; with `windowOf`, memory from
// mnclCommMemAlloc on that communicator (-R 1), touched once like the host allocator's.
class Buffer {
 public:
  Buffer(Device& dev, size_t bytes, mnclComm_t windowOf = nullptr);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  Device* dev_;
  void* ptr_ = nullptr;
  size_t bytes_;
  bool fromWindow_;
};

}  // namespace perf
