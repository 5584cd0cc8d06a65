// What a channel's error record says, as the communicator's error code and message.
#pragma once

#include <string>
#include <utility>

#include "../../cuda/channel.h"
#include "minincl.h"

namespace mncl {

class Comm;

// A channel's error record (a mismatched peer, a failed kernel copy to or from a peer's
// memory, or a peer that failed mid-operation) as the communicator's error code and message.
std::pair<mnclResult_t, std::string> deviceErrorMessage(Comm& comm, const dev::DevError& e);

}  // namespace mncl
