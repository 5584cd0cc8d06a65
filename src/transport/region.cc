#include "region.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <random>

#include "../bootstrap/bootstrap.h"
#include "../core/error.h"
#include "../core/monitor.h"

namespace mncl {

namespace {
size_t alignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

RegionLayout::RegionLayout(int nranks, int nChannels, const dev::ProtoSizes& sizes)
    : nranks_(nranks), nChannels_(nChannels), sizes_(sizes) {
  ctrlBytes_ = alignUp(sizeof(RankCtrl), 4096);
  simpleOff_ = alignUp(sizeof(dev::ConnCtrl), 4096);
  llOff_ = simpleOff_ + alignUp((size_t)dev::kSteps * sizes.simpleSlotBytes, 4096);
  ll128Off_ = llOff_ + alignUp((size_t)dev::kSteps * sizes.llSlotLines * sizeof(dev::LLLine), 4096);
  connBytes_ = ll128Off_ + alignUp((size_t)dev::kSteps * sizes.ll128SlotLines * sizeof(dev::LL128Line), 4096);
}

dev::ConnFifo RegionLayout::conn(char* regionBase, int sender, int channel) const {
  return connAt(regionBase + ctrlBytes_ + ((size_t)sender * nChannels_ + channel) * connBytes_);
}

dev::ConnFifo RegionLayout::connAt(char* c) const {
  dev::ConnFifo f;
  f.ctrl = reinterpret_cast<dev::ConnCtrl*>(c);
  f.simple = c + simpleOff_;
  f.ll = reinterpret_cast<dev::LLLine*>(c + llOff_);
  f.ll128 = reinterpret_cast<dev::LL128Line*>(c + ll128Off_);
  return f;
}

// ---- local: anonymous memory, found by in-process peers through a registry ----

namespace {

class AnonMapping : public Mapping {
 public:
  explicit AnonMapping(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throwSystemError("mmap of " + std::to_string(bytes) + " bytes for connection buffers");
    base_ = static_cast<char*>(p);
    size_ = bytes;
  }
  ~AnonMapping() override { munmap(base_, size_); }
};

std::mutex registryMutex;
std::map<uint64_t, std::weak_ptr<Mapping>>& registry() {
  static std::map<uint64_t, std::weak_ptr<Mapping>> r;
  return r;
}
std::atomic<uint64_t> nextRegistryId{1};

}  // namespace

std::shared_ptr<Mapping> createLocalRegion(size_t bytes) { return std::make_shared<AnonMapping>(bytes); }

uint64_t registerRegion(const std::shared_ptr<Mapping>& m) {
  std::lock_guard<std::mutex> lock(registryMutex);
  // (Destroyed communicators' entries go here: nothing looks their ids up again, and each
  // one kept ~120 bytes for good.)
  std::erase_if(registry(), [](const auto& entry) { return entry.second.expired(); });
  uint64_t id = nextRegistryId++;
  registry()[id] = m;
  return id;
}

std::shared_ptr<Mapping> findRegion(uint64_t registryId) {
  std::lock_guard<std::mutex> lock(registryMutex);
  auto it = registry().find(registryId);
  if (it == registry().end()) return nullptr;
  auto m = it->second.lock();
  if (!m) registry().erase(it);
  return m;
}

// ---- shm: POSIX shared memory between processes of one host ----

namespace {

// A segment is unlinked once every peer has mapped it, so only a rank killed before that
// leaves one behind. Each new segment first removes such orphans: named by a process that is
// gone, and older than any init waits (10 minutes, or twice MININCL_BOOTSTRAP_TIMEOUT). (The
// age guards a live job in another PID namespace that shares /dev/shm, whose processes this
// one cannot see.)
void removeOrphanedSegments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  time_t now = time(nullptr), oldest = std::max<time_t>(600, 2 * (time_t)bootstrapTimeout());
  while (dirent* e = readdir(dir)) {
    int pid = 0;
    if (std::sscanf(e->d_name, "minincl-%d-", &pid) != 1 || pid <= 0 || pid == getpid()) continue;
    if (!processGone(pid)) continue;
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, 0) != 0 || now - st.st_mtime < oldest) continue;
    shm_unlink((std::string("/") + e->d_name).c_str());
  }
  closedir(dir);
}

}  // namespace

std::string ShmMapping::noRoomFor(size_t bytes, const char* what) {
  struct statvfs fs;
  std::string room = statvfs("/dev/shm", &fs) == 0
                         ? " (" + std::to_string((uint64_t)fs.f_bavail * fs.f_frsize >> 20) + " MiB free of " +
                               std::to_string((uint64_t)fs.f_blocks * fs.f_frsize >> 20) + ")"
                         : "";
  return "/dev/shm has no room for " + std::to_string(bytes) + " more bytes of " + what + room +
         ": give it more (a container's: docker run --shm-size=1g; Kubernetes: an emptyDir of medium Memory on "
         "/dev/shm)";
}

size_t ShmMapping::devShmBytes() {
  struct statvfs fs;
  return statvfs("/dev/shm", &fs) == 0 ? (size_t)fs.f_blocks * fs.f_frsize : 0;
}

size_t ShmMapping::devShmFreeBytes() {
  struct statvfs fs;
  return statvfs("/dev/shm", &fs) == 0 ? (size_t)fs.f_bavail * fs.f_frsize : SIZE_MAX;
}

std::shared_ptr<ShmMapping> ShmMapping::create(size_t bytes, const std::string& tag) {
  removeOrphanedSegments();
  auto m = std::shared_ptr<ShmMapping>(new ShmMapping());
  std::random_device rd;
  m->name_ = "/minincl-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(rd());
  int fd = shm_open(m->name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throwSystemError("shm_open(" + m->name_ + ") in /dev/shm");
  m->owner_ = true;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    close(fd);
    throwSystemError("ftruncate of shared memory " + m->name_ + " to " + std::to_string(bytes) +
                     " bytes (is /dev/shm large enough?)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throwSystemError("mmap of shared memory " + m->name_);
  m->base_ = static_cast<char*>(p);
  m->size_ = bytes;
  return m;
}

std::shared_ptr<ShmMapping> ShmMapping::open(const std::string& name, size_t bytes, const std::string& whose) {
  auto m = std::shared_ptr<ShmMapping>(new ShmMapping());
  m->name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  // (Gone: its owner unlinked it as it failed; refused: a segment is its creator's user's alone.)
  MNCL_CHECK(fd >= 0 || errno != ENOENT, mnclRemoteError,
             whose + " in /dev/shm (" + name + ") is gone: that rank failed or exited during init (its own error says why)");
  MNCL_CHECK(fd >= 0 || errno != EACCES, mnclSystemError,
             "shm_open(" + name + ") of " + whose +
                 ": permission denied. The ranks of one host must run as one user (or set MININCL_TRANSPORT=net)");
  if (fd < 0) throwSystemError("shm_open(" + name + ") of " + whose);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throwSystemError("mmap of a peer's shared memory " + name);
  m->base_ = static_cast<char*>(p);
  m->size_ = bytes;
  return m;
}

void ShmMapping::unlink() {
  if (owner_ && !unlinked_) shm_unlink(name_.c_str());
  unlinked_ = true;
}

ShmMapping::~ShmMapping() {
  unlink();
  if (base_) munmap(base_, size_);
}

}  // namespace mncl
