// From a Python array object to (pointer, element count, type, shape): NumPy and anything
// with the buffer protocol, PyTorch and anything with DLPack. Checks what the runtime cannot
// see later: contiguity, writability of outputs, the device the memory is on.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "../../cuda/dtypes.h"

namespace mncl::py_arrays {

namespace py = pybind11;

struct ArrayView {
  void* data = nullptr;
  size_t count = 0;  // elements
  DataType dtype = DataType::f32;
  std::vector<int64_t> shape;
  int deviceType = 1;  // DLPack: 1 CPU, 2 CUDA, 3 CUDA host
  int deviceId = 0;
  py::object keepAlive;  // the array, or the DLPack capsule that owns the view
};

// `role` names the argument in errors ("send", "recv", "buf").
ArrayView view(py::handle obj, bool writable, const char* role);

// A new array like `like` (same library, type and device) of the given shape.
py::object emptyLike(py::handle like, const std::vector<int64_t>& shape);


}  // namespace mncl::py_arrays
