// Element types: names as nccl-tests prints them, and fp16 / bf16 / fp8 as plain host structs
// so the host reference can read and write them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "minincl.h"

namespace perf {

struct TypeInfo {
  mnclDataType_t type;
  const char* name;  // as printed in the table
  size_t size;
  bool isFloat;
};

// "float", "float32", "half", "float16", "bf16", ... -> the type; nullptr if unknown.
const TypeInfo* findType(std::string_view name);
const TypeInfo& typeInfo(mnclDataType_t type);

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

struct Fp8e4m3 {
  uint8_t bits;
};
struct Fp8e5m2 {
  uint8_t bits;
};

float toFloat(Half h);
float toFloat(BFloat16 b);
float toFloat(Fp8e4m3 x);
float toFloat(Fp8e5m2 x);
Half toHalf(float f);          // round to nearest even
BFloat16 toBFloat16(float f);  // round to nearest even
Fp8e4m3 toFp8e4m3(float f);    // round to nearest even, saturating (as the reductions do)
Fp8e5m2 toFp8e5m2(float f);

// A value of host type T (for the floats: rounded to nearest even; 8-bit floats saturate).
template <typename T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, Half>) return toHalf(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>) return toBFloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, Fp8e4m3>) return toFp8e4m3(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, Fp8e5m2>) return toFp8e5m2(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <typename T>
double toDouble(T v) {
  if constexpr (requires { toFloat(v); }) return toFloat(v);
  else return static_cast<double>(v);
}

// Calls fn.template operator()<T>() with T the host type of `type`.
template <typename Fn>
decltype(auto) withType(mnclDataType_t type, Fn&& fn) {
  switch (type) {
    case mnclInt8: return fn.template operator()<int8_t>();
    case mnclUint8: return fn.template operator()<uint8_t>();
    case mnclInt32: return fn.template operator()<int32_t>();
    case mnclUint32: return fn.template operator()<uint32_t>();
    case mnclInt64: return fn.template operator()<int64_t>();
    case mnclUint64: return fn.template operator()<uint64_t>();
    case mnclFloat16: return fn.template operator()<Half>();
    case mnclFloat32: return fn.template operator()<float>();
    case mnclFloat64: return fn.template operator()<double>();
    case mnclFloat8e4m3: return fn.template operator()<Fp8e4m3>();
    case mnclFloat8e5m2: return fn.template operator()<Fp8e5m2>();
    default: return fn.template operator()<BFloat16>();
  }
}

}  // namespace perf
