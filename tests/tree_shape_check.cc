// The shapes of the trees that ranks on several hosts run (cuda/tree.h, hostTreeNode): for
// every host count and size, ring order within the hosts, root and tree index, the parents
// and children form one tree rooted at the root, as deep as treeDepth says, whose edges
// leave a host only between hosts' chains: hosts - 1 of them, the fewest a tree over the
// hosts can have. Prints "N checks, M failed"; exits 0 when none failed.
//
//   c++ -std=c++20 -Icuda tests/tree_shape_check.cc && ./a.out
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "tree.h"

using mncl::dev::TreeNode;

namespace {

int checks = 0, failed = 0;

void expect(bool ok, const char* what, int hosts, int perHost, int root, int index) {
  ++checks;
  if (ok) return;
  if (++failed <= 20) std::printf("FAIL %s: %d hosts of %d, root %d, tree %d\n", what, hosts, perHost, root, index);
}

// A ring that visits the hosts one after another; each host holds a random set of ranks, in
// a random order (rank numbers need not follow the hosts).
std::vector<int> hostRing(int hosts, int perHost, std::mt19937& rng) {
  std::vector<int> ring(hosts * perHost);
  for (int i = 0; i < (int)ring.size(); ++i) ring[i] = i;
  std::shuffle(ring.begin(), ring.end(), rng);
  return ring;
}

void checkTrees(int hosts, int perHost, std::mt19937& rng) {
  int n = hosts * perHost;
  std::vector<int> ring = hostRing(hosts, perHost, rng), hostOf(n);
  for (int p = 0; p < n; ++p) hostOf[ring[p]] = p / perHost;
  for (int root = 0; root < n; ++root) {
    for (int index = 0; index < 2; ++index) {
      std::vector<TreeNode> t(n);
      for (int r = 0; r < n; ++r) t[r] = mncl::dev::hostTreeNode(ring.data(), n, perHost, r, root, index);
      bool linked = true;  // every parent lists the rank among its children, and the reverse
      int edges = 0, crossing = 0;
      for (int r = 0; r < n; ++r) {
        const TreeNode& me = t[r];
        if (me.parent >= 0) {
          const TreeNode& up = t[me.parent];
          linked = linked && std::count(up.children.peer, up.children.peer + up.children.n, r) == 1;
          ++edges;
          crossing += hostOf[r] != hostOf[me.parent];
        }
        for (int c = 0; c < me.children.n; ++c) linked = linked && t[me.children.peer[c]].parent == r;
        expect(me.children.n <= 3, "at most 3 children", hosts, perHost, root, index);
      }
      expect(linked, "parents and children agree", hosts, perHost, root, index);
      expect(t[root].parent < 0 && edges == n - 1, "only the root has no parent", hosts, perHost, root, index);
      int deepest = 0;  // connections from each rank up to the root (no cycles: at most n)
      bool reaches = true;
      for (int r = 0; r < n; ++r) {
        int d = 0;
        for (int at = r; at != root && d <= n; at = t[at].parent, ++d) {
          if (t[at].parent < 0) d = n + 1;
        }
        reaches = reaches && d <= n;
        deepest = std::max(deepest, d);
      }
      expect(reaches, "every rank reaches the root", hosts, perHost, root, index);
      expect(deepest == mncl::dev::treeDepth(n, perHost), "depth as treeDepth says", hosts, perHost, root, index);
      expect(crossing == hosts - 1, "hosts - 1 edges between hosts", hosts, perHost, root, index);
    }
  }
}

}  // namespace

int main() {
  std::mt19937 rng(12345);
  for (int hosts = 1; hosts <= 7; ++hosts) {
    for (int perHost = 1; perHost <= 5; ++perHost) {
      if (hosts * perHost > mncl::dev::kMaxPeers * 4) continue;
      for (int trial = 0; trial < 3; ++trial) checkTrees(hosts, perHost, rng);
    }
  }
  std::printf("%d checks, %d failed\n", checks, failed);
  return failed == 0 ? 0 : 1;
}
