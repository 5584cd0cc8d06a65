// A Python call's `op`: a reduction's name, or minincl.PreMulSum(scalar).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "../enqueue/enqueue.h"
#include "arrays.h"

namespace mncl::py_ops {

// minincl.PreMulSum: the sum over ranks of scalar * input, each rank with its own scalar
// (NCCL's ncclRedOpCreatePreMulSum). The scalar is a Python number, converted to the array's
// type when the call is made; or a one-element array of that type on the communicator's
// device, read where it lies when the operation runs (C's mnclScalarDevice: no host sync).
struct PreMulSum {
  pybind11::object scalar;
};

struct OpArg {
  RedOp op = RedOp::sum;
  pybind11::object scalar;  // premulsum only
};

// None is "sum". Throws InvalidArgument for an unknown name, TypeError for anything but None,
// a str or a PreMulSum.
OpArg parse(pybind11::handle op);

// Sets the call's reduction from `op`. A premulsum's number becomes one element of the call's
// type (InvalidArgument where it does not fit: a fraction or out of range for an integer type).
// An array scalar must hold one element of the call's type; its view is returned, for the
// caller to check its device and keep it alive while the operation runs.
std::optional<py_arrays::ArrayView> apply(const OpArg& op, CollCall& call);

void bind(pybind11::module_& m);

}  // namespace mncl::py_ops
