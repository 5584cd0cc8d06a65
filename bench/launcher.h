// Starting the ranks: as threads of this process (mnclCommInitAll, one thread drives each
// communicator) or as processes (the parent takes a unique id, then fork/execs itself once
// per rank with the id, rank and size in the environment; each child joins with
// mnclCommInitRankDevice).
#pragma once

#include <functional>
#include <vector>

#include "minincl.h"
#include "options.h"

namespace perf {

// Runs one rank to the end; returns the rank's exit status (0: all good).
// A rank that gives up aborts its communicator (which frees it) and sets `comm` to null, so
// the launcher does not destroy it a second time.
using RankMain = std::function<int(mnclComm_t& comm, int rank, int nranks)>;

// Sets MININCL_ALGO / MININCL_PROTO / MININCL_NCHANNELS from -A / -P / -C.
void applyEnvironment(const Options& opt);

// True in a process started by runProcesses: it runs one rank of the group.
bool isRankProcess();

int runThreads(const Options& opt, const RankMain& rankMain);
// -t N -g: this thread drives all N communicators; a rank that gives up aborts every one and
// clears `comms`.
using AllRanksMain = std::function<int(std::vector<mnclComm_t>& comms)>;
int runOneThread(const Options& opt, const AllRanksMain& allRanks);
// In the parent: starts the ranks and waits for them. In a rank process: joins and runs.
int runProcesses(const Options& opt, char** argv, const RankMain& rankMain);

}  // namespace perf
