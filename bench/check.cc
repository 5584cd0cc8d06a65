#include "check.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "dtype.h"

namespace perf {
namespace {

// Rank r's element i: 1..5, so sums and products of a few ranks are exact.
inline int pattern(int rank, size_t i) { return static_cast<int>((i * 7 + static_cast<size_t>(rank) * 3) % 5) + 1; }

// (8-bit floats round at every step of a reduction: only gross errors show)
template <typename T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, Fp8e4m3>) return 0.25;
  else if constexpr (std::is_same_v<T, Fp8e5m2>) return 0.5;
  else if constexpr (std::is_same_v<T, Half>) return 1e-2;
  else if constexpr (std::is_same_v<T, BFloat16>) return 2e-2;
  else if constexpr (std::is_same_v<T, float>) return 1e-5;
  else return 1e-12;
}

// The reduction of element i over all ranks, in T's own arithmetic for integers (wrapping,
// C division for avg) and in double, rounded once to T, for floating types.
template <typename T>
T reference(mnclRedOp_t op, int nranks, size_t i) {
  // premulsum: rank q's input times premulScalar(q), then summed (exact: small integers).
  auto input = [&](int q) { return pattern(q, i) * (op == kPreMulSum ? premulScalar(q) : 1); };
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    U acc = static_cast<U>(input(0));
    for (int q = 1; q < nranks; ++q) {
      U v = static_cast<U>(input(q));
      switch (op) {
        case mnclProd: acc = static_cast<U>(acc * v); break;
        case mnclMax: acc = static_cast<T>(v) > static_cast<T>(acc) ? v : acc; break;
        case mnclMin: acc = static_cast<T>(v) < static_cast<T>(acc) ? v : acc; break;
        case mnclBand: acc = static_cast<U>(acc & v); break;
        case mnclBor: acc = static_cast<U>(acc | v); break;
        case mnclBxor: acc = static_cast<U>(acc ^ v); break;
        default: acc = static_cast<U>(acc + v); break;  // sum, avg, premulsum
      }
    }
    T r = static_cast<T>(acc);
    return op == mnclAvg ? static_cast<T>(r / static_cast<T>(nranks)) : r;
  } else {
    double acc = input(0);
    for (int q = 1; q < nranks; ++q) {
      double v = input(q);
      switch (op) {
        case mnclProd: acc *= v; break;
        case mnclMax: acc = std::fmax(acc, v); break;
        case mnclMin: acc = std::fmin(acc, v); break;
        default: acc += v; break;  // sum, avg, premulsum
      }
    }
    return fromDouble<T>(op == mnclAvg ? acc / nranks : acc);
  }
}

template <typename T>
bool same(T got, T want) {
  if constexpr (std::is_integral_v<T>) {
    return got == want;
  } else {
    double g = toDouble(got), w = toDouble(want);
    if (std::isinf(w)) return g == w;
    return std::fabs(g - w) <= tolerance<T>() * std::fmax(1.0, std::fabs(w));
  }
}

}  // namespace

void fillInput(const Options& opt, const Shape& shape, int rank, void* hostSend) {
  withType(opt.dtype, [&]<typename T>() {
    T* out = static_cast<T*>(hostSend);
    for (size_t i = 0; i < shape.sendCount; ++i) out[i] = fromDouble<T>(pattern(rank, i));
  });
}

size_t countWrong(const Options& opt, const Shape& shape, int rank, int nranks, const void* hostRecv) {
  if ((opt.coll == Coll::Reduce || opt.coll == Coll::Gather) && rank != opt.root) return 0;
  return withType(opt.dtype, [&]<typename T>() -> size_t {
    const T* got = static_cast<const T*>(hostRecv);
    size_t s = shape.paramCount, wrong = 0;
    for (size_t k = 0; k < shape.recvCount; ++k) {
      T want{};
      switch (opt.coll) {
        case Coll::AllReduce:
        case Coll::Reduce: want = reference<T>(opt.op, nranks, k); break;
        case Coll::ReduceScatter: want = reference<T>(opt.op, nranks, static_cast<size_t>(rank) * s + k); break;
        case Coll::Broadcast: want = fromDouble<T>(pattern(opt.root, k)); break;
        case Coll::AllGather:
        case Coll::Gather: want = fromDouble<T>(pattern(static_cast<int>(k / s), k % s)); break;
        case Coll::Scatter: want = fromDouble<T>(pattern(opt.root, static_cast<size_t>(rank) * s + k)); break;
        case Coll::AlltoAll:
          want = fromDouble<T>(pattern(static_cast<int>(k / s), static_cast<size_t>(rank) * s + k % s));
          break;
        case Coll::SendRecv: want = fromDouble<T>(pattern((rank + nranks - 1) % nranks, k)); break;
      }
      if (!same(got[k], want)) ++wrong;
    }
    return wrong;
  });
}

}  // namespace perf
