// What ranks and the root say to each other during bootstrap.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace mncl {

struct RootHello {
  uint64_t magic, nonce;
  int32_t nranks, rank;
  sockaddr_storage listen;  // where this rank accepts peer connections
};

struct RootReply {
  int32_t status;  // 0: ok, a table of nranks addresses follows
  char message[252];
};

}  // namespace mncl
