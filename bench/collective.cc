#include "collective.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtype.h"

namespace perf {

Shape shapeFor(Coll coll, size_t bytes, size_t typeSize, int nranks) {
  size_t n = static_cast<size_t>(nranks);
  size_t count = bytes / typeSize;
  switch (coll) {
    case Coll::AllGather:
      count -= count % n;
      return {count * typeSize, count / n, count / n, count};
    case Coll::ReduceScatter:
      count -= count % n;
      return {count * typeSize, count / n, count, count / n};
    case Coll::AlltoAll:
      count -= count % n;
      return {count * typeSize, count / n, count, count};
    case Coll::Gather:
      count -= count % n;
      return {count * typeSize, count / n, count / n, count};
    case Coll::Scatter:
      count -= count % n;
      return {count * typeSize, count / n, count, count / n};
    default:
      return {count * typeSize, count, count, count};
  }
}

double busFactor(Coll coll, int nranks) {
  double n = nranks;
  switch (coll) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::AlltoAll:
    case Coll::Gather:
    case Coll::Scatter: return (n - 1) / n;
    default: return 1.0;
  }
}

bool hasRoot(Coll coll) {
  return coll == Coll::Broadcast || coll == Coll::Reduce || coll == Coll::Gather || coll == Coll::Scatter;
}

bool reduces(Coll coll) {
  return coll == Coll::AllReduce || coll == Coll::Reduce || coll == Coll::ReduceScatter;
}

namespace {

// One element of `type` holding `value`, for mnclRedOpCreatePreMulSum.
uint64_t scalarOfType(mnclDataType_t type, int value) {
  uint64_t out = 0;
  withType(type, [&]<typename T>() {
    T v = fromDouble<T>(value);
    std::memcpy(&out, &v, sizeof v);
  });
  return out;
}

mnclResult_t reducing(const Options& opt, const Shape& shape, const void* send, void* recv, mnclComm_t comm,
                      void* stream, mnclRedOp_t op) {
  size_t c = shape.paramCount;
  switch (opt.coll) {
    case Coll::AllReduce: return mnclAllReduce(send, recv, c, opt.dtype, op, comm, stream);
    case Coll::Reduce: return mnclReduce(send, recv, c, opt.dtype, op, opt.root, comm, stream);
    default: return mnclReduceScatter(send, recv, c, opt.dtype, op, comm, stream);
  }
}

}  // namespace

mnclResult_t runCollective(const Options& opt, const Shape& shape, const void* send, void* recv,
                           mnclComm_t comm, void* stream, int rank, int nranks) {
  size_t c = shape.paramCount;
  if (reduces(opt.coll) && opt.op == kPreMulSum) {
    uint64_t scalar = scalarOfType(opt.dtype, premulScalar(rank));
    mnclRedOp_t op;
    mnclResult_t rc = mnclRedOpCreatePreMulSum(&op, &scalar, opt.dtype, mnclScalarHostImmediate, comm);
    if (rc != mnclSuccess) return rc;
    rc = reducing(opt, shape, send, recv, comm, stream, op);
    mnclResult_t destroyed = mnclRedOpDestroy(op, comm);
    return rc != mnclSuccess ? rc : destroyed;
  }
  switch (opt.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
    case Coll::ReduceScatter: return reducing(opt, shape, send, recv, comm, stream, opt.op);
    case Coll::Broadcast: return mnclBroadcast(send, recv, c, opt.dtype, opt.root, comm, stream);
    case Coll::AllGather: return mnclAllGather(send, recv, c, opt.dtype, comm, stream);
    case Coll::AlltoAll: return mnclAlltoAll(send, recv, c, opt.dtype, comm, stream);
    case Coll::Gather: return mnclGather(send, recv, c, opt.dtype, opt.root, comm, stream);
    case Coll::Scatter: return mnclScatter(send, recv, c, opt.dtype, opt.root, comm, stream);
    case Coll::SendRecv: {
      mnclResult_t rc = mnclGroupStart();
      if (rc != mnclSuccess) return rc;
      mnclResult_t a = mnclSend(send, c, opt.dtype, (rank + 1) % nranks, comm, stream);
      mnclResult_t b = mnclRecv(recv, c, opt.dtype, (rank + nranks - 1) % nranks, comm, stream);
      rc = mnclGroupEnd();
      return a != mnclSuccess ? a : b != mnclSuccess ? b : rc;
    }
  }
  return mnclInvalidArgument;
}

}  // namespace perf
