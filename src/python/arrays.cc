#include "arrays.h"

#include <pybind11/numpy.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "../core/error.h"
#include "../gpu/cuda_api.h"

namespace mncl::py_arrays {

namespace {

// The DLPack ABI (https://dmlc.github.io/dlpack), the few structs we read.
struct DLDevice {
  int32_t device_type, device_id;
};
struct DLDataType {
  uint8_t code, bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 };

[[noreturn]] void invalid(const std::string& msg) { throwError(mnclInvalidArgument, msg); }

std::string typeNameOf(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

bool fromFormat(const char* fmt, ssize_t itemsize, DataType* out) {
  while (*fmt == '<' || *fmt == '=' || *fmt == '@' || *fmt == '!' || *fmt == '>') {
    if (*fmt == '>' || *fmt == '!') return false;  // big-endian data
    ++fmt;
  }
  if (fmt[0] == '\0' || fmt[1] != '\0') return false;
  switch (fmt[0]) {
    case 'b': *out = DataType::i8; return true;
    case 'B': *out = DataType::u8; return true;
    case 'e': *out = DataType::f16; return true;
    case 'f': *out = DataType::f32; return true;
    case 'd': *out = DataType::f64; return true;
    case 'i': case 'l': case 'q':
      if (itemsize == 4) { *out = DataType::i32; return true; }
      if (itemsize == 8) { *out = DataType::i64; return true; }
      return false;
    case 'I': case 'L': case 'Q':
      if (itemsize == 4) { *out = DataType::u32; return true; }
      if (itemsize == 8) { *out = DataType::u64; return true; }
      return false;
    default: return false;
  }
}

bool fromDLPack(DLDataType t, DataType* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case kDLInt:
      if (t.bits == 8) *out = DataType::i8;
      else if (t.bits == 32) *out = DataType::i32;
      else if (t.bits == 64) *out = DataType::i64;
      else return false;
      return true;
    case kDLUInt:
      if (t.bits == 8) *out = DataType::u8;
      else if (t.bits == 32) *out = DataType::u32;
      else if (t.bits == 64) *out = DataType::u64;
      else return false;
      return true;
    case kDLFloat:
      if (t.bits == 16) *out = DataType::f16;
      else if (t.bits == 32) *out = DataType::f32;
      else if (t.bits == 64) *out = DataType::f64;
      else return false;
      return true;
    case kDLBfloat:
      if (t.bits != 16) return false;
      *out = DataType::bf16;
      return true;
    case kDLFloat8_e4m3fn: *out = DataType::f8e4m3; return t.bits == 8;
    case kDLFloat8_e5m2: *out = DataType::f8e5m2; return t.bits == 8;
    default: return false;
  }
}

[[noreturn]] void bigEndian(const char* role, py::handle dtype) {
  invalid(std::string(role) + " holds big-endian " + std::string(py::str(dtype.attr("name"))) +
          " elements; pass a native-endian copy: x.astype(x.dtype.newbyteorder('='))");
}

const char* kSupported =
    "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, float32, float64, float8_e4m3fn, float8_e5m2";

// NumPy arrays of ml_dtypes' bfloat16 and 8-bit floats (what JAX uses). They are NumPy user
// types (type numbers from NPY_USERDEF, 256), of which NumPy exports no buffer: the array is
// read from the array object itself, and a user type's meaning found by its name, once.
bool userTypeOf(const py::dtype& d, DataType* out) {
  static auto* known = new std::unordered_map<PyObject*, DataType>;  // GIL held; kept for the process
  if (auto it = known->find(d.ptr()); it != known->end()) {
    *out = it->second;
    return true;
  }
  std::string name = py::str(d.attr("name"));
  if (name == "bfloat16") *out = DataType::bf16;
  else if (name == "float8_e4m3fn") *out = DataType::f8e4m3;
  else if (name == "float8_e5m2") *out = DataType::f8e5m2;
  else return false;
  known->emplace(py::object(d).release().ptr(), *out);  // (the dtype stays alive with its key)
  return true;
}

// False when obj is not a NumPy array of a user type (anything else takes the other paths).
bool viewNumpyUserType(py::handle obj, bool writable, const char* role, ArrayView* out) {
  // (Read from NumPy's structs directly: this check is on every call's path, ~5 ns.)
  if (!py::detail::npy_api::get().PyArray_Check_(obj.ptr())) return false;
  PyObject* descr = py::detail::array_proxy(obj.ptr())->descr;
  if (py::detail::array_descriptor_proxy(descr)->type_num < 256) return false;
  auto a = py::reinterpret_borrow<py::array>(obj);
  ArrayView v;
  if (!userTypeOf(a.dtype(), &v.dtype)) return false;
  if (std::string(py::str(a.dtype().attr("byteorder"))) == ">") bigEndian(role, a.dtype());
  if (!(a.flags() & py::array::c_style)) {
    invalid(std::string(role) + " is not contiguous; pass a contiguous array (e.g. numpy.ascontiguousarray)");
  }
  if (writable && !a.writeable()) invalid(std::string(role) + " is read-only; the result needs a writable array");
  for (py::ssize_t i = 0; i < a.ndim(); ++i) v.shape.push_back(a.shape(i));
  v.data = const_cast<void*>(a.data());
  v.count = (size_t)a.size();
  v.keepAlive = py::reinterpret_borrow<py::object>(obj);
  *out = v;
  return true;
}

// The object's __cuda_array_interface__, or None. CuPy and PyTorch build this dict anew on
// every read, so each view reads it once.
py::object cudaInterface(py::handle obj) {
  PyObject* cai = PyObject_GetAttrString(obj.ptr(), "__cuda_array_interface__");
  if (!cai) {
    PyErr_Clear();
    return py::none();
  }
  return py::reinterpret_steal<py::object>(cai);
}

bool hasGpuInterface(py::handle obj) { return !cudaInterface(obj).is_none(); }

// Types that offered the buffer protocol only to refuse it and described themselves through
// the CUDA array interface instead: their next objects skip the refusal (a Python exception
// per array). Only touched with the GIL held.
std::unordered_set<PyTypeObject*>& bufferRefusers() {
  static auto* types = new std::unordered_set<PyTypeObject*>;
  return *types;
}

// What keeps a buffer-protocol array's memory in place while a call may use it. A NumPy
// array cannot free or move its data while referenced (resize() checks references), so the
// array itself will do. Any other exporter (bytearray, array.array, mmap) keeps its export:
// while that is held, a resize or close raises BufferError instead of freeing memory that a
// queued or running call still reads or writes.
py::object holdExport(py::handle obj, Py_buffer& b) {
  if (py::detail::npy_api::get().PyArray_Check_(obj.ptr())) {
    PyBuffer_Release(&b);
    return py::reinterpret_borrow<py::object>(obj);
  }
  auto* held = new Py_buffer(b);
  PyObject* capsule = PyCapsule_New(held, "minincl.buffer_export", [](PyObject* c) {
    auto* h = static_cast<Py_buffer*>(PyCapsule_GetPointer(c, "minincl.buffer_export"));
    PyBuffer_Release(h);
    delete h;
  });
  if (!capsule) {
    PyBuffer_Release(held);
    delete held;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

// Empty when the object offers the buffer protocol only to refuse it and describes itself as a
// GPU array instead (CuPy's device arrays do, under Python 3.12).
std::optional<ArrayView> viewBuffer(py::handle obj, bool writable, const char* role) {
  Py_buffer b;
  int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &b, flags) != 0) {
    PyErr_Clear();
    if (hasGpuInterface(obj)) return std::nullopt;
    if (writable) {
      Py_buffer ro;
      if (PyObject_GetBuffer(obj.ptr(), &ro, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        PyBuffer_Release(&ro);
        invalid(std::string(role) + " is read-only; the result needs a writable array");
      }
      PyErr_Clear();
    }
    // (NumPy exports no buffer for datetimes or user types other than those above)
    if (py::hasattr(obj, "dtype")) {
      invalid(std::string(role) + " has an unsupported element type (" + std::string(py::str(obj.attr("dtype"))) +
              "); supported: " + kSupported);
    }
    invalid(std::string(role) + ": cannot read the buffer of a " + typeNameOf(obj));
  }
  ArrayView v;
  bool contiguous = PyBuffer_IsContiguous(&b, 'C');
  bool typed = fromFormat(b.format ? b.format : "B", b.itemsize, &v.dtype);
  std::string fmt = b.format ? b.format : "B";
  v.data = b.buf;
  v.count = b.itemsize > 0 ? (size_t)(b.len / b.itemsize) : 0;
  for (int i = 0; i < b.ndim; ++i) v.shape.push_back(b.shape[i]);
  if (!contiguous || !typed) PyBuffer_Release(&b);
  if (!contiguous) invalid(std::string(role) + " is not contiguous; pass a contiguous array (e.g. numpy.ascontiguousarray)");
  if (!typed && fmt.find_first_of(">!") != std::string::npos && py::hasattr(obj, "dtype")) bigEndian(role, obj.attr("dtype"));
  if (!typed) invalid(std::string(role) + " has an unsupported element type (buffer format '" + fmt + "'); supported: " + kSupported);
  v.keepAlive = holdExport(obj, b);
  return v;
}

ArrayView viewDLPack(py::handle obj, const char* role) {
  py::object capsule = obj.attr("__dlpack__")();
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!t) {
    PyErr_Clear();
    invalid(std::string(role) + ": __dlpack__ did not return a DLPack capsule");
  }
  const DLTensor& d = t->dl_tensor;
  ArrayView v;
  if (!fromDLPack(d.dtype, &v.dtype)) invalid(std::string(role) + " has an unsupported element type; supported: " + kSupported);
  size_t n = 1;
  for (int i = 0; i < d.ndim; ++i) {
    v.shape.push_back(d.shape[i]);
    n *= (size_t)d.shape[i];
  }
  if (d.strides && n > 1) {
    int64_t expect = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      if (d.shape[i] != 1 && d.strides[i] != expect) {
        invalid(std::string(role) + " is not contiguous; pass a contiguous tensor (e.g. .contiguous())");
      }
      expect *= d.shape[i];
    }
  }
  v.data = static_cast<char*>(d.data) + d.byte_offset;
  v.count = n;
  v.deviceType = d.device.device_type;
  v.deviceId = d.device.device_id;
  v.keepAlive = capsule;  // owns the view; its destructor releases it
  return v;
}

// numba / CuPy / PyTorch's __cuda_array_interface__ typestr: byte order, kind, size.
bool fromTypestr(const std::string& t, DataType* out) {
  if (t.size() < 3 || t[0] == '>') return false;
  char kind = t[1];
  int bytes = std::atoi(t.c_str() + 2);
  switch (kind) {
    case 'i': *out = bytes == 1 ? DataType::i8 : bytes == 4 ? DataType::i32 : bytes == 8 ? DataType::i64 : DataType::count; break;
    case 'u': *out = bytes == 1 ? DataType::u8 : bytes == 4 ? DataType::u32 : bytes == 8 ? DataType::u64 : DataType::count; break;
    case 'f': *out = bytes == 2 ? DataType::f16 : bytes == 4 ? DataType::f32 : bytes == 8 ? DataType::f64 : DataType::count; break;
    default: return false;
  }
  return *out != DataType::count;
}

// GPU arrays through __cuda_array_interface__: a plain attribute read, so it synchronises
// nothing (DLPack export may touch streams, which a CUDA graph capture forbids). False when
// the interface cannot describe this array (PyTorch has no typestr for bfloat16, and refuses
// tensors that require grad): DLPack takes it then.
bool viewCudaArrayInterface(py::handle obj, py::handle interface, bool writable, const char* role, ArrayView* out) {
  if (!py::isinstance<py::dict>(interface)) return false;
  py::dict cai = py::reinterpret_borrow<py::dict>(interface);
  ArrayView v;
  if (!fromTypestr(py::str(cai["typestr"]), &v.dtype)) return false;
  py::tuple data = cai["data"];
  size_t itemsize = dataTypeSize(v.dtype);
  size_t n = 1;
  for (py::handle d : py::tuple(cai["shape"])) {
    v.shape.push_back(d.cast<int64_t>());
    n *= (size_t)v.shape.back();
  }
  if (cai.contains("strides") && !cai["strides"].is_none() && n > 1) {
    py::tuple strides = cai["strides"];
    int64_t expect = (int64_t)itemsize;
    for (int i = (int)v.shape.size() - 1; i >= 0; --i) {
      if (v.shape[i] != 1 && strides[i].cast<int64_t>() != expect) {
        invalid(std::string(role) + " is not contiguous; pass a contiguous array (e.g. cupy.ascontiguousarray)");
      }
      expect *= v.shape[i];
    }
  }
  if (writable && data[1].cast<bool>()) invalid(std::string(role) + " is read-only; the result needs a writable array");
  v.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  v.count = n;
  v.deviceType = 2;  // DLPack's kDLCUDA
  v.deviceId = gpu::deviceOfPointer(v.data);
  if (v.deviceId < 0 && n > 0) v.deviceType = 1;  // not device memory after all
  v.keepAlive = py::reinterpret_borrow<py::object>(obj);
  *out = v;
  return true;
}

// ---- PyTorch tensors, read through their own C-level attributes ----
// A tensor has no buffer protocol; its __cuda_array_interface__ is a Python property that
// builds a dict, and its __dlpack__ a Python method: 5.0 us of a 5.4 us call on a CPU tensor.
// The attributes below cost ~0.1 us each, and say the CUDA device without asking the driver.

// Whether objects of this type are torch.Tensor (or a subclass); decided once per type.
// Only asks torch when torch is already imported (otherwise no tensor type exists).
bool isTorchTensor(py::handle obj) {
  static auto* known = new std::unordered_map<PyTypeObject*, bool>;  // GIL held; kept for the process
  PyTypeObject* type = Py_TYPE(obj.ptr());
  if (auto it = known->find(type); it != known->end()) return it->second;
  bool yes = false;
  if (PyObject* torch = PyImport_GetModule(py::str("torch").ptr())) {
    py::object module = py::reinterpret_steal<py::object>(torch);
    if (py::hasattr(module, "Tensor")) {
      yes = PyObject_IsSubclass(reinterpret_cast<PyObject*>(type), module.attr("Tensor").ptr()) == 1;
    }
  }
  PyErr_Clear();
  known->emplace(type, yes);
  return yes;
}

// torch.<dtype> objects (singletons) to our types; built on first use.
const std::unordered_map<PyObject*, DataType>& torchTypes() {
  static auto* types = [] {
    auto* m = new std::unordered_map<PyObject*, DataType>;
    py::module_ torch = py::module_::import("torch");
    const std::pair<const char*, DataType> names[] = {
        {"int8", DataType::i8},       {"uint8", DataType::u8},     {"int32", DataType::i32},
        {"uint32", DataType::u32},    {"int64", DataType::i64},    {"uint64", DataType::u64},
        {"float16", DataType::f16},   {"bfloat16", DataType::bf16}, {"float32", DataType::f32},
        {"float64", DataType::f64},   {"float8_e4m3fn", DataType::f8e4m3}, {"float8_e5m2", DataType::f8e5m2}};
    for (const auto& [name, t] : names) {
      if (py::hasattr(torch, name)) (*m)[py::object(torch.attr(name)).release().ptr()] = t;  // (older torch: no uint32, no float8)
    }
    return m;
  }();
  return *types;
}

// A Python name made once and kept for the process: attribute lookups by it cost no string
// building (a name from a C string is built and interned on every use, ~0.1 us).
#define MNCL_NAME(var, text) static PyObject* const var = PyUnicode_InternFromString(text)

py::object attrOf(py::handle obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj.ptr(), name);
  if (!r) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

py::object callMethod(py::handle obj, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), name);
  if (!r) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(r);
}

