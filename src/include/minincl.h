/* minincl — the public C API.
 *
 * NCCL's shape with the `mncl` prefix. A communicator lives on one device: a CUDA GPU or the
 * CPU. CPU communicators take a null stream and return when the result is ready; CUDA
 * communicators enqueue on the given stream and return at once.
 *
 * Reductions: sum, prod, max, min, avg on every type. `avg` on integer types is the sum divided
 * by the rank count, truncating toward zero as C's `/` does, after the sum has wrapped around
 * in the type's own width (signed sums wrap as two's complement); on float types, as in NCCL,
 * the sum of each rank's input times 1/nranks rounded to the type. And
 * pre-multiplied sums (mnclRedOpCreatePreMulSum): each rank's input times that rank's scalar,
 * rounded to the type, then summed. And bitwise and / or / xor (mnclBand, mnclBor, mnclBxor)
 * on the integer types.
 */
#ifndef MININCL_H_
#define MININCL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MNCL_MAJOR 0
#define MNCL_MINOR 1
#define MNCL_PATCH 0
#define MNCL_VERSION_CODE (MNCL_MAJOR * 10000 + MNCL_MINOR * 100 + MNCL_PATCH)

#define MNCL_UNIQUE_ID_BYTES 128

typedef struct mnclComm* mnclComm_t;
typedef struct {
  char internal[MNCL_UNIQUE_ID_BYTES];
} mnclUniqueId;

typedef enum {
  mnclSuccess = 0,
  mnclUnhandledCudaError = 1,
  mnclSystemError = 2,
  mnclInternalError = 3,
  mnclInvalidArgument = 4,
  mnclInvalidUsage = 5,
  mnclRemoteError = 6,
  mnclInProgress = 7,
  mnclTimeout = 8,
  mnclAborted = 9,
  mnclNumResults = 10
} mnclResult_t;

/* Same numbering as NCCL so code ports by renaming. */
typedef enum {
  mnclInt8 = 0,
  mnclUint8 = 1,
  mnclInt32 = 2,
  mnclUint32 = 3,
  mnclInt64 = 4,
  mnclUint64 = 5,
  mnclFloat16 = 6,
  mnclFloat32 = 7,
  mnclFloat64 = 8,
  mnclBfloat16 = 9,
  /* The 8-bit floats: each reduction step in float, rounded to nearest even and saturated to
   * the largest finite value (as NCCL's); a NaN stays a NaN. */
  mnclFloat8e4m3 = 10, /* OCP FP8 E4M3 (PyTorch's float8_e4m3fn): max 448, no infinity */
  mnclFloat8e5m2 = 11, /* OCP FP8 E5M2: max 57344 (a sum past it gives 57344, not infinity) */
  mnclNumTypes = 12
} mnclDataType_t;

typedef enum {
  mnclSum = 0,
  mnclProd = 1,
  mnclMax = 2,
  mnclMin = 3,
  mnclAvg = 4,
  mnclNumOps = 5,
  /* Ops from mnclRedOpCreatePreMulSum take values from mnclNumOps up, below mnclBand. Bitwise
   * and, or, exclusive or of integer types (minincl's own; NCCL has none) sit at the top of the
   * range, clear of NCCL's numbering and of pre-multiplied sums. */
  mnclBand = 0x7ffffff0,
  mnclBor = 0x7ffffff1,
  mnclBxor = 0x7ffffff2,
  mnclMaxRedOp = 0x7fffffff
} mnclRedOp_t;

/* Where mnclRedOpCreatePreMulSum's scalar lives (NCCL's numbering). */
typedef enum {
  /* `scalar` points to memory the operation reads each time it runs: device memory (or
   * host-mapped) for a CUDA communicator, host memory for a CPU one. It must stay valid until
   * the op is destroyed; changing the value changes later operations. */
  mnclScalarDevice = 0,
  /* The value at `scalar` is read once, when the op is created. */
  mnclScalarHostImmediate = 1
} mnclScalarResidence_t;

/* Device value for CPU communicators in mnclCommInitRankDevice / mnclCommDevice. */
#define MNCL_DEVICE_CPU (-1)
/* Device value meaning "the current CUDA device if a GPU is usable, else the CPU". */
#define MNCL_DEVICE_AUTO (-2)

mnclResult_t mnclGetVersion(int* version);
mnclResult_t mnclGetUniqueId(mnclUniqueId* uniqueId);
/* A unique id that names a root listening at host:port; every rank computes the same id and
 * the rank that is 0 starts the listener in mnclCommInitRank (used by init-from-environment). */
