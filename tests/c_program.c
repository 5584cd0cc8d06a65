/* A C program on the installed C API (minincl.h, libminincl.so), built by test_c_program.py
 * with the flags `minincl config --cflags --libs` prints. The parent makes a unique id and
 * forks one process per rank; each rank runs a few collectives and a ring of send/receive on
 * the CPU and writes what it received to DIR/rank<r>_<name>.bin for the test to check
 * against NumPy. It also reports what a wrong call returns.
 *
 *   c_program NRANKS COUNT DIR
 */
#include <minincl.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    mnclResult_t r_ = (call);                                                               \
    if (r_ != mnclSuccess) {                                                                \
      fprintf(stderr, "%s: %s: %s\n", #call, mnclGetErrorString(r_), mnclGetLastError(NULL)); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static void save(const char* dir, int rank, const char* name, const void* data, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rank%d_%s.bin", dir, rank, name);
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

/* Rank r's input element i: small integers, so float sums are exact. */
static float input(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 97)); }

static int runRank(int nranks, int rank, size_t count, mnclUniqueId id, const char* dir) {
  mnclComm_t comm;
  CHECK(mnclCommInitRank(&comm, nranks, id, rank));
  int n = 0, me = -1, device = 0;
  CHECK(mnclCommCount(comm, &n));
  CHECK(mnclCommUserRank(comm, &me));
  CHECK(mnclCommDevice(comm, &device));
  if (n != nranks || me != rank || device != MNCL_DEVICE_CPU) {
    fprintf(stderr, "rank %d: count %d, user rank %d, device %d\n", rank, n, me, device);
    return 1;
  }

  float* send = (float*)malloc(count * sizeof(float) * nranks + 1);
  float* recv = (float*)malloc(count * sizeof(float) * nranks + 1);
  for (size_t i = 0; i < count * nranks; ++i) send[i] = input(rank, i);

  CHECK(mnclAllReduce(send, recv, count, mnclFloat32, mnclSum, comm, NULL));
  save(dir, rank, "allreduce", recv, count * sizeof(float));

  CHECK(mnclAllGather(send, recv, count, mnclFloat32, comm, NULL));
  save(dir, rank, "allgather", recv, count * nranks * sizeof(float));

  CHECK(mnclReduceScatter(send, recv, count, mnclFloat32, mnclMax, comm, NULL));
  save(dir, rank, "reduce_scatter", recv, count * sizeof(float));

  memcpy(recv, send, count * sizeof(float));
  CHECK(mnclBcast(recv, count, mnclFloat32, nranks - 1, comm, NULL));
  save(dir, rank, "broadcast", recv, count * sizeof(float));

  /* A ring: send to the next rank, receive from the previous one, together in a group. */
  CHECK(mnclGroupStart());
  CHECK(mnclSend(send, count, mnclFloat32, (rank + 1) % nranks, comm, NULL));
  CHECK(mnclRecv(recv, count, mnclFloat32, (rank + nranks - 1) % nranks, comm, NULL));
  CHECK(mnclGroupEnd());
  save(dir, rank, "sendrecv", recv, count * sizeof(float));

  /* A wrong call is refused with a sentence, and the communicator still works after it. */
  mnclResult_t wrong = mnclAllReduce(send, recv, count, (mnclDataType_t)99, mnclSum, comm, NULL);
  if (rank == 0) printf("wrong type: %s: %s\n", mnclGetErrorString(wrong), mnclGetLastError(comm));
  CHECK(mnclAllReduce(send, recv, count, mnclFloat32, mnclMin, comm, NULL));
  save(dir, rank, "allreduce_min", recv, count * sizeof(float));

  CHECK(mnclCommDestroy(comm));
  free(send);
  free(recv);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s NRANKS COUNT DIR\n", argv[0]);
    return 2;
  }
  int nranks = atoi(argv[1]);
  size_t count = (size_t)strtoull(argv[2], NULL, 10);
  int version = 0;
  CHECK(mnclGetVersion(&version));
  printf("version %d, header %d\n", version, MNCL_VERSION_CODE);
  fflush(stdout);

  mnclUniqueId id;
  CHECK(mnclGetUniqueId(&id));
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) exit(runRank(nranks, r, count, id, argv[3]));
    if (pid < 0) {
      perror("fork");
      return 1;
    }
  }
  int failed = 0, status = 0;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  return failed;
}