// Refuses a tensor of a layout other than torch.strided (sparse, MKL-DNN), naming it.
void refuseLayout(py::handle t, const char* role) {
  std::string layout = py::str(t.attr("layout"));
  if (layout == "torch.strided") return;
  invalid(std::string(role) + " is a " + layout + " tensor; minincl's calls take dense tensors (the torch "
          "backend's all_reduce sums sparse COO ones), e.g. tensor.to_dense()");
}

ArrayView viewTorch(py::handle t, bool writable, const char* role) {
  MNCL_NAME(kDtype, "dtype");
  MNCL_NAME(kDevice, "device");
  MNCL_NAME(kIsCuda, "is_cuda");
  MNCL_NAME(kIsCpu, "is_cpu");
  MNCL_NAME(kRequiresGrad, "requires_grad");
  MNCL_NAME(kShape, "shape");
  MNCL_NAME(kGetDevice, "get_device");
  MNCL_NAME(kIsContiguous, "is_contiguous");
  MNCL_NAME(kNumel, "numel");
  MNCL_NAME(kDataPtr, "data_ptr");
  MNCL_NAME(kIsNeg, "is_neg");
  ArrayView v;
  py::object dtype = attrOf(t, kDtype);
  auto it = torchTypes().find(dtype.ptr());
  if (it == torchTypes().end()) {
    invalid(std::string(role) + " has an unsupported element type (" + std::string(py::str(dtype)) +
            "); supported: " + kSupported);
  }
  v.dtype = it->second;
  if (attrOf(t, kIsCuda).cast<bool>()) {  // (is_cuda and is_cpu: a fifth of t.device.type's cost)
    v.deviceType = 2;                       // DLPack's kDLCUDA
    v.deviceId = callMethod(t, kGetDevice).cast<int>();
  } else if (!attrOf(t, kIsCpu).cast<bool>()) {
    invalid(std::string(role) + " is a tensor on device '" + std::string(py::str(attrOf(t, kDevice))) +
            "'; minincl takes CPU and CUDA tensors");
  }
  if (writable && attrOf(t, kRequiresGrad).cast<bool>()) {
    invalid(std::string(role) + " requires grad; pass tensor.detach() or run under torch.no_grad()");
  }
  if (!callMethod(t, kIsContiguous).cast<bool>()) {
    refuseLayout(t, role);
    invalid(std::string(role) + " is not contiguous; pass a contiguous tensor (e.g. .contiguous())");
  }
  // (A negated view's memory holds the values' negations: read or written as they lie, every
  // value would have the wrong sign.)
  if (callMethod(t, kIsNeg).cast<bool>()) {
    invalid(std::string(role) + " is a negated view (its negative bit is set: _neg_view(), or the imaginary part of "
            "a conj()); pass " + (writable ? "a tensor of its own for the result" : "tensor.resolve_neg()"));
  }
  py::object shape = attrOf(t, kShape);  // torch.Size: a tuple
  for (py::handle d : py::reinterpret_borrow<py::tuple>(shape)) v.shape.push_back(d.cast<int64_t>());
  v.count = callMethod(t, kNumel).cast<size_t>();
  v.data = reinterpret_cast<void*>(callMethod(t, kDataPtr).cast<uintptr_t>());  // (includes the storage offset)
  v.keepAlive = py::reinterpret_borrow<py::object>(t);
  return v;
}

}  // namespace

