// ptc::Mutex, MutexLock and CondVar: std::mutex with the clang thread-safety
// annotations (ptc/base/thread_annotations.h), after leveldb's port::Mutex and
// util/mutexlock.h, so that GUARDED_BY members and REQUIRES functions are
// checked by the compiler. Use these instead of std::mutex and its guards in
// every layer.
//
//   class Cache {
//    public:
//     void Put(int k, int v) EXCLUDES(mu_) {
//       ptc::MutexLock lock(&mu_);
//       map_[k] = v;
//     }
//    private:
//     ptc::Mutex mu_;
//     std::map<int, int> map_ GUARDED_BY(mu_);
//   };
//
// Thread safety: a Mutex is a lock; a MutexLock belongs to the thread that
// made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "ptc/base/thread_annotations.h"

namespace ptc {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Takes the lock if no one holds it; true when taken.
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the lock is held where it cannot see it taken; checks
  // nothing at run time (std::mutex cannot say who holds it).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// A condition variable over a Mutex (as leveldb's port::CondVar): Wait is
// called with the mutex held, releases it while waiting and holds it again
// when it returns (also on a spurious wake-up: wait in a loop). Not
// annotated: the analysis cannot tie the caller's mutex to this one.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // Wait, at most until `deadline`: false when it passed first.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();  // still held: the caller's
    return woken;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

// Holds `mu` from construction to the end of the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }

  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace ptc
