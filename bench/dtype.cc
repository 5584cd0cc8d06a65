#include "dtype.h"

#include <cstring>

namespace perf {
namespace {

constexpr TypeInfo kTypes[] = {
    {mnclInt8, "int8", 1, false},      {mnclUint8, "uint8", 1, false},
    {mnclInt32, "int32", 4, false},    {mnclUint32, "uint32", 4, false},
    {mnclInt64, "int64", 8, false},    {mnclUint64, "uint64", 8, false},
    {mnclFloat16, "half", 2, true},    {mnclFloat32, "float", 4, true},
    {mnclFloat64, "double", 8, true},  {mnclBfloat16, "bfloat16", 2, true},
};

struct Alias {
  std::string_view name;
  mnclDataType_t type;
};
constexpr Alias kAliases[] = {
    {"char", mnclInt8},        {"int", mnclInt32},       {"float16", mnclFloat16},
    {"fp16", mnclFloat16},     {"float32", mnclFloat32}, {"fp32", mnclFloat32},
    {"float64", mnclFloat64},  {"fp64", mnclFloat64},    {"bf16", mnclBfloat16},
};

uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

const TypeInfo* findType(std::string_view name) {
  for (const TypeInfo& t : kTypes) {
    if (name == t.name) return &t;
  }
  for (const Alias& a : kAliases) {
    if (name == a.name) return &typeInfo(a.type);
  }
  return nullptr;
}

const TypeInfo& typeInfo(mnclDataType_t type) { return kTypes[static_cast<int>(type)]; }

float toFloat(Half h) {
  uint32_t sign = (h.bits & 0x8000u) << 16, exp = (h.bits >> 10) & 0x1f, man = h.bits & 0x3ff;
  if (exp == 0x1f) return bitsFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {                                                       // zero / subnormal
    float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return bitsFloat(sign | ((exp + 112) << 23) | (man << 13));
}

Half toHalf(float f) {
  uint32_t u = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0))};
  float a = bitsFloat(absu);
  if (a >= 65520.0f) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x1p-14f) {                                                 // subnormal: multiple of 2^-24
    float scaled = a * 0x1p24f;
    uint32_t m = static_cast<uint32_t>(scaled);
    float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1))) ++m;
    return {static_cast<uint16_t>(sign | m)};
  }
  uint32_t exp = ((absu >> 23) - 112) << 10, man = absu & 0x7fffffu;
  uint32_t h = exp | (man >> 13), rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;  // carries into the exponent correctly
  return {static_cast<uint16_t>(sign | h)};
}

float toFloat(BFloat16 b) { return bitsFloat(static_cast<uint32_t>(b.bits) << 16); }

BFloat16 toBFloat16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // nan
  u += 0x7fffu + ((u >> 16) & 1);
  return {static_cast<uint16_t>(u >> 16)};
}

}  // namespace perf
