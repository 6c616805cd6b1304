// The writer lock: flock(2) on STORE/lock, a description of the holder in it.
#include "ptc/store/store_lock.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <list>

#include "ptc/base/mutex.h"
#include "ptc/base/regular_file.h"
#include "ptc/base/utc_time.h"
#include "ptc/store/store_layout.h"

namespace ptc {
namespace {

// The locks this process holds. `tail` is the description after the pid, kept
// so that a forked child can rewrite it without allocating.
struct Held {
  std::string key;
  int fd;
  std::string tail;
  bool follow_fork;
};

Mutex registry_mu;
std::list<Held>& Registry() REQUIRES(registry_mu) {
  static auto* held = new std::list<Held>;
  return *held;
}

// "pid N" + tail, written over the whole file. Async-signal-safe: runs in a forked child.
void WriteDescription(int fd, pid_t pid, const std::string& tail) {
  char digits[24];
  int n = 0;
  char rev[24];
  unsigned long v = static_cast<unsigned long>(pid);
  do {
    rev[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 20);
  for (int i = 0; i < n; ++i) digits[i] = rev[n - 1 - i];
  if (ftruncate(fd, 0) != 0) return;
  ssize_t w = pwrite(fd, "pid ", 4, 0);
  w = w == 4 ? pwrite(fd, digits, static_cast<size_t>(n), 4) : -1;
  if (w == n) (void)pwrite(fd, tail.data(), tail.size(), 4 + n);
}

void AfterForkInChild() NO_THREAD_SAFETY_ANALYSIS {
  // The only thread of the child: the registry cannot change under us.
  for (const Held& h : Registry()) {
    if (h.follow_fork) WriteDescription(h.fd, getpid(), h.tail);
  }
}

std::string CommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  return raw.empty() ? "unknown command" : raw;
}

std::string Host() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown host";
  return buf;
}

// Opens STORE/lock, made new (O_EXCL) when absent. Never through a link
// (O_NOFOLLOW), never a FIFO or device (O_NONBLOCK, then fstat), never a file
// with another name elsewhere (a hard link): the holder writes its line into
// this file and truncates it on release.
Result<int> OpenLockFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP)
      return FailedPreconditionError(path + ": a symbolic link; the writer lock is never taken through a link "
                                            "(remove it: ptcfs makes the lock file itself)");
    return ErrnoError(path, errno);
  }
  struct stat st;
  const char* wrong = nullptr;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError(path + ": stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    wrong = "not a regular file";
  } else if (st.st_nlink != 1) {
    wrong = "a file with another name too (a hard link)";
  }
  if (wrong != nullptr) {
    close(fd);
    return FailedPreconditionError(path + ": " + wrong + "; the writer lock is taken only on a regular file of the "
                                   "store's own (remove it: ptcfs makes the lock file itself)");
  }
  return fd;
}

std::string Key(const std::string& root) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(root), ec);
  return ec ? root : p.string();
}

}  // namespace

Result<StoreLock> StoreLock::Acquire(const std::string& root, const StoreLockOptions& options) {
  static const bool registered = pthread_atfork(nullptr, nullptr, AfterForkInChild) == 0;
  (void)registered;
  struct stat st;
  if (stat(root.c_str(), &st) != 0) {
    if (errno == ENOENT && !options.create_dir)
      return NotFoundError(root + ": no ptcfs store here (no such directory)");
    if (errno != ENOENT) return ErrnoError(root, errno);
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) return ErrnoError(root + ": creating the store directory", ec.value());
  } else if (!S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(root + ": not a directory");
  }
  if (!options.create_dir && access((root + "/" + std::string(kManifestName)).c_str(), F_OK) != 0) {
    // No lock file is left in a directory that is not a store.
    return NotFoundError(root + "/" + std::string(kManifestName) + ": no ptcfs store here");
  }
  StoreLock lock;
  lock.key_ = Key(root);
  if (HeldByThisProcess(root)) return FailedPreconditionError(root + ": this process already holds the writer lock");
  const std::string path = root + "/" + kStoreLockName;
  PTC_ASSIGN_OR_RETURN(const int fd, OpenLockFile(path));
  int rc;
  do {
    rc = flock(fd, LOCK_EX | (options.wait ? 0 : LOCK_NB));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    close(fd);  // never held: the holder's description stays as it is
    if (err != EWOULDBLOCK) return ErrnoError(path + ": flock", err);
    Result<std::string> holder = ReadHolder(root);
    std::string who = holder.ok() && !holder->empty() ? *holder : "another process (it has not described itself yet)";
    return FailedPreconditionError(root + ": locked by " + who);
  }
  lock.fd_ = fd;
  const std::string holder = options.holder.empty() ? CommandLine() : options.holder;
  std::string tail = " (" + holder + ", host " + Host() + ", since " + UtcNowText() + ")\n";
  WriteDescription(lock.fd_, getpid(), tail);
  MutexLock l(&registry_mu);
  Registry().push_back({lock.key_, lock.fd_, std::move(tail), options.follow_fork});
  return lock;
}

bool StoreLock::HeldByThisProcess(const std::string& root) {
  const std::string key = Key(root);
  MutexLock l(&registry_mu);
  for (const Held& h : Registry()) {
    if (h.key == key) return true;
  }
  return false;
}

Result<std::string> StoreLock::ReadHolder(const std::string& root) {
  const std::string path = root + "/" + kStoreLockName;
  Result<std::string> text = ReadRegularFile(path, 1 << 20);  // a FIFO planted there is refused, not waited on
  if (text.status().code() == Code::kNotFound) return NotFoundError(path + ": no lock file");
  PTC_RETURN_IF_ERROR(text.status());
  return text->substr(0, text->find('\n'));
}

StoreLock::StoreLock(StoreLock&& other) noexcept : fd_(other.fd_), key_(std::move(other.key_)) { other.fd_ = -1; }

StoreLock& StoreLock::operator=(StoreLock&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = other.fd_;
    key_ = std::move(other.key_);
    other.fd_ = -1;
  }
  return *this;
}

StoreLock::~StoreLock() { Release(); }

void StoreLock::Release() {
  if (fd_ < 0) return;
  {
    MutexLock l(&registry_mu);
    Registry().remove_if([this](const Held& h) { return h.fd == fd_; });
  }
  (void)ftruncate(fd_, 0);  // still held: nobody reads a half-cleared description
  close(fd_);               // releases the flock
  fd_ = -1;
}

}  // namespace ptc