mnclResult_t mnclGetUniqueIdForAddress(mnclUniqueId* uniqueId, const char* host, int port);

mnclResult_t mnclCommInitRank(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank);
mnclResult_t mnclCommInitRankDevice(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank,
                                    int device);

/* Init inside mnclGroupStart / mnclGroupEnd (mnclCommInitRank, ...InitRankDevice,
 * ...InitRankConfig): each returns a handle at once and the inits run together, so one thread
 * may make several ranks of one communicator (one per GPU); mnclGroupEnd returns when all are
 * made, or the first one's error (destroy the handles then).
 *
 * What a new communicator may be asked for beyond the environment (ncclConfig_t's shape; only
 * these fields). Start from MNCL_CONFIG_INITIALIZER and set what you need:
 *  - blocking: 1 (the default): init returns when the communicator is made. 0 (nonblocking
 *    init): mnclCommInitRankConfig returns mnclInProgress at once and init runs on a thread of
 *    minincl's; mnclCommGetAsyncError gives mnclInProgress until it is made (then mnclSuccess,
 *    or init's error, which mnclGetLastError(comm) explains); other calls on it until then
 *    return mnclInProgress and do not run (inside a group, also a communicator whose init
 *    the same group started: the call fails the group, and mnclGroupEnd returns
 *    mnclInvalidUsage, having run none of it); destroy or abort stops an init still waiting for its peers
 *    (within 100 ms). Calls on a made communicator block as usual. (MININCL_CPU_BIND
 *    binds the thread that runs init: there, minincl's.)
 *  - minCTAs / maxCTAs: bounds on the communicator's channels (blocks per GPU operation, threads
 *    per CPU operation); MININCL_NCHANNELS, or the default, is clamped into them. Every rank
 *    takes the smallest count of all.
 *  - windowBytes (minincl's own): the size of this rank's window, the shared memory that
 *    mnclCommMemAlloc hands out (MININCL_WINDOW_BYTES where undefined; 0: none). Read only
 *    where the config's size covers it, so a caller built against an older header is unchanged. */
#define MNCL_CONFIG_UNDEF_INT INT32_MIN
typedef struct {
  size_t size;          /* sizeof(mnclConfig_t), set by the initializer */
  unsigned int magic;   /* set by the initializer */
  unsigned int version; /* MNCL_VERSION_CODE, set by the initializer */
  int blocking;
  int minCTAs;
  int maxCTAs;
  long long windowBytes;
} mnclConfig_t;
#define MNCL_CONFIG_MAGIC 0x6d6e636cu /* "mncl" */
#define MNCL_CONFIG_INITIALIZER                                                            \
  {sizeof(mnclConfig_t), MNCL_CONFIG_MAGIC, MNCL_VERSION_CODE, MNCL_CONFIG_UNDEF_INT,   \
   MNCL_CONFIG_UNDEF_INT, MNCL_CONFIG_UNDEF_INT, MNCL_CONFIG_UNDEF_INT}
/* mnclCommInitRank with a config (NULL: the defaults). */
mnclResult_t mnclCommInitRankConfig(mnclComm_t* comm, int nranks, mnclUniqueId commId, int rank,
                                    mnclConfig_t* config);
/* All ranks in this process. devlist NULL puts every rank on the CPU; otherwise devlist[i] is
 * a CUDA device or MNCL_DEVICE_CPU. */
mnclResult_t mnclCommInitAll(mnclComm_t* comms, int ndev, const int* devlist);
/* The ranks of comm that pass the same color form a new communicator, ranked by (key, old
 * rank). Collective over comm. color MNCL_SPLIT_NOCOLOR (or any negative color): this rank joins
 * none and gets NULL.
 * config (an mnclConfig_t*) NULL: the new communicator takes comm's config; otherwise that
 * config (its undefined fields: the defaults; blocking = 0 is refused: a split always blocks).
 * It is on comm's device. mnclCommAbort(comm) from another thread stops a split still waiting
 * for its peers (it returns mnclAborted). Not inside mnclGroupStart / mnclGroupEnd
 * (mnclInvalidUsage: it blocks until its peers split, so one thread cannot split several ranks;
 * give each its own thread). The same holds for mnclCommShrink. */