ArrayView view(py::handle obj, bool writable, const char* role) {
  if (obj.is_none()) invalid(std::string(role) + " is None; expected an array");
  PyTypeObject* type = Py_TYPE(obj.ptr());
  if (ArrayView v; viewNumpyUserType(obj, writable, role, &v)) return v;
  if (PyObject_CheckBuffer(obj.ptr()) && !bufferRefusers().count(type)) {
    if (std::optional<ArrayView> v = viewBuffer(obj, writable, role)) return std::move(*v);
    bufferRefusers().insert(type);
  }
  if (isTorchTensor(obj)) {
    try {
      return viewTorch(obj, writable, role);
    } catch (py::error_already_set& e) {  // (sparse CSR and MKL-DNN tensors refuse is_contiguous() and data_ptr())
      if (e.matches(PyExc_RuntimeError)) refuseLayout(obj, role);
      throw;
    }
  }
  ArrayView cuda;
  py::object cai = cudaInterface(obj);
  if (!cai.is_none() && viewCudaArrayInterface(obj, cai, writable, role, &cuda)) return cuda;
  if (py::hasattr(obj, "__dlpack__")) {
    // PyTorch will not export a tensor that requires grad: read through a detached alias,
    // but refuse to write results into one behind autograd's back.
    if (py::hasattr(obj, "requires_grad") && obj.attr("requires_grad").cast<bool>()) {
      if (writable) invalid(std::string(role) + " requires grad; pass tensor.detach() or run under torch.no_grad()");
      return viewDLPack(obj.attr("detach")(), role);
    }
    return viewDLPack(obj, role);
  }
  invalid(std::string(role) + ": expected an array (NumPy, PyTorch, anything with DLPack or the buffer protocol), got " +
          typeNameOf(obj));
}

py::object emptyLike(py::handle like, const std::vector<int64_t>& shape) {
  py::tuple s(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) s[i] = py::int_(shape[i]);
  if (py::hasattr(like, "new_empty")) return like.attr("new_empty")(s);  // PyTorch
  std::string module = py::str(py::type::handle_of(like).attr("__module__"));
  if (module.rfind("cupy", 0) == 0) {  // on the array's device, like CuPy's own *_like
    py::object cupy = py::module_::import("cupy");
    py::object device = like.attr("device");
    device.attr("__enter__")();
    py::object out;
    try {
      out = cupy.attr("empty")(s, like.attr("dtype"));
    } catch (...) {  // (out of memory, say: the caller's current device is theirs again)
      device.attr("__exit__")(py::none(), py::none(), py::none());
      throw;
    }
    device.attr("__exit__")(py::none(), py::none(), py::none());
    return out;
  }
  if (py::hasattr(like, "dtype")) return py::module_::import("numpy").attr("empty")(s, like.attr("dtype"));
  invalid("cannot allocate a result like a " + typeNameOf(like) + "; pass recv explicitly");
}

}  // namespace mncl::py_arrays
