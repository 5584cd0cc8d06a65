// What ranks and the root say to each other during bootstrap.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace mncl {

struct RootHello {
  uint64_t magic, nonce;
  int32_t nranks, rank;
  sockaddr_storage listen;  // where this rank accepts peer connections
  // Not 0: this rank could not make its communicator (a bad device, say) and does not join;
  // the root tells every other rank at once, rather than letting them wait for it.
  int32_t failCode;
  char failMessage[196];
};

struct RootReply {
  uint64_t nonce;  // the id's: tells a minincl root from another program on its port
  int32_t status;  // mnclSuccess: the next rank's listen address (a sockaddr_storage) follows; else the failure's mnclResult_t
  char message[252];
};
// RootReply::status of an earlier try's root of an id from an address (the same nonce): its
// try is over, and the rank connects again, to this try's root.
constexpr int32_t kRootTryAgain = -1;

}  // namespace mncl