#define MNCL_SPLIT_NOCOLOR (-1)
mnclResult_t mnclCommSplit(mnclComm_t comm, int color, int key, mnclComm_t* newcomm, void* config);
/* Every rank of comm but the excludeRanksCount in excludeRanksList forms a new communicator,
 * in rank order (as NCCL 2.27's ncclCommShrink). Every rank kept calls it with the same
 * ranks; the excluded ones do not, and need not be alive: it works on a communicator that
 * failed because a peer died. shrinkFlags MNCL_SHRINK_ABORT first stops comm's calls still
 * running on other threads (as mnclCommAbort, without freeing comm: destroy it afterwards;
 * like any failure of a rank, the abort fails comm on its peers too, the excluded ones
 * included). Ranks kept that pass different lists, or keep a rank that is gone (see
 * mnclCommLostRanks), fail with mnclInvalidUsage and may try again. config as mnclCommSplit's. */
#define MNCL_SHRINK_DEFAULT 0x00
#define MNCL_SHRINK_ABORT 0x01
mnclResult_t mnclCommShrink(mnclComm_t comm, int* excludeRanksList, int excludeRanksCount, mnclComm_t* newcomm,
                            void* config, int shrinkFlags);
/* The ranks this rank has seen go (minincl's own, not NCCL's): they destroyed or
 * aborted their communicator, their process exited (on this host), their network connection broke, or
 * their heartbeat stopped for MININCL_TIMEOUT (a stopped or hung process, given up on for good; a rank
 * alive but stuck in its own code is not among them). *count gets how many; ranks (NULL, or room for
 * mnclCommCount's ranks) gets them in order. Works on a communicator that failed, so that
 * survivors can pass the list to mnclCommShrink. */
mnclResult_t mnclCommLostRanks(const mnclComm_t comm, int* ranks, int* count);
/* Destroy waits for calls running on comm in other threads to end (stopping one still
 * waiting for its peers after MININCL_TIMEOUT); abort first stops them (they return
 * mnclAborted), so a watchdog thread may abort a communicator whose calls hang.
 * Both wait until no thread's open group holds calls on comm (a group of this thread drops
 * them). comm must not be used afterwards. */
mnclResult_t mnclCommDestroy(mnclComm_t comm);
mnclResult_t mnclCommAbort(mnclComm_t comm);
/* Waits until every operation on comm has finished (calls other threads are inside; on a GPU
 * also its last kernel) and returns the communicator's error, if it failed meanwhile. Afterwards comm takes no more operations (mnclInvalidUsage); the queries
 * and mnclCommDestroy still work. Called inside this thread's open group that holds calls on
 * comm: mnclInvalidUsage (end the group first). Calls that another thread's open group has
 * recorded on comm are not waited for: as in NCCL, end every group on comm before finalizing. */
mnclResult_t mnclCommFinalize(mnclComm_t comm);
mnclResult_t mnclCommGetAsyncError(mnclComm_t comm, mnclResult_t* asyncError);
mnclResult_t mnclCommCount(const mnclComm_t comm, int* count);
mnclResult_t mnclCommUserRank(const mnclComm_t comm, int* rank);
mnclResult_t mnclCommDevice(const mnclComm_t comm, int* device);
/* NCCL's name for mnclCommDevice (MNCL_DEVICE_CPU for a CPU communicator). */
mnclResult_t mnclCommCuDevice(const mnclComm_t comm, int* device);
/* Seconds one call may wait inside this CPU communicator (for peers that never make it)
 * before it fails with mnclTimeout, mnclGetLastError naming where every rank is. 0: no limit
 * (the default, unless MININCL_CALL_TIMEOUT is set). On a GPU communicator, whose calls return
 * once queued: seconds a queued kernel may go unfinished before the communicator fails with
 * mnclTimeout (mnclCommGetAsyncError; kernels in CUDA graphs are not watched). */
mnclResult_t mnclCommSetCallTimeout(mnclComm_t comm, double seconds);
mnclResult_t mnclCommGetCallTimeout(const mnclComm_t comm, double* seconds);

