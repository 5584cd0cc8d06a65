// Connection memory in /dev/shm, claimed as calls first reach it.
//
// tmpfs gives a page when it is first touched, and a page it cannot give kills the process
// that touched it (SIGBUS): a container's /dev/shm (64 MiB by default) can hold fewer
// connection buffers than a host's ranks map. Claiming them all at init would refuse jobs
// whose calls never reach most of them (a ring uses 2 of a rank's peers on each channel;
// small steps use the start of each slot only), so before a channel runs a call it claims
// (MADV_POPULATE_WRITE) what the call's steps may reach of each FIFO slot of the connections
// its algorithm and protocol use, past what earlier calls claimed: a /dev/shm that cannot
// give it fails the call, naming the room it needed, instead of killing the rank. Both ends
// claim (the same pages): whichever comes first, no FIFO page is touched before its claim.
// The control words, which every call reads for all peers, are claimed at init.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "../../cuda/p2p.h"
#include "../../cuda/tree.h"
#include "comm.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // (Linux 5.14; older C library headers lack it)
#endif

namespace mncl {

namespace {

constexpr size_t kPage = 4096;

// The pages of [p, p + bytes) made present, or false. (Kernels before 5.14 have no
// MADV_POPULATE_WRITE: there pages come as they are touched, as before.)
bool populate(char* p, size_t bytes) {
  char* from = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(p) / kPage * kPage);
  return madvise(from, p + bytes - from, MADV_POPULATE_WRITE) == 0 || errno == EINVAL;
}

// Where the pages of a connection block start: its control words (RegionLayout::connAt).
char* blockOf(const dev::ConnFifo& f) { return reinterpret_cast<char*>(f.ctrl); }

// What steps of a channel's share of `bytes` may reach of a slot of `proto`'s FIFO: the
// data where it lies (a Simple step from the slot's start; LL lines carry 8 bytes in 16,
// LL128 lines 120 in 128, after a step's header lines), in whole pages.
size_t reachOf(Proto proto, size_t bytes) {
  size_t reach = proto == Proto::simple ? bytes : proto == Proto::ll ? 2 * bytes + kPage : bytes + bytes / 15 + kPage;
  return (reach + kPage - 1) / kPage * kPage;
}

const char* const kProtoNames[] = {"Simple", "LL", "LL128"};

}  // namespace

void Comm::claimControlWords(const RegionLayout& layout, ShmMapping& region) {
  bool claimed = populate(region.base(), sizeof(RankCtrl));
  for (int c = 0; c < layout.nChannels() && claimed; ++c) {
    for (int p = 0; p < nranks_ && claimed; ++p) {
      if (p != rank_) claimed = populate(blockOf(layout.conn(region.base(), p, c)), layout.connCtrlBytes());
    }
  }
  MNCL_CHECK(claimed, mnclSystemError, ShmMapping::noRoomFor(layout.connCtrlBytes(), "the connections' control words"));
}

void Comm::markShmConnections(const RegionLayout& layout) {
  const dev::ProtoSizes& s = layout.sizes();
  size_t slots[] = {s.simpleSlotBytes, s.llSlotLines * sizeof(dev::LLLine), s.ll128SlotLines * sizeof(dev::LL128Line)};
  for (int p = 0; p < (int)Proto::count; ++p) {
    claimOffsets_[p] = layout.fifoOffset((Proto)p);
    slotBytes_[p] = slots[p];
  }
  bool mineInShm = !onGpu() && dynamic_cast<ShmMapping*>(peerFifos_[rank_].get()) != nullptr;
  for (auto& ch : channels_) {
    ch->claimed.assign(nranks_, {});
    for (int p = 0; p < nranks_; ++p) {
      bool theirsInShm = !onGpu() && p != rank_ && !netPeer_[p] && dynamic_cast<ShmMapping*>(peerFifos_[p].get());
      for (int proto = 0; proto < (int)Proto::count; ++proto) {
        // (Connections outside /dev/shm count as claimed whole.)
        ch->claimed[p][claimIndex(kSendSide, (Proto)proto)] = theirsInShm ? 0 : (uint32_t)slots[proto];
        ch->claimed[p][claimIndex(kRecvSide, (Proto)proto)] = mineInShm && p != rank_ ? 0 : (uint32_t)slots[proto];
      }
      ch->allClaimed = ch->allClaimed && !theirsInShm && !(mineInShm && p != rank_);
    }
  }
}

int Comm::claimIndex(uint8_t side, Proto proto) { return (side == kSendSide ? 0 : (int)Proto::count) + (int)proto; }

bool Comm::claimConnection(Channel& ch, int peer, uint8_t sides, Proto proto, size_t bytes) {
  size_t slot = slotBytes_[(int)proto], want = std::min(slot, reachOf(proto, bytes));
  for (uint8_t side : {kSendSide, kRecvSide}) {
    uint32_t& have = ch.claimed[peer][claimIndex(side, proto)];
    if (!(sides & side) || have >= want) continue;
    char* fifo = blockOf(side == kSendSide ? ch.sendTo[peer] : ch.recvFrom[peer]) + claimOffsets_[(int)proto];
    for (int s = 0; s < dev::kSteps; ++s) {
      if (populate(fifo + s * slot + have, want - have)) continue;
      char what[160];
      std::snprintf(what, sizeof what, "rank %d's %s FIFO %s rank %d", rank_, kProtoNames[(int)proto],
                    side == kSendSide ? "to" : "from", peer);
      fail(mnclSystemError, ShmMapping::noRoomFor(dev::kSteps * (want - have), what));
      return false;
    }
    have = (uint32_t)want;
  }
  return true;
}

// The peers each work item's algorithm exchanges steps with (ring.h, tree.h, direct.h), in
// its protocol; sends and receives go by Simple (p2p.h).
bool Comm::claimConnectionsFor(int c, const std::vector<dev::DevWork>& colls, const std::vector<dev::P2pOp>& p2p) {
  Channel& ch = *channels_[c];
  if (ch.allClaimed) return true;
  const dev::DevChannel& d = ch.dev;
  constexpr uint8_t kBoth = kSendSide | kRecvSide;
  for (const dev::DevWork& w : colls) {
    size_t bytes = w.chanCount * dataTypeSize(w.dtype);
    auto claim = [&](int peer, uint8_t sides) { return claimConnection(ch, peer, sides, w.proto, bytes); };
    bool ok = true;
    switch (w.algo) {
      case Algo::ring: {
        auto at = [&](int pos) { return ch.ring[(pos + nranks_) % nranks_]; };
        ok = claim(at(d.ringPos - 1), kRecvSide) && claim(at(d.ringPos + 1), kSendSide);
        break;
      }
      case Algo::tree: {
        dev::TreeNode t = dev::channelTreeNode(d, rank_, w.coll == Coll::allreduce ? 0 : w.root, w.treeIndex);
        if (t.parent >= 0) ok = claim(t.parent, kBoth);
        for (int i = 0; i < t.children.n && ok; ++i) ok = claim(t.children.peer[i], kBoth);
        break;
      }
      default:  // direct: every peer
        for (int p = 0; p < nranks_ && ok; ++p) {
          if (p != rank_) ok = claim(p, kBoth);
        }
    }
    if (!ok) return false;
  }
  for (const dev::P2pOp& op : p2p) {
    if (!claimConnection(ch, op.peer, op.isSend ? kSendSide : kRecvSide, Proto::simple, op.bytes)) return false;
  }
  return true;
}

}  // namespace mncl
