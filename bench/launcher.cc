#include "launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device.h"

namespace perf {
namespace {

constexpr const char* kEnvRank = "MININCL_PERF_RANK";
constexpr const char* kEnvSize = "MININCL_PERF_NRANKS";
constexpr const char* kEnvId = "MININCL_PERF_UNIQUE_ID";

std::string toHex(const mnclUniqueId& id) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    unsigned char b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

bool fromHex(const char* text, mnclUniqueId* id) {
  std::string s = text;
  if (s.size() != 2 * sizeof id->internal) return false;
  for (size_t i = 0; i < sizeof id->internal; ++i) {
    id->internal[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

void report(const char* what, mnclResult_t rc, mnclComm_t comm) {
  std::fprintf(stderr, "minincl-perf: %s failed: %s (%s)\n", what, mnclGetErrorString(rc), mnclGetLastError(comm));
}

int runRankProcess(const Options& opt, const RankMain& rankMain) {
  int rank = std::atoi(std::getenv(kEnvRank));
  int nranks = std::atoi(std::getenv(kEnvSize));
  mnclUniqueId id;
  const char* hex = std::getenv(kEnvId);
  if (!hex || !fromHex(hex, &id)) {
    std::fprintf(stderr, "minincl-perf: rank %d: %s is missing or malformed\n", rank, kEnvId);
    return 1;
  }
  std::unique_ptr<Device> dev = makeDevice(opt.device, rank);
  mnclComm_t comm = nullptr;
  mnclResult_t rc = mnclCommInitRankDevice(&comm, nranks, id, rank, dev->mnclDevice());
  if (rc != mnclSuccess) {
    report("mnclCommInitRankDevice", rc, nullptr);
    return 1;
  }
  int status = rankMain(comm, rank, nranks);
  mnclCommDestroy(comm);
  return status;
}

}  // namespace

void applyEnvironment(const Options& opt) {
  if (!opt.algo.empty()) setenv("MININCL_ALGO", opt.algo.c_str(), 1);
  if (!opt.proto.empty()) setenv("MININCL_PROTO", opt.proto.c_str(), 1);
  if (opt.nChannels > 0) setenv("MININCL_NCHANNELS", std::to_string(opt.nChannels).c_str(), 1);
}

bool isRankProcess() { return std::getenv(kEnvRank) != nullptr; }

namespace {

// mnclCommInitAll over -t N ranks (rank r on the device makeDevice gives it); empty on failure.
std::vector<mnclComm_t> initAll(const Options& opt) {
  int n = opt.nThreads;
  std::vector<int> devlist;
  for (int r = 0; r < n; ++r) devlist.push_back(makeDevice(opt.device, r)->mnclDevice());
  std::vector<mnclComm_t> comms(n, nullptr);
  mnclResult_t rc = mnclCommInitAll(comms.data(), n, devlist.data());
  if (rc != mnclSuccess) {
    report("mnclCommInitAll", rc, nullptr);
    return {};
  }
  return comms;
}

}  // namespace

int runThreads(const Options& opt, const RankMain& rankMain) {
  std::vector<mnclComm_t> comms = initAll(opt);
  if (comms.empty()) return 1;
  int n = (int)comms.size();
  std::vector<int> status(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { status[r] = rankMain(comms[r], r, n); });
  for (auto& t : threads) t.join();
  int worst = 0;
  for (int r = 0; r < n; ++r) {
    mnclCommDestroy(comms[r]);
    if (status[r] != 0) worst = status[r];
  }
  return worst;
}

int runOneThread(const Options& opt, const AllRanksMain& allRanks) {
  std::vector<mnclComm_t> comms = initAll(opt);
  if (comms.empty()) return 1;
  int status = allRanks(comms);
  for (mnclComm_t c : comms) mnclCommDestroy(c);
  return status;
}

int runProcesses(const Options& opt, char** argv, const RankMain& rankMain) {
  if (isRankProcess()) return runRankProcess(opt, rankMain);
  int n = opt.nProcs;
  // The root listener lives in this process, which stays up until every rank has exited.
  mnclUniqueId id;
  mnclResult_t rc = mnclGetUniqueId(&id);
  if (rc != mnclSuccess) {
    report("mnclGetUniqueId", rc, nullptr);
    return 1;
  }
  std::string hex = toHex(id);
  std::vector<pid_t> pids;
  std::fflush(stdout);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("minincl-perf: fork");
      for (pid_t p : pids) kill(p, SIGTERM);
      return 1;
    }
    if (pid == 0) {
      setenv(kEnvRank, std::to_string(r).c_str(), 1);
      setenv(kEnvSize, std::to_string(n).c_str(), 1);
      setenv(kEnvId, hex.c_str(), 1);
      execv("/proc/self/exe", argv);
      std::perror("minincl-perf: execv /proc/self/exe");
      _exit(127);
    }
    pids.push_back(pid);
  }
  // The status is the first failed rank's: the others may only have been stopped here.
  int first = 0;
  for (size_t left = pids.size(); left > 0; --left) {
    int ws = 0;
    pid_t done = wait(&ws);
    if (done < 0) break;
    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    if (code == 0) continue;
    if (first != 0) continue;  // (stopped by us, or failing in its turn: the first says why)
    std::fprintf(stderr, "minincl-perf: a rank process (pid %d) ended with status %d; stopping the others\n",
                 static_cast<int>(done), code);
    for (pid_t p : pids) {
      if (p != done) kill(p, SIGTERM);
    }
    first = code;
  }
  return first;
}

}  // namespace perf
