// A Python call's `op`: a reduction's name, or minincl.PreMulSum(scalar).
#pragma once

#include <pybind11/pybind11.h>

#include "../enqueue/enqueue.h"

namespace mncl::py_ops {

// minincl.PreMulSum: the sum over ranks of scalar * input, each rank with its own scalar
// (NCCL's ncclRedOpCreatePreMulSum). The scalar is a Python number, converted to the
// array's type when the call is made.
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

// Sets the call's reduction from `op`; a premulsum's scalar becomes one element of the call's
// type (InvalidArgument where it does not fit: a fraction or out of range for an integer type).
void apply(const OpArg& op, CollCall& call);

void bind(pybind11::module_& m);

}  // namespace mncl::py_ops
