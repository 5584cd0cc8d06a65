// From a Python array object to (pointer, element count, type, shape): NumPy and anything
// with the buffer protocol, PyTorch and anything with DLPack. Checks what the runtime cannot
// see later: contiguity, writability of outputs, the device the memory is on.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "../../cuda/dtypes.h"

namespace mncl::py_arrays {

namespace py = pybind11;

// An array's dimensions. Up to kInline of them are held in place, so that taking a view (two
// per call) allocates nothing; an array of more goes to the heap.
class Dims {
 public:
  void push_back(int64_t d) {
    if (n_ == kInline) heap_.assign(inline_, inline_ + kInline);  // (from the seventh on, all on the heap)
    if (n_ < kInline) inline_[n_] = d;
    else heap_.push_back(d);
    ++n_;
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](size_t i) const { return n_ <= kInline ? inline_[i] : heap_[i]; }
  int64_t back() const { return (*this)[n_ - 1]; }
  std::vector<int64_t> vector() const {
    return n_ <= kInline ? std::vector<int64_t>(inline_, inline_ + n_) : heap_;
  }

 private:
  static constexpr size_t kInline = 6;
  int64_t inline_[kInline] = {};
  size_t n_ = 0;
  std::vector<int64_t> heap_;
};

struct ArrayView {
  void* data = nullptr;
  size_t count = 0;  // elements
  DataType dtype = DataType::f32;
  Dims shape;
  int deviceType = 1;  // DLPack: 1 CPU, 2 CUDA, 3 CUDA host
  int deviceId = 0;
  py::object keepAlive;  // the array, or the DLPack capsule that owns the view
};

// `role` names the argument in errors ("send", "recv", "buf").
ArrayView view(py::handle obj, bool writable, const char* role);

// A new array like `like` (same library, type and device) of the given shape.
py::object emptyLike(py::handle like, const std::vector<int64_t>& shape);


}  // namespace mncl::py_arrays
