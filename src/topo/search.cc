// Ring and tree search.
//
// Rings are found one channel at a time. Every link direction has a residual bandwidth;
// a channel moves `speed` GB/s over each link direction its ring uses (once per use), so
// a later channel only fits where bandwidth is left. Within a host the GPU order is found
// by depth-first search with pruning, maximising
//   1. the ring's bottleneck (capped at what one channel can move), then
//   2. the hop classes, compared worst class first (fewest NET, then SYS, NODE, ...),
// which is what keeps socket crossings to two and PCIe switch-mates next to each other.
// With several hosts each host contributes a chain whose ends leave through NICs
// (chosen by the same score, so the nearest NIC wins) and the chains are joined in host
// order. Later channels may not use hops of a worse class than channel 0 did, so an
// NVLink-only ring is never followed by a PCIe one.
//
// Trees: per channel, a chain through each host's GPUs in ring order, and across hosts a
// binary tree over the chains' heads; odd channels use the mirrored (or shifted) tree so
// the two trees of a channel pair load different hosts as inner nodes.
#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "comm_plan.h"
#include "paths.h"
#include "topo.h"

namespace mncl::topo {
namespace {

constexpr double kChannelBw = kSearchChannelBw;  // GB/s one channel (an SM or a CPU thread) moves
constexpr int kMaxChannels = 32;
constexpr long kStepBudget = 2000000;    // DFS steps per host and channel
constexpr double kEps = 1e-6;

using Counts = std::array<int, kPathTypes>;  // hops per class, worst class first

int worstFirstIndex(PathType t) { return kPathTypes - 1 - static_cast<int>(t); }

struct Score {
  double bw = -1;   // capped bottleneck
  Counts counts{};
  bool betterThan(const Score& o) const {
    if (bw > o.bw + kEps) return true;
    if (bw < o.bw - kEps) return false;
    return counts < o.counts;
  }
};

// A host's part of one channel's ring.
struct Segment {
  std::vector<int> ranks;
  int nicIn = -1, nicOut = -1;  // NIC node ids (hosts > 1)
  std::vector<int> hops;        // every directed link used, with repeats
  Score score;
  PathType worstGpuHop = PathType::Self, worstNicHop = PathType::Self;
};

struct Shared {
  const System& sys;
  std::vector<int> rankNode;                 // rank -> GPU node
  std::vector<std::vector<Route>> gpuRoute;  // [rank][rank]
  std::map<std::pair<int, int>, Route> nicRoute;  // (from node, to node) for GPU<->NIC
  std::vector<double> residual;              // per directed link
  double speed = kChannelBw;                 // channel 0 sets it
  PathType maxGpuHop = PathType::Net, maxNicHop = PathType::Net;  // bounds after channel 0

  explicit Shared(const System& s) : sys(s) {}
  const Route& nicToGpu(int nic, int rank) const { return nicRoute.at({nic, rankNode[rank]}); }
  const Route& gpuToNic(int rank, int nic) const { return nicRoute.at({rankNode[rank], nic}); }
  int netLink(int nic, bool up) const {
    int net = sys.netNode();
    int l = net >= 0 ? sys.linkBetween(nic, net) : -1;
    return l < 0 ? -1 : directedLink(l, (sys.links[l].a == nic) == up);
  }
};

// Depth-first search of one host's GPU order for one channel.
class HostSearch {
 public:
  HostSearch(const Shared& s, std::vector<int> ranks, std::vector<int> nics, bool closed)
      : s_(s), ranks_(std::move(ranks)), nics_(std::move(nics)), closed_(closed),
        load_(s.residual.size(), 0) {
    for (int r : ranks_) candidates_[r] = sortedCandidates(r);
  }

  // False when no order meets the channel's speed and class bounds.
  bool run(bool firstChannel, Segment* out) {
    firstChannel_ = firstChannel;
    best_ = Segment{};
    found_ = false;
    steps_ = 0;
    order_.clear();
    findNicReachableEnds();
    size_t starts = closed_ ? 1 : ranks_.size();  // a ring's rotation does not matter
    for (size_t i = 0; i < starts && steps_ < kStepBudget; ++i) {
      if (!canEnter_[ranks_[i]]) continue;
      order_.push_back(ranks_[i]);
      dfs(std::numeric_limits<double>::infinity(), Counts{});
      order_.pop_back();
    }
    if (found_) *out = best_;
    return found_;
  }

