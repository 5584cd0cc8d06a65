// Groups of sends and receives as the GPU's p2p kernel runs them (cuda/gpu/kernels.cu: a
// block per channel, its ops in shared memory, P2pEngine run by every thread: thread 0 decides
// and posts, every thread copies), on blocks of CPU threads that emulate CUDA blocks
// (MNCL_SIMT_EMULATION, tests/simt_block.h). Every rank exchanges messages of uneven sizes
// (zero bytes too) with every other, split over channels as the host splits them
// (src/enqueue/work_plan.cc: p2pSplit, its spread by peer), plus two messages in a row on one
// connection; the received bytes are checked. A recv longer than its send, and a rank that
// never joins, must stop every block. Exits 0 when every check passes.
//
//   c++ -std=c++20 -O1 -pthread -DMNCL_SIMT_EMULATION -Icuda tests/simt_p2p_check.cc
//   ./a.out [threads-per-block]
#include <string>

#include "dispatch.h"
#include "simt_block.h"

namespace mncl::dev {

constexpr int kChannels = 3;

// One send or recv of a group, as the caller made it.
struct Call {
  bool isSend;
  int peer;
  std::vector<uint8_t>* buf;
  size_t bytes;  // (a recv may say more than its buffer holds: a mismatch case)
};

// The host's split of a message over channels (src/enqueue/work_plan.cc, p2pSplit and
// planP2pOps, with the channel spread on, as on GPUs): a channel per 4 slots, up to every
// channel, 64-byte slices, from channel (rank + peer) mod channels on.
void planOps(int rank, const Call& c, uint32_t slotBytes, std::vector<std::vector<P2pOp>>& perChannel) {
  int nch = (int)std::clamp<size_t>(c.bytes / (4 * (size_t)slotBytes), 1, kChannels);
  size_t share = ((c.bytes + nch - 1) / nch + 63) / 64 * 64;
  int first = (rank + c.peer) % kChannels;
  for (int ch = 0; ch < nch; ++ch) {
    P2pOp op{};
    op.isSend = c.isSend;
    op.peer = c.peer;
    size_t off = std::min(c.bytes, ch * share);
    op.buf = reinterpret_cast<char*>(c.buf->data()) + off;
    op.bytes = ch == nch - 1 ? c.bytes - off : std::min(share, c.bytes - off);
    op.totalBytes = c.bytes;
    op.dtype = DataType::u8;
    op.pointerSteps = false;  // (as on a GPU)
    perChannel[(first + ch) % kChannels].push_back(op);
  }
}

// Runs every rank's group (ranks [0, present)); false if any block stopped early.
bool runGroups(std::vector<Ranks*> channels, int threads, const std::vector<std::vector<Call>>& groups,
               std::vector<DevError>& errors, int present = -1) {
  int n = channels[0]->n;
  // ops[r][ch]: what the kernel's block of channel ch of rank r holds in shared memory.
  std::vector<std::vector<std::vector<P2pOp>>> ops(n, std::vector<std::vector<P2pOp>>(kChannels));
  for (int r = 0; r < n; ++r) {
    for (const Call& c : groups[r]) planOps(r, c, channels[0]->channels[r].sizes.simpleSlotBytes, ops[r]);
  }
  return runBlocks(channels, threads, [&](int r, int ch) {
    std::vector<P2pOp>& mine = ops[r][ch];
    if (mine.empty()) return true;  // (the host launches no block for it)
    DevChannel& dc = channels[ch]->channels[r];
    Waiter waiter{dc.abortFlag, dc.spinBudget};
    P2pEngine engine{dc, waiter, &errors[ch * n + r]};
    return engine.run(mine.data(), (int)mine.size());
  }, errors, present);
}

int failures = 0, checks = 0;

uint8_t byteOf(int from, int to, int message, size_t i) { return (uint8_t)(i * 31 + from * 7 + to * 3 + message * 101); }

// Every rank sends a message to every other and receives one from each (sizes differ by
// pair; `base` 0 makes some of them empty), and rank r sends rank r+1 a second message after
// the first (the same connection: it must wait for the first).
void checkExchange(std::vector<Ranks*> channels, int threads, size_t base) {
  int n = channels[0]->n;
  watchCase("exchange of " + std::to_string(n) + " ranks, messages of up to " + std::to_string(3 * base + 2) + " bytes");
  auto size = [&](int from, int to, int message) { return base * ((from * 3 + to * 5 + message) % 4) + (from + to) % 3; };
  std::vector<std::vector<std::vector<uint8_t>>> sent(n), got(n);  // [rank][call]
  std::vector<std::vector<Call>> groups(n);
  std::vector<std::vector<std::pair<int, int>>> expected(n);  // per recv call: (from, message)
  for (int r = 0; r < n; ++r) {
    sent[r].reserve(2 * n);  // (calls keep pointers into these)
    got[r].reserve(2 * n);
    for (int k = 1; k < n; ++k) {
      int to = (r + k) % n, from = (r - k + n) % n;
      for (int message = 0; message < (k == 1 ? 2 : 1); ++message) {
        sent[r].emplace_back(size(r, to, message));
        for (size_t i = 0; i < sent[r].back().size(); ++i) sent[r].back()[i] = byteOf(r, to, message, i);
        groups[r].push_back({true, to, &sent[r].back(), sent[r].back().size()});
        got[r].emplace_back(size(from, r, message), (uint8_t)0xee);
        groups[r].push_back({false, from, &got[r].back(), got[r].back().size()});
        expected[r].push_back({from, message});
      }
    }
  }
  std::vector<DevError> errors;
  bool ran = runGroups(channels, threads, groups, errors);
  size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t k = 0; k < got[r].size(); ++k) {
      auto [from, message] = expected[r][k];
      for (size_t i = 0; i < got[r][k].size(); ++i) wrong += got[r][k][i] != byteOf(from, r, message, i);
    }
  }
  ++checks;
  if (!ran || wrong) {
    ++failures;
    std::printf("FAIL exchange: %d ranks, %d threads, messages of ~%zu bytes: %s, %zu wrong bytes\n", n, threads,
                base, ran ? "ran" : "stopped early", wrong);
  }
}

