// The writer lock as the writing commands take it: named holder, --wait.
#include <cstdio>

#include "tools/commands.h"

namespace ptcfs {

ptc::StoreLockOptions WriterLockOptions(bool wait, bool create_dir) {
  ptc::StoreLockOptions o;
  o.wait = wait;
  o.create_dir = create_dir;
  return o;
}

ptc::Result<ptc::StoreLock> LockStore(const std::string& store, bool wait, bool create_dir) {
  ptc::Result<ptc::StoreLock> lock = ptc::StoreLock::Acquire(store, WriterLockOptions(false, create_dir));
  if (lock.ok() || lock.status().code() != ptc::Code::kFailedPrecondition) return lock;
  if (ptc::StoreLock::HeldByThisProcess(store)) return lock;
  if (!wait) {
    return ptc::FailedPreconditionError(lock.status().message() +
                                        "; one writer at a time: wait for it to finish, or pass --wait");
  }
  std::fprintf(stderr, "%s; waiting\n", lock.status().message().c_str());
  return ptc::StoreLock::Acquire(store, WriterLockOptions(true, create_dir));
}

void AddWaitFlag(CLI::App* sub, bool* wait) {
  sub->add_flag("--wait", *wait, "when another process writes the store (a mount, a transform), wait for it");
}

}  // namespace ptcfs
