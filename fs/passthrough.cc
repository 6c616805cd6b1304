#include "fs/passthrough.h"

#include <sys/ioctl.h>

#include <cerrno>
#include <fstream>

#include "fs/passthrough_abi.h"

namespace ptcfs {
namespace {

class FuseDevice : public BackingDevice {
 public:
  explicit FuseDevice(int fd) : fd_(fd) {}
  ptc::Result<int32_t> Open(int fd) override {
    fuse_abi::BackingMap map = {};
    map.fd = fd;
    const int id = ::ioctl(fd_, fuse_abi::kIocBackingOpen, &map);
    if (id > 0) return static_cast<int32_t>(id);
    const int err = id < 0 ? errno : EIO;
    if (err == EPERM) {
      return ptc::Status(ptc::Code::kPermissionDenied,
                         "FUSE_DEV_IOC_BACKING_OPEN: operation not permitted (needs CAP_SYS_ADMIN)");
    }
    return ptc::ErrnoError("FUSE_DEV_IOC_BACKING_OPEN", err);
  }
  void Close(int32_t id) override {
    uint32_t arg = static_cast<uint32_t>(id);
    (void)::ioctl(fd_, fuse_abi::kIocBackingClose, &arg);
  }

 private:
  const int fd_;
};

}  // namespace

std::unique_ptr<BackingDevice> FuseBackingDevice(int dev_fd) { return std::make_unique<FuseDevice>(dev_fd); }

bool MayRegisterBackingFiles() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const unsigned long long caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> 21) & 1;  // CAP_SYS_ADMIN
  }
  return false;
}

Passthrough::Passthrough(bool wanted) : wanted_(wanted) {
  ptc::MutexLock lock(&mu_);
  off_reason_ = wanted ? "not initialised yet" : "--passthrough off";
}

bool Passthrough::OnInit(uint64_t unique, bool kernel_offers) {
  ptc::MutexLock lock(&mu_);
  init_unique_ = unique;
  if (!wanted_) return false;
  if (!kernel_offers) {
    off_reason_ = "the kernel offers no FUSE passthrough (Linux >= 6.9 with CONFIG_FUSE_PASSTHROUGH)";
    return false;
  }
  if (!MayRegisterBackingFiles()) {
    off_reason_ = "registering backing files needs CAP_SYS_ADMIN (the daemon is not root)";
    return false;
  }
  enabled_ = true;
  off_reason_.clear();
  return true;
}

uint64_t Passthrough::init_unique() const {
  ptc::MutexLock lock(&mu_);
  return init_unique_;
}

bool Passthrough::init_enabled() const {
  ptc::MutexLock lock(&mu_);
  return enabled_;
}

void Passthrough::SetDevice(std::unique_ptr<BackingDevice> device) {
  ptc::MutexLock lock(&mu_);
  device_ = std::move(device);
}

bool Passthrough::enabled() const {
  ptc::MutexLock lock(&mu_);
  return enabled_ && device_ != nullptr;
}

std::string Passthrough::State() const {
  ptc::MutexLock lock(&mu_);
  if (enabled_ && device_ != nullptr) return "on";
  return "off: " + (off_reason_.empty() ? std::string("no device") : off_reason_);
}

ptc::Result<int32_t> Passthrough::Acquire(uint64_t ino, int fd) {
  ptc::MutexLock lock(&mu_);
  if (!enabled_ || device_ == nullptr) return ptc::FailedPreconditionError("passthrough is off");
  auto it = backings_.find(ino);
  if (it != backings_.end()) {
    it->second.refs++;
    return it->second.id;
  }
  ptc::Result<int32_t> id = device_->Open(fd);
  if (!id.ok()) {
    if (id.status().code() == ptc::Code::kPermissionDenied) {
      enabled_ = false;
      off_reason_ = id.status().message();
    }
    return id.status();
  }
  backings_[ino] = Backing{*id, 1};
  return *id;
}

void Passthrough::Release(uint64_t ino) {
  ptc::MutexLock lock(&mu_);
  auto it = backings_.find(ino);
  if (it == backings_.end()) return;
  if (--it->second.refs > 0) return;
  if (device_ != nullptr) device_->Close(it->second.id);
  backings_.erase(it);
}

size_t Passthrough::backed() const {
  ptc::MutexLock lock(&mu_);
  return backings_.size();
}

}  // namespace ptcfs