 private:
  const Shared& s_;
  std::vector<int> ranks_, nics_;
  bool closed_;
  bool firstChannel_ = true, found_ = false;
  std::vector<int> load_;
  std::vector<int> order_;
  std::vector<int> hops_;
  std::map<int, std::vector<int>> candidates_;
  Segment best_;
  long steps_ = 0;
  std::map<int, bool> canEnter_, canExit_;  // rank has a NIC with room for one more channel

  // A chain can only start (end) at a GPU whose NIC route still has room; knowing that
  // up front saves searching orders that are bound to fail at their last step.
  void findNicReachableEnds() {
    for (int r : ranks_) {
      canEnter_[r] = canExit_[r] = closed_ || nics_.empty() || firstChannel_;
      if (canEnter_[r]) continue;
      for (int nic : nics_) {
        canEnter_[r] = canEnter_[r] || nicHasRoom(nic, r, true);
        canExit_[r] = canExit_[r] || nicHasRoom(nic, r, false);
      }
    }
  }

  bool nicHasRoom(int nic, int rank, bool inbound) const {
    Route r = nicHop(nic, rank, inbound);
    PathType type = inbound ? s_.nicToGpu(nic, rank).type : s_.gpuToNic(rank, nic).type;
    if (!r.reachable || type > s_.maxNicHop) return false;
    for (int h : r.hops)
      if (s_.residual[h] < s_.speed - kEps) return false;
    return true;
  }

  std::vector<int> sortedCandidates(int from) const {
    std::vector<int> c;
    for (int r : ranks_)
      if (r != from) c.push_back(r);
    std::stable_sort(c.begin(), c.end(), [&](int a, int b) {
      const Route &ra = s_.gpuRoute[from][a], &rb = s_.gpuRoute[from][b];
      if (ra.type != rb.type) return ra.type < rb.type;
      return ra.bw > rb.bw;
    });
    return c;
  }

  double capped(double bw) const { return std::min(bw, s_.speed); }
  bool used(int r) const { return std::find(order_.begin(), order_.end(), r) != order_.end(); }

  double push(const Route& route, double bottleneck) {
    for (int h : route.hops) {
      ++load_[h];
      hops_.push_back(h);
      bottleneck = std::min(bottleneck, s_.residual[h] / load_[h]);
    }
    return bottleneck;
  }
  void pop(const Route& route) {
    for (int h : route.hops) --load_[h];
    hops_.resize(hops_.size() - route.hops.size());
  }

  // Can a partial order with this bottleneck and these counts still beat the best?
  bool hopeless(double bottleneck, Counts counts) const {
    double bw = capped(bottleneck);
    if (!firstChannel_ && bw < s_.speed - kEps) return true;
    if (!found_) return false;
    if (bw < best_.score.bw - kEps) return true;
    // Optimistic completion: every remaining hop NVLink, every NIC hop PIX.
    int remaining = static_cast<int>(ranks_.size() - order_.size()) + (closed_ ? 1 : 0);
    counts[worstFirstIndex(PathType::NvLink)] += remaining;
    if (!closed_ && !nics_.empty()) counts[worstFirstIndex(PathType::Pix)] += 2;
    return !Score{bw, counts}.betterThan(best_.score);
  }

  bool gpuHopAllowed(const Route& r) const {
    return r.reachable && (firstChannel_ || r.type <= s_.maxGpuHop);
  }

