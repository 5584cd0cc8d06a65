// Tree algorithms over a double binary tree.
//
// Tree 0 is a binary heap over the ranks relabelled so the root is 0; tree 1 is its mirror
// (the labels run the other way round the ranks), so the ranks that are leaves in one tree
// are mostly inner nodes in the other. Channels alternate between the two trees, so every
// rank sends and receives about the same amount. Latency grows with log2(n), not n. Ranks on
// several hosts run chains within hosts and these trees across them (hostTreeNode).
//
// allreduce: partial sums flow up to the root, the result flows back down. Both directions
// run at once, chunk by chunk: a rank sends chunk i up before it waits for chunk i - lag to
// come down, so the tree stays busy without any connection's FIFO having to hold more than
// the lag.
#pragma once

#include "prims.h"
#include "steps.h"

namespace mncl::dev {

struct TreeNode {
  int parent = -1;
  PeerSet children;
};

// The node of `rank` in tree `index` (0 or 1) of n ranks rooted at `root`.
MNCL_HOSTDEV TreeNode treeNode(int rank, int n, int root, int index) {
  auto label = [&](int r) { return index == 0 ? (r - root + n) % n : (root - r + n) % n; };
  auto rankOf = [&](int v) { return index == 0 ? (v + root) % n : (root - v + n) % n; };
  int v = label(rank);
  TreeNode t;
  if (v > 0) t.parent = rankOf((v - 1) / 2);
  for (int c = 2 * v + 1; c <= 2 * v + 2 && c < n; ++c) t.children.add(rankOf(c));
  return t;
}

// Connections from the deepest leaf to the root: floor(log2(n)) in a binary heap.
MNCL_HOSTDEV int treeDepth(int n) {
  int d = 0;
  while ((2 << d) <= n) ++d;
  return d;
}

// Ranks on several hosts, `perHost` each, that `ring` visits host after host: within a host
// a chain in ring order, and across hosts the trees above over the hosts (NCCL's trees
// between nodes). A tree then crosses the network hosts - 1 times (once into each host but
// the root's), where a heap over rank numbers crosses it at most of its edges. The root's host's chain starts at the root, every
// other host's at the rank the ring enters it at; chains are the same in both trees, the
// hosts' places differ.
MNCL_HOSTDEV TreeNode hostTreeNode(const int* ring, int n, int perHost, int rank, int root, int index) {
  int pos = 0, rootPos = 0;
  for (int p = 0; p < n; ++p) {
    if (ring[p] == rank) pos = p;
    if (ring[p] == root) rootPos = p;
  }
  int host = pos / perHost, rootHost = rootPos / perHost;
  // Where host h's chain starts within its ring segment, and the chain's i-th rank.
  auto first = [&](int h) { return h == rootHost ? rootPos % perHost : 0; };
  auto chain = [&](int h, int i) { return ring[h * perHost + (first(h) + i) % perHost]; };
  int i = (pos % perHost - first(host) + perHost) % perHost;
  TreeNode t;
  if (i > 0) t.parent = chain(host, i - 1);
  if (i + 1 < perHost) t.children.add(chain(host, i + 1));
  if (i == 0) {  // the host's head: its place among the hosts
    TreeNode across = treeNode(host, n / perHost, rootHost, index);
    if (across.parent >= 0) t.parent = chain(across.parent, 0);
    for (int c = 0; c < across.children.n; ++c) t.children.add(chain(across.children.peer[c], 0));
  }
  return t;
}

// The depth of the trees a channel runs (see channelTreeNode).
MNCL_HOSTDEV int treeDepth(int n, int perHost) {
  return perHost > 0 ? perHost - 1 + treeDepth(n / perHost) : treeDepth(n);
}

// The node of `rank` in tree `index` of channel `ch`, rooted at `root`: host-aware where the
// ranks span hosts of equal sizes, else the heap over rank numbers.
MNCL_HOSTDEV TreeNode channelTreeNode(const DevChannel& ch, int rank, int root, int index) {
#if !defined(__CUDACC__)  // (GPU communicators do not span hosts: ranksPerHost is 0)
  if (ch.ranksPerHost > 0) return hostTreeNode(ch.ring, ch.nranks, ch.ranksPerHost, rank, root, index);
#endif
  return treeNode(rank, ch.nranks, root, index);
}

template <template <class, class> class Prims, typename T, typename Fn>
struct Tree {
  using Cx = PrimsContext<Fn>;
  // Up runs kLag chunks ahead of down. A rank's chunks sent up and not yet back down (at most
  // kLag + 1) then never fill the kSteps slots to its parent: a send up never waits on them.
  static constexpr size_t kLag = kSteps / 2;
  static_assert(kLag + 1 <= (size_t)kSteps);