/* Memory for a CPU communicator's buffers that its peers read and write directly (NCCL's
 * ncclMemAlloc with a registered buffer): page-aligned, zeroed space in comm's window, the
 * shared memory every peer process of this host mapped at init (config.windowBytes, or
 * MININCL_WINDOW_BYTES). Collectives on it move a step with one copy or none, from steps of
 * 1 KiB, where other memory between processes goes through the FIFO's two copies or, from
 * 32 KiB, a system call per step. Where no peer is another process reached through shared
 * memory (threads of this process read each other's buffers already), plain memory, and no
 * window is needed. mnclInvalidUsage: a GPU communicator, no window where one is needed, or a
 * full window; mnclSystemError: /dev/shm has no room for the pages. The memory stays valid until mnclMemFree, even after comm is destroyed; any
 * communicator may use it (as plain memory where it is not in that one's window). */
mnclResult_t mnclCommMemAlloc(mnclComm_t comm, void** ptr, size_t size);
/* Frees memory from mnclCommMemAlloc (NULL: nothing); mnclInvalidArgument for any other pointer. */
mnclResult_t mnclMemFree(void* ptr);

const char* mnclGetErrorString(mnclResult_t result);
/* A sentence about an error, saying what to do: with a comm whose init failed or that has
 * failed (mnclCommGetAsyncError), its error, valid while the comm lives; otherwise (and with
 * NULL) the last error of a call on this thread, whatever comm it named, valid until this
 * thread's next failing call (as NCCL's). */
const char* mnclGetLastError(mnclComm_t comm);

mnclResult_t mnclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           mnclDataType_t datatype, mnclRedOp_t op, mnclComm_t comm,
                           void* stream);
mnclResult_t mnclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           mnclDataType_t datatype, int root, mnclComm_t comm, void* stream);
/* In-place broadcast (NCCL's legacy ncclBcast): mnclBroadcast(buff, buff, ...). */
mnclResult_t mnclBcast(void* buff, size_t count, mnclDataType_t datatype, int root, mnclComm_t comm,
                       void* stream);
mnclResult_t mnclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        mnclDataType_t datatype, mnclRedOp_t op, int root, mnclComm_t comm,
                        void* stream);
/* recvbuff holds nranks * sendcount elements, rank-major. */
mnclResult_t mnclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           mnclDataType_t datatype, mnclComm_t comm, void* stream);
/* sendbuff holds nranks * recvcount elements. */
mnclResult_t mnclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               mnclDataType_t datatype, mnclRedOp_t op, mnclComm_t comm,
                               void* stream);
/* count elements to every rank: sendbuff and recvbuff hold nranks * count elements. */
mnclResult_t mnclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          mnclDataType_t datatype, mnclComm_t comm, void* stream);
/* count elements from every rank into root's recvbuff (nranks * count elements, rank-major;
 * used at the root only). In place when sendbuff == recvbuff + root * count. */
mnclResult_t mnclGather(const void* sendbuff, void* recvbuff, size_t count,
                        mnclDataType_t datatype, int root, mnclComm_t comm, void* stream);
/* Block r of root's sendbuff (nranks * count elements; used at the root only) into rank r's
 * recvbuff (count elements). In place when recvbuff == sendbuff + root * count. */
mnclResult_t mnclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         mnclDataType_t datatype, int root, mnclComm_t comm, void* stream);
mnclResult_t mnclSend(const void* sendbuff, size_t count, mnclDataType_t datatype, int peer,
                      mnclComm_t comm, void* stream);
mnclResult_t mnclRecv(void* recvbuff, size_t count, mnclDataType_t datatype, int peer,
                      mnclComm_t comm, void* stream);

/* A reduction op for comm: the sum over ranks of scalar_r * input_r, where scalar_r is one
 * element of `datatype` given by rank r (ranks may give different scalars). Each product is
 * rounded to the type (integers wrap); the sum is then as mnclSum's. Use *op only with comm
 * and `datatype`; destroy it with mnclRedOpDestroy. */
mnclResult_t mnclRedOpCreatePreMulSum(mnclRedOp_t* op, void* scalar, mnclDataType_t datatype,
                                      mnclScalarResidence_t residence, mnclComm_t comm);
mnclResult_t mnclRedOpDestroy(mnclRedOp_t op, mnclComm_t comm);

/* Calls between mnclGroupStart and mnclGroupEnd run at mnclGroupEnd. A call refused for its
 * arguments fails the whole group (mnclGroupEnd runs none of its calls and returns that
 * error). A call on a CPU communicator that failed returns mnclSuccess: mnclGroupEnd runs the
 * group's calls on its other communicators, as the peers run theirs, then returns the
 * failed one's error. */
mnclResult_t mnclGroupStart(void);
mnclResult_t mnclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif /* MININCL_H_ */
