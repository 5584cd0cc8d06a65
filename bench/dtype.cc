#include "dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace perf {
namespace {

constexpr TypeInfo kTypes[] = {
    {mnclInt8, "int8", 1, false},      {mnclUint8, "uint8", 1, false},
    {mnclInt32, "int32", 4, false},    {mnclUint32, "uint32", 4, false},
    {mnclInt64, "int64", 8, false},    {mnclUint64, "uint64", 8, false},
    {mnclFloat16, "half", 2, true},    {mnclFloat32, "float", 4, true},
    {mnclFloat64, "double", 8, true},  {mnclBfloat16, "bfloat16", 2, true},
    {mnclFloat8e4m3, "f8e4m3", 1, true}, {mnclFloat8e5m2, "f8e5m2", 1, true},
};

struct Alias {
  std::string_view name;
  mnclDataType_t type;
};
constexpr Alias kAliases[] = {
    {"char", mnclInt8},        {"int", mnclInt32},       {"float16", mnclFloat16},
    {"fp16", mnclFloat16},     {"float32", mnclFloat32}, {"fp32", mnclFloat32},
    {"float64", mnclFloat64},  {"fp64", mnclFloat64},    {"bf16", mnclBfloat16},
    {"float8_e4m3fn", mnclFloat8e4m3}, {"float8_e4m3", mnclFloat8e4m3}, {"float8_e5m2", mnclFloat8e5m2},
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

// 8-bit floats: a value from its sign, exponent and mantissa fields (the host reference's own
// reading of the format, independent of the device code's).
template <int kExpBits>
float fp8ToFloat(uint8_t b) {
  constexpr int kManBits = 7 - kExpBits, kBias = (1 << (kExpBits - 1)) - 1;
  int exp = (b >> kManBits) & ((1 << kExpBits) - 1), man = b & ((1 << kManBits) - 1);
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  if (kExpBits == 4 && exp == 15 && man == 7) return NAN;
  if (kExpBits == 5 && exp == 31) return man ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), 1 - kBias - kManBits);
  return sign * std::ldexp(static_cast<float>(man + (1 << kManBits)), exp - kBias - kManBits);
}

// The format's finite non-negative values in code order (ascending): codes 0 up to its
// largest finite value. Built once: the host fills and checks hundreds of MiB with them.
template <int kExpBits>
const std::vector<float>& finiteValues() {
  static const std::vector<float> values = [] {
    std::vector<float> v;
    for (int c = 0; c < 0x80 && std::isfinite(fp8ToFloat<kExpBits>(static_cast<uint8_t>(c))); ++c) {
      v.push_back(fp8ToFloat<kExpBits>(static_cast<uint8_t>(c)));
    }
    return v;
  }();
  return values;
}

// The nearest of the 8-bit values (ties to the even code), saturated to the largest finite
// one, by a search over the format's values.
template <int kExpBits>
uint8_t floatToFp8(float f) {
  if (std::isnan(f)) return 0x7f;
  const std::vector<float>& v = finiteValues<kExpBits>();
  float mag = std::fmin(std::fabs(f), v.back());
  size_t hi = static_cast<size_t>(std::lower_bound(v.begin(), v.end(), mag) - v.begin());
  size_t code = hi;
  if (hi > 0 && (hi == v.size() || mag - v[hi - 1] < v[hi] - mag || (mag - v[hi - 1] == v[hi] - mag && hi % 2 == 1))) {
    code = hi - 1;
  }
  return static_cast<uint8_t>(code | (std::signbit(f) ? 0x80 : 0));
}

float toFloat(Fp8e4m3 x) { return fp8ToFloat<4>(x.bits); }
float toFloat(Fp8e5m2 x) { return fp8ToFloat<5>(x.bits); }
Fp8e4m3 toFp8e4m3(float f) { return {floatToFp8<4>(f)}; }
Fp8e5m2 toFp8e5m2(float f) { return {floatToFp8<5>(f)}; }

}  // namespace perf