  void dfs(double bottleneck, Counts counts) {
    if (++steps_ > kStepBudget) return;
    if (hopeless(bottleneck, counts)) return;
    int current = order_.back();
    if (order_.size() == ranks_.size()) return finish(bottleneck, counts);
    for (int next : candidates_[current]) {
      if (used(next)) continue;
      if (order_.size() + 1 == ranks_.size() && !canExit_[next]) continue;
      const Route& r = s_.gpuRoute[current][next];
      if (!gpuHopAllowed(r)) continue;
      Counts c = counts;
      ++c[worstFirstIndex(r.type)];
      double b = push(r, bottleneck);
      order_.push_back(next);
      dfs(b, c);
      order_.pop_back();
      pop(r);
    }
  }

  void finish(double bottleneck, Counts counts) {
    if (closed_) {
      if (ranks_.size() > 1) {
        const Route& r = s_.gpuRoute[order_.back()][order_.front()];
        if (!gpuHopAllowed(r)) return;
        ++counts[worstFirstIndex(r.type)];
        bottleneck = push(r, bottleneck);
        consider(bottleneck, counts, -1, -1);
        pop(r);
      } else {
        consider(bottleneck, counts, -1, -1);
      }
      return;
    }
    finishWithNics(bottleneck, counts);
  }

  // The chain enters at order_.front() and leaves at order_.back(), each through the
  // NIC that scores best given what the chain already uses.
  void finishWithNics(double bottleneck, Counts counts) {
    if (nics_.empty()) return consider(bottleneck, counts, -1, -1);
    int nicIn = pickNic(order_.front(), true, bottleneck);
    if (nicIn < 0) return;
    Route in = nicHop(nicIn, order_.front(), true);
    bottleneck = push(in, bottleneck);
    ++counts[worstFirstIndex(s_.nicToGpu(nicIn, order_.front()).type)];
    int nicOut = pickNic(order_.back(), false, bottleneck);
    if (nicOut >= 0) {
      Route out = nicHop(nicOut, order_.back(), false);
      double b = push(out, bottleneck);
      Counts c = counts;
      ++c[worstFirstIndex(s_.gpuToNic(order_.back(), nicOut).type)];
      consider(b, c, nicIn, nicOut);
      pop(out);
    }
    pop(in);
  }

  // GPU<->NIC route plus the NIC's own link to the network, in travel order.
  Route nicHop(int nic, int rank, bool inbound) const {
    Route r = inbound ? s_.nicToGpu(nic, rank) : s_.gpuToNic(rank, nic);
    int net = s_.netLink(nic, !inbound);
    if (net >= 0) {
      if (inbound) r.hops.insert(r.hops.begin(), net);
      else r.hops.push_back(net);
    }
    return r;
  }

  int pickNic(int rank, bool inbound, double bottleneck) {
    int bestNic = -1;
    Score bestScore;
    for (int nic : nics_) {
      Route r = nicHop(nic, rank, inbound);
      if (!r.reachable) continue;
      PathType type = inbound ? s_.nicToGpu(nic, rank).type : s_.gpuToNic(rank, nic).type;
      if (!firstChannel_ && type > s_.maxNicHop) continue;
      Score sc;
      sc.bw = capped(push(r, bottleneck));
      pop(r);
      ++sc.counts[worstFirstIndex(type)];
      if (bestNic < 0 || sc.betterThan(bestScore)) { bestNic = nic; bestScore = sc; }
    }
    return bestNic;
  }

  void consider(double bottleneck, const Counts& counts, int nicIn, int nicOut) {
    Score sc{capped(bottleneck), counts};
    if (!firstChannel_ && sc.bw < s_.speed - kEps) return;
    if (found_ && !sc.betterThan(best_.score)) return;
    found_ = true;
    best_.ranks = order_;
    best_.nicIn = nicIn;
    best_.nicOut = nicOut;
    best_.hops = hops_;
    best_.score = sc;
    best_.worstGpuHop = worstGpuHop();
    best_.worstNicHop = PathType::Self;
    if (nicIn >= 0) best_.worstNicHop = s_.nicToGpu(nicIn, order_.front()).type;
    if (nicOut >= 0)
      best_.worstNicHop = std::max(best_.worstNicHop, s_.gpuToNic(order_.back(), nicOut).type);
  }

