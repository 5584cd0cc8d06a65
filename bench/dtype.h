// Element types: names as nccl-tests prints them, and fp16 / bf16 as plain host structs so
// the host reference can read and write them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

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

float toFloat(Half h);
float toFloat(BFloat16 b);
Half toHalf(float f);          // round to nearest even
BFloat16 toBFloat16(float f);  // round to nearest even

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
    default: return fn.template operator()<BFloat16>();
  }
}

}  // namespace perf
