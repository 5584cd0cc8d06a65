#include "reduce_op.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "../../cuda/dtypes.h"
#include "../core/error.h"
#include "../tune/tuner.h"

namespace py = pybind11;

namespace mncl::py_ops {
namespace {

bool isNumber(py::handle x) {
  return (py::isinstance<py::int_>(x) || py::isinstance<py::float_>(x)) && !py::isinstance<py::bool_>(x);
}

std::string shown(py::handle x) { return py::str(py::repr(x)).cast<std::string>(); }

// A NumPy scalar (np.float32(0.5), np.int64(3)): immutable, so it is a number, not an array.
bool isNumpyScalar(py::handle x) {
  py::handle type = py::type::handle_of(x);
  return py::str(type.attr("__module__")).cast<std::string>() == "numpy" &&
         py::str(type.attr("__name__")).cast<std::string>() != "ndarray" && py::hasattr(x, "item");
}

// An integer scalar as the bits of a `bytes`-wide integer, signed or not.
uint64_t integerBits(py::handle given, DataType t) {
  // (A whole float counts: torch's premul_sum factor is always a float, 2.0 for 2.)
  bool whole = py::isinstance<py::int_>(given) ||
               (py::hasattr(given, "is_integer") && given.attr("is_integer")().cast<bool>());
  MNCL_CHECK(whole, mnclInvalidArgument,
             "premul_sum scalar " + shown(given) + " is not a whole number, and the data is " + dataTypeName(t));
  py::object scalar = py::int_(py::reinterpret_borrow<py::object>(given));
  bool isSigned = t == DataType::i8 || t == DataType::i32 || t == DataType::i64;
  int bits = (int)dataTypeSize(t) * 8;
  // The type's range, as Python ints (Python compares them exactly, whatever their size).
  py::int_ one(1);
  py::object lo = isSigned ? -(one.attr("__lshift__")(bits - 1)) : py::int_(0);
  py::object hi = (isSigned ? one.attr("__lshift__")(bits - 1) : one.attr("__lshift__")(bits)) - one;
  MNCL_CHECK(scalar >= lo && scalar <= hi, mnclInvalidArgument,
             "premul_sum scalar " + shown(scalar) + " is out of range for " + dataTypeName(t) + " (" + shown(lo) +
                 " to " + shown(hi) + ")");
  // Two's complement in the type's width: the low `bits` bits of the value.
  py::object mask = one.attr("__lshift__")(bits) - one;
  return (scalar & mask).cast<uint64_t>();
}

uint64_t floatBits(py::handle scalar, DataType t) {
  double v = PyFloat_AsDouble(scalar.ptr());  // (an int past a double's range: OverflowError)
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throwError(mnclInvalidArgument, "premul_sum scalar " + shown(scalar) + " is out of range for " + dataTypeName(t));
  }
  return floatBitsOf(v, t);
}

}  // namespace

OpArg parse(py::handle op) {
  if (op.is_none()) return {};  // (not given: the default, sum)
  if (py::isinstance<py::str>(op)) {
    std::string name = op.cast<std::string>();
    static const std::pair<const char*, RedOp> names[] = {{"sum", RedOp::sum}, {"prod", RedOp::prod},
                                                          {"max", RedOp::max}, {"min", RedOp::min},
                                                          {"avg", RedOp::avg}, {"band", RedOp::band},
                                                          {"bor", RedOp::bor}, {"bxor", RedOp::bxor}};
    for (const auto& [n, redOp] : names) {
      if (name == n) return {redOp, py::object()};
    }
    throwError(mnclInvalidArgument, "unknown reduction op \"" + name +
                                        "\"; use one of sum, prod, max, min, avg, band, bor, bxor, or "
                                        "minincl.PreMulSum(scalar)");
  }
  if (py::isinstance<PreMulSum>(op)) return {RedOp::premulsum, op.cast<const PreMulSum&>().scalar};
  // (A wrong type is a TypeError, as Python's own argument checks raise: see call_args.h.)
  throw py::type_error("'op' must be a str or minincl.PreMulSum, not " +
                       py::str(py::type::handle_of(op).attr("__name__")).cast<std::string>());
}

std::optional<py_arrays::ArrayView> apply(const OpArg& op, CollCall& call) {
  call.op = op.op;
  if (op.op != RedOp::premulsum) return std::nullopt;
  if (isNumber(op.scalar)) {
    call.scalarBits = isFloat(call.dtype) ? floatBits(op.scalar, call.dtype) : integerBits(op.scalar, call.dtype);
    return std::nullopt;
  }
  py_arrays::ArrayView v = py_arrays::view(op.scalar, false, "PreMulSum scalar");
  MNCL_CHECK(v.count == 1, mnclInvalidArgument,
             "a PreMulSum scalar array must hold one element; this one holds " + std::to_string(v.count));
  MNCL_CHECK(v.dtype == call.dtype, mnclInvalidArgument,
             std::string("the PreMulSum scalar array is ") + dataTypeName(v.dtype) + " but the data is " +
                 dataTypeName(call.dtype) + "; make it the data's type (or pass a number)");
  call.scalarAt = v.data;
  return v;
}

void bind(py::module_& m) {
  py::class_<PreMulSum>(m, "PreMulSum",
                        "A reduction op: the sum over ranks of scalar * input, each rank with its own scalar "
                        "(NCCL's ncclRedOpCreatePreMulSum). Pass it as op=. A number is converted to the data's "
                        "type; a one-element array of the data's type, on the communicator's device, is read "
                        "when the operation runs.")
      .def(py::init([](py::object scalar) {
             if (isNumpyScalar(scalar)) scalar = scalar.attr("item")();
             bool array = !isNumber(scalar) && !py::isinstance<py::str>(scalar) && !py::isinstance<py::bool_>(scalar) &&
                          (py::hasattr(scalar, "__dlpack__") || py::hasattr(scalar, "__cuda_array_interface__") ||
                           PyObject_CheckBuffer(scalar.ptr()));
             MNCL_CHECK(isNumber(scalar) || array, mnclInvalidArgument,
                        "PreMulSum scalar must be an int, a float or a one-element array, not " +
                            shown(py::type::handle_of(scalar)));
             return PreMulSum{scalar};
           }),
           py::arg("scalar"))
      .def_property_readonly("scalar", [](const PreMulSum& p) { return p.scalar; })
      .def("__repr__", [](const PreMulSum& p) { return "PreMulSum(" + shown(p.scalar) + ")"; });
}

}  // namespace mncl::py_ops
