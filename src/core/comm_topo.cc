// How a communicator orders its rings: rank 0 places the ranks on the topology (detected,
// or MININCL_TOPO_FILE), runs the search and sends the plan to the others, so every rank
// runs the same rings whatever it sees of the machine. See src/topo/comm_plan.h.
#include <algorithm>

#include "comm.h"
#include "env.h"
#include "error.h"
#include "log.h"
#include "../../cuda/tree.h"

namespace mncl {
namespace {

constexpr int kPlanSizeTag = 500, kPlanTag = 501;

// hosts: the host hashes seen so far, numbered in order of first rank.
topo::RankPlace placeOf(const PeerInfo& p, std::vector<uint64_t>& hosts) {
  topo::RankPlace place;
  auto host = std::find(hosts.begin(), hosts.end(), p.hostHash);
  place.host = static_cast<int>(host - hosts.begin());
  if (host == hosts.end()) hosts.push_back(p.hostHash);
  place.device = p.device;
  place.cpu = p.cpu;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &p.affinity)) place.affinity.push_back(c);
  return place;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

bool isPermutation(std::vector<int> ring, int n) {
  std::sort(ring.begin(), ring.end());
  for (int i = 0; i < (int)ring.size(); ++i)
    if (ring[i] != i) return false;
  return (int)ring.size() == n;
}

}  // namespace

void Comm::agreeOnPlan() {
  if (nranks_ == 1) {
    topoPlan_ = topo::rankOrderPlan(1, "one rank");
    return;
  }
  std::string text;
  if (rank_ == 0) {
    topo::PlanInput in;
    std::vector<uint64_t> hosts;
    for (const PeerInfo& p : peers_) in.ranks.push_back(placeOf(p, hosts));
    in.topoFile = env::str("MININCL_TOPO_FILE");
    in.rankMap = env::str("MININCL_TOPO_RANK_MAP");
    in.dumpFile = env::str("MININCL_TOPO_DUMP_FILE");
    text = topo::encodePlan(topo::planComm(in));
    uint64_t size = text.size();
    for (int r = 1; r < nranks_; ++r) {
      bootstrap_->send(r, kPlanSizeTag, &size, sizeof(size));
      bootstrap_->send(r, kPlanTag, text.data(), size);
    }
  } else {
    uint64_t size = 0;
    bootstrap_->recv(0, kPlanSizeTag, &size, sizeof(size));
    text.resize(size);
    bootstrap_->recv(0, kPlanTag, text.data(), size);
  }
  topoPlan_ = topo::decodePlan(text);  // rank 0 too: every rank holds the same bytes
  bool valid = !topoPlan_.rings.empty();
  for (const auto& ring : topoPlan_.rings) valid = valid && isPermutation(ring, nranks_);
  MNCL_CHECK(valid, mnclInternalError, "the ring order rank 0 sent is not a permutation of the ranks");
}

// By default a core's share per rank, 1..4 (a CPU channel is a thread); when the ranks sit on
// GPUs, the search's channel count caps that. MININCL_NCHANNELS overrides both. Every rank
// then runs the smallest count any rank wants.
int Comm::channelsWanted(int coresPerRank) const {
  int fallback = std::clamp(coresPerRank, 1, 4);
  if (topoPlan_.onGpus && topoPlan_.searchChannels > 0) fallback = std::min(fallback, topoPlan_.searchChannels);
  int64_t wanted = env::integer("MININCL_NCHANNELS", fallback);  // (range-checked before the cast)
  MNCL_CHECK(wanted >= 1 && wanted <= 64, mnclInvalidArgument, "MININCL_NCHANNELS must be between 1 and 64");
  return withinChannelBounds((int)wanted, 64);
}

int Comm::withinChannelBounds(int want, int most) const {
  int low = options_.minChannels, high = options_.maxChannels;
  MNCL_CHECK(low >= 0 && low <= most && high >= 0 && high <= most && (high == 0 || low <= high), mnclInvalidArgument,
             "channel bounds minCTAs = " + std::to_string(low) + ", maxCTAs = " + std::to_string(high) +
                 ": each must be 0 (no bound) or at most " + std::to_string(most) + " on this device, and min <= max");
  if (high > 0) want = std::min(want, high);
  return std::max(want, low);
}

// (Work items alternate the two trees by channel: see planCollWorks.)
std::vector<int> Comm::treeParents(int c) const {
  std::vector<int> parents;
  for (int r = 0; r < nranks_; ++r) parents.push_back(dev::channelTreeNode(channels_[c]->dev, r, 0, c % 2).parent);
  return parents;
}

// Rank 0 speaks for all: the plan is the same everywhere. (Under INIT, and under TOPO: the
// topology search's outcome.)
void Comm::logPlan() const {
  for (const std::string& w : topoPlan_.warnings)
    MNCL_WARN(kInit, "topology (%s): %s", topoPlan_.source.c_str(), w.c_str());
  for (const std::string& n : topoPlan_.notes) MNCL_INFO(kTopo, "topology (%s): %s", topoPlan_.source.c_str(), n.c_str());
  MNCL_INFO(kInitTopo, "topology %s: %s", topoPlan_.source.empty() ? "-" : topoPlan_.source.c_str(), topoPlan_.why.c_str());
  bool severalHosts = std::any_of(topoPlan_.hosts.begin(), topoPlan_.hosts.end(), [](int h) { return h > 0; });
  MNCL_INFO(kInitTopo, "ranks on: %s%s%s%s", joined(topoPlan_.devices).c_str(), severalHosts ? " (hosts " : "",
            severalHosts ? joined(topoPlan_.hosts).c_str() : "", severalHosts ? ")" : "");
  for (int c = 0; c < (int)channels_.size(); ++c) {
    const auto& hops = topoPlan_.ringHops.empty() ? std::vector<std::string>{} : topoPlan_.ringHops[c % topoPlan_.ringHops.size()];
    MNCL_INFO(kInitTopo, "channel %d ring: %s%s%s%s", c, joined(channels_[c]->ring).c_str(), hops.empty() ? "" : " (hops ",
              joined(hops).c_str(), hops.empty() ? "" : ")");
    MNCL_INFO(kInitTopo, "channel %d tree %d (rooted at rank 0): parents %s", c, c % 2, joined(treeParents(c)).c_str());
  }
  if (topoPlan_.searched)
    MNCL_INFO(kInitTopo, "tuner: path bandwidth %.1f GB/s per channel, bandwidth scale %.3f", topoPlan_.bwGBs,
              tuner_.bandwidthScale());
}

}  // namespace mncl