  PathType worstGpuHop() const {
    PathType worst = PathType::Self;
    size_t n = order_.size();
    size_t hops = closed_ && n > 1 ? n : n - 1;
    for (size_t i = 0; i < hops; ++i)
      worst = std::max(worst, s_.gpuRoute[order_[i]][order_[(i + 1) % n]].type);
    return worst;
  }
};

void bisect(int lo, int hi, int parent, std::vector<int>& parentOf) {
  if (lo > hi) return;
  int mid = (lo + hi) / 2;
  parentOf[mid] = parent;
  bisect(lo, mid - 1, mid, parentOf);
  bisect(mid + 1, hi, mid, parentOf);
}

// Binary tree over n positions; variant 1 is the mirror (n even) or a shift by one
// (n odd), so that inner nodes of one tree are mostly leaves of the other.
std::vector<int> hostTree(int n, int variant) {
  std::vector<int> byPos(n, -1);
  bisect(0, n - 1, -1, byPos);
  if (variant == 0) return byPos;
  auto hostAt = [&](int p) { return n % 2 == 0 ? n - 1 - p : (p + 1) % n; };
  std::vector<int> parentOf(n, -1);
  for (int p = 0; p < n; ++p) parentOf[hostAt(p)] = byPos[p] < 0 ? -1 : hostAt(byPos[p]);
  return parentOf;
}

std::vector<TreeNode> buildTrees(const std::vector<std::vector<int>>& chains, int nRanks,
                                 int variant) {
  std::vector<TreeNode> tree(nRanks);
  for (const auto& chain : chains)
    for (size_t i = 1; i < chain.size(); ++i) {
      tree[chain[i]].parent = chain[i - 1];
      tree[chain[i - 1]].children.push_back(chain[i]);
    }
  std::vector<int> parentHost = hostTree(static_cast<int>(chains.size()), variant);
  for (size_t h = 0; h < chains.size(); ++h) {
    if (parentHost[h] < 0) continue;
    int head = chains[h].front(), parentHead = chains[parentHost[h]].front();
    tree[head].parent = parentHead;
    tree[parentHead].children.push_back(head);
  }
  return tree;
}

int nicIndex(const System& sys, int node) {
  auto it = std::find(sys.nicIds.begin(), sys.nicIds.end(), node);
  return it == sys.nicIds.end() ? -1 : static_cast<int>(it - sys.nicIds.begin());
}

void precomputeRoutes(Shared& s, const std::vector<int>& hostNics) {
  size_t n = s.rankNode.size();
  s.gpuRoute.assign(n, std::vector<Route>(n));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (s.sys.nodes[s.rankNode[i]].host == s.sys.nodes[s.rankNode[j]].host)
        s.gpuRoute[i][j] = findRoute(s.sys, s.rankNode[i], s.rankNode[j]);
  for (int g : s.rankNode)
    for (int nic : hostNics)
      if (s.sys.nodes[g].host == s.sys.nodes[nic].host) {
        s.nicRoute[{g, nic}] = findRoute(s.sys, g, nic);
        s.nicRoute[{nic, g}] = findRoute(s.sys, nic, g);
      }
}

void recordChannel(const Shared& s, const std::vector<Segment>& segs, SearchResult& out) {
  std::vector<int> ring;
  std::vector<std::string> labels;
  std::vector<NetHop> net;
  std::vector<std::vector<int>> chains;
  for (size_t h = 0; h < segs.size(); ++h) {
    const Segment& seg = segs[h];
    chains.push_back(seg.ranks);
    for (size_t i = 0; i < seg.ranks.size(); ++i) {
      ring.push_back(seg.ranks[i]);
      bool last = i + 1 == seg.ranks.size();
      if (!last) labels.push_back(routeLabel(s.gpuRoute[seg.ranks[i]][seg.ranks[i + 1]]));
    }
    if (segs.size() == 1) {
      if (seg.ranks.size() > 1)
        labels.push_back(routeLabel(s.gpuRoute[seg.ranks.back()][seg.ranks.front()]));
    } else {
      const Segment& next = segs[(h + 1) % segs.size()];
      labels.push_back("NET");
      net.push_back({seg.ranks.back(), nicIndex(s.sys, seg.nicOut), nicIndex(s.sys, next.nicIn),
                     next.ranks.front()});
    }
  }
  int channel = static_cast<int>(out.rings.size());
  out.trees.push_back(buildTrees(chains, static_cast<int>(s.rankNode.size()), channel % 2));
  out.rings.push_back(ring);
  out.ringHops.push_back(labels);
  out.ringNet.push_back(net);
}

}  // namespace

SearchResult search(System& sys, int nRanks) {
  int nGpus = static_cast<int>(sys.gpuIds.size());
  if (nGpus == 0) {
    SearchResult out;
    out.warnings.push_back("no GPUs found: no rings or trees to search");
    return out;
  }
  std::string warning;
  if (nRanks <= 0 || nRanks > nGpus) {
    if (nRanks > nGpus)
      warning = "asked for " + std::to_string(nRanks) + " ranks but only " +
                std::to_string(nGpus) + " GPUs exist; using all";
    nRanks = nGpus;
  }
  SearchResult out = searchNodes(sys, {sys.gpuIds.begin(), sys.gpuIds.begin() + nRanks});
  if (!warning.empty()) out.warnings.insert(out.warnings.begin(), warning);
  return out;
}

SearchResult searchNodes(System& sys, const std::vector<int>& nodes) {
  SearchResult out;
  int nRanks = static_cast<int>(nodes.size());
  if (nRanks == 0) return out;
  Shared s(sys);
  s.rankNode = nodes;
  s.residual.resize(2 * sys.links.size());
  for (size_t l = 0; l < sys.links.size(); ++l)
    s.residual[2 * l] = s.residual[2 * l + 1] = sys.links[l].bw;

  // Ranks grouped by host, hosts in order of their first rank.
  std::vector<int> hostOrder;
  std::map<int, std::vector<int>> ranksOf, nicsOf;
  for (int r = 0; r < nRanks; ++r) {
    int h = sys.nodes[s.rankNode[r]].host;
    if (!ranksOf.count(h)) hostOrder.push_back(h);
    ranksOf[h].push_back(r);
  }
  bool multiHost = hostOrder.size() > 1;
  std::vector<int> usedNics;
  for (int nic : sys.nicIds)
    if (multiHost && ranksOf.count(sys.nodes[nic].host)) {
      nicsOf[sys.nodes[nic].host].push_back(nic);
      usedNics.push_back(nic);
    }
  for (int h : hostOrder)
    if (multiHost && nicsOf[h].empty())
      out.warnings.push_back("host " + sys.hostNames[h] +
                             " has no NIC: its ring hops to other hosts are not modelled");
  precomputeRoutes(s, usedNics);

  std::vector<HostSearch> searches;
  for (int h : hostOrder) searches.emplace_back(s, ranksOf[h], nicsOf[h], !multiHost);

  int maxChannels = nRanks == 1 ? 1 : kMaxChannels;
  for (int c = 0; c < maxChannels; ++c) {
    std::vector<Segment> segs(hostOrder.size());
    bool ok = true;
    for (size_t i = 0; i < searches.size() && ok; ++i) ok = searches[i].run(c == 0, &segs[i]);
    if (!ok) break;
    if (c == 0) {
      double bw = std::numeric_limits<double>::infinity();
      s.maxGpuHop = s.maxNicHop = PathType::Self;
      for (const Segment& seg : segs) {
        bw = std::min(bw, seg.score.bw);
        s.maxGpuHop = std::max(s.maxGpuHop, seg.worstGpuHop);
        s.maxNicHop = std::max(s.maxNicHop, seg.worstNicHop);
      }
      if (bw < kEps) {
        out.warnings.push_back("the best ring has no bandwidth left; no channels");
        break;
      }
      s.speed = std::min(bw, kChannelBw);
      out.channelBw = s.speed;
    }
    for (const Segment& seg : segs)
      for (int h : seg.hops) s.residual[h] -= s.speed;
    recordChannel(s, segs, out);
  }
  out.nChannels = static_cast<int>(out.rings.size());
  return out;
}

}  // namespace mncl::topo