  MNCL_DEV static TreeNode node(const Cx& cx, int root) {
    return channelTreeNode(cx.ch, cx.ch.rank, root, cx.work.treeIndex);
  }
  // Pieces for a pipeline `levels` times the tree's depth: one way (reduce up, broadcast
  // down) or both (allreduce). Every rank cuts the same way, so parent and child agree on
  // steps.
  template <typename P>
  MNCL_DEV static size_t step(const Cx& cx, const P& pr, int levels) {
    return pipelineStep<T>(cx.ch.sizes, pr.stepElems(), cx.work.chanCount,
                           levels * treeDepth(cx.ch.nranks, cx.ch.ranksPerHost));
  }

  MNCL_DEV static void allReduce(Cx cx) {
    const DevWork& w = cx.work;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    TreeNode t = node(cx, 0);
    PeerSet parent(t.parent);
    if (t.parent < 0) {  // root: reduce the children's sums and send the result straight back
      auto pr = Prims<T, Fn>(cx, t.children, t.children);
      forEachStep(step(cx, pr, 2), w.chanCount, [&](size_t off, size_t len) {
        pr.recvReduceCopySend(src + off, dst + off, len, kFinish);
      });
      return;
    }
    auto up = Prims<T, Fn>(cx, t.children, parent);
    auto down = Prims<T, Fn>(cx, parent, t.children);
    size_t chunk = step(cx, up, 2);
    size_t nchunks = divUp(w.chanCount, chunk);
    for (size_t i = 0; i < nchunks + kLag; ++i) {
      if (i < nchunks) {
        size_t off = i * chunk, len = minSize(chunk, w.chanCount - off);
        if (t.children.n == 0) up.send(src + off, len);
        else up.recvReduceSend(src + off, len);
      }
      if (i >= kLag && i - kLag < nchunks) {
        size_t off = (i - kLag) * chunk, len = minSize(chunk, w.chanCount - off);
        if (t.children.n == 0) down.recv(dst + off, len);
        else down.recvCopySend(dst + off, len);
      }
    }
  }

  MNCL_DEV static void broadcast(Cx cx) {
    const DevWork& w = cx.work;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    TreeNode t = node(cx, w.root);
    auto pr = Prims<T, Fn>(cx, PeerSet(t.parent), t.children);
    forEachStep(step(cx, pr, 1), w.chanCount, [&](size_t off, size_t len) {
      if (t.parent < 0) pr.copySend(src + off, dst + off, len);
      else if (t.children.n == 0) pr.recv(dst + off, len);
      else pr.recvCopySend(dst + off, len);
    });
  }

  MNCL_DEV static void reduce(Cx cx) {
    const DevWork& w = cx.work;
    const T* src = (const T*)w.send + w.chanOffset;
    T* dst = (T*)w.recv + w.chanOffset;
    TreeNode t = node(cx, w.root);
    auto pr = Prims<T, Fn>(cx, t.children, PeerSet(t.parent));
    forEachStep(step(cx, pr, 1), w.chanCount, [&](size_t off, size_t len) {
      if (t.parent < 0) pr.recvReduceCopy(src + off, dst + off, len, kFinish);
      else if (t.children.n == 0) pr.send(src + off, len);
      else pr.recvReduceSend(src + off, len);
    });
  }
};

}  // namespace mncl::dev