// Rank 1 expects more bytes than rank 0 sends: both must stop, the mismatch recorded (the
// first step says the send's size), nothing written into the recv's buffer.
void checkMismatch(ProtoSizes sizes, int threads) {
  std::vector<std::unique_ptr<Ranks>> owned;
  std::vector<Ranks*> channels;
  for (int c = 0; c < kChannels; ++c) {
    owned.push_back(std::make_unique<Ranks>(2, sizes));
    channels.push_back(owned.back().get());
  }
  std::vector<uint8_t> out(30000, 1), in(50000, 0);
  std::vector<std::vector<Call>> groups = {{{true, 1, &out, out.size()}}, {{false, 0, &in, in.size()}}};
  std::vector<DevError> errors;
  bool ran = runGroups(channels, threads, groups, errors);
  int mismatches = 0;
  for (DevError& e : errors) mismatches += e.peer >= 0;
  size_t written = 0;
  for (uint8_t b : in) written += b != 0;
  ++checks;
  if (ran || mismatches == 0 || written) {
    ++failures;
    std::printf("FAIL mismatch: a recv of 50000 bytes from a send of 30000, %d threads: %s, %d block(s) reported it, "
                "%zu byte(s) written\n",
                threads, ran ? "completed" : "stopped", mismatches, written);
  }
}

// Rank 2 never joins: ranks 0 and 1 wait for it until the abort word is set, then stop.
void checkAbortWithMissingPeer(ProtoSizes sizes, int threads) {
  std::vector<std::unique_ptr<Ranks>> owned;
  std::vector<Ranks*> channels;
  for (int c = 0; c < kChannels; ++c) {
    owned.push_back(std::make_unique<Ranks>(3, sizes));
    channels.push_back(owned.back().get());
  }
  std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(100000, 1));
  std::vector<std::vector<Call>> groups(3);
  for (int r = 0; r < 2; ++r) {
    groups[r] = {{true, 2, &bufs[2 * r], 100000}, {false, 2, &bufs[2 * r + 1], 100000}};
  }
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (Ranks* ch : channels) storeRelease(&ch->abortFlag, 1u);  // (one word per communicator)
  });
  std::vector<DevError> errors;
  bool ran = runGroups(channels, threads, groups, errors, 2);
  aborter.join();
  ++checks;
  if (ran) {
    ++failures;
    std::printf("FAIL abort: sends and recvs with a missing rank completed instead of stopping (%d threads)\n", threads);
  }
}

}  // namespace mncl::dev

int main(int argc, char** argv) {
  using namespace mncl;
  using namespace mncl::dev;
  int threads = argc > 1 ? std::atoi(argv[1]) : 64;
  failAfter(600);  // (a backstop: a hang ends after runBlocks' kStallSeconds)
  ProtoSizes sizes{4096, 320, 48, 64};  // (4 KiB slots: a message of 16 KiB per channel)
  for (int n : {2, 3, 4}) {
    std::vector<std::unique_ptr<Ranks>> owned;
    std::vector<Ranks*> channels;
    for (int c = 0; c < kChannels; ++c) {
      owned.push_back(std::make_unique<Ranks>(n, sizes));
      channels.push_back(owned.back().get());
    }
    for (size_t base : {0, 5, 1000, 4096, 70001}) checkExchange(channels, threads, base);
  }
  checkMismatch(sizes, threads);
  checkAbortWithMissingPeer(sizes, threads);
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
