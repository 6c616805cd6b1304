// The background scrub of the files the kernel reads itself (FUSE
// passthrough, fs/passthrough.h). A byte that rots in a compacted rank file
// would be served silently: the kernel reads the backing file without the
// checksums the daemon checks on every block it serves. So the scrubber reads
// the served generation's stored pieces and their copies in rank files back,
// checks each 4 MiB block against the manifest's checksum (as `ptcfs verify`),
// after each generation served and then every `interval`, at most `rate`
// bytes a second. A file with a bad block is taken out of passthrough for good
// (IsBad: its next open is the daemon's, whose reads fail that block with EIO
// naming it) and named in .ptcfs/status ("passthrough"."scrub"."bad_files")
// and last_error. Only the worker's own files are read (a peer scrubs its own).
//
// Thread safety: all methods but Start may be called from any thread; the pass
// runs on the scrubber's own thread, which the destructor stops and joins.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "ptc/base/mutex.h"
#include "ptc/store/store.h"
#include "view/snapshot.h"

namespace ptcfs {

struct ScrubOptions {
  std::chrono::seconds interval{3600};  // between passes over an unchanged generation; 0: after each new one only
  uint64_t rate = uint64_t{256} << 20;  // bytes read a second, at most
  bool enabled = true;
};

class Scrubber {
 public:
  // `report` is told of each bad file (its message), from the scrubber's thread.
  // Nothing runs before Start.
  Scrubber(const ptc::Store* store, ScrubOptions options, std::function<void(const std::string&)> report);
  // Starts the thread (when enabled): in the process that serves, after the
  // daemon forked (a thread does not cross fork). Once.
  void Start();
  ~Scrubber() EXCLUDES(mu_);
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // `snap` is the generation served now: a pass over it starts soon (a pass
  // under way over an older one stops first).
  void Serve(std::shared_ptr<const Snapshot> snap) EXCLUDES(mu_);
  // Whether the file `path` (relative to the store) failed a check.
  bool IsBad(const std::string& path) const EXCLUDES(mu_);
  // {"interval_seconds", "rate", "passes", "bytes_checked", "last_pass", "running", "bad_files"}.
  nlohmann::json StatusJson() const EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  // One pass over `snap`'s local pieces and copies; false when stopped or replaced.
  bool Pass(const std::shared_ptr<const Snapshot>& snap) EXCLUDES(mu_);
  // Waits until `bytes` more may be read at the rate; false when told to stop or replaced.
  bool Throttle(uint64_t bytes, uint64_t generation) EXCLUDES(mu_);

  const ptc::Store* store_;
  const ScrubOptions options_;
  const std::function<void(const std::string&)> report_;
  mutable ptc::Mutex mu_;
  ptc::CondVar wake_{&mu_};
  bool stop_ GUARDED_BY(mu_) = false;
  std::shared_ptr<const Snapshot> serving_ GUARDED_BY(mu_);
  bool due_ GUARDED_BY(mu_) = false;  // a pass over serving_ is due
  std::set<std::string> bad_ GUARDED_BY(mu_);
  uint64_t passes_ GUARDED_BY(mu_) = 0;
  uint64_t bytes_checked_ GUARDED_BY(mu_) = 0;
  bool running_ GUARDED_BY(mu_) = false;
  std::string last_pass_ GUARDED_BY(mu_);  // when the last whole pass ended (UTC, ISO 8601)
  std::chrono::steady_clock::time_point window_start_ GUARDED_BY(mu_);
  uint64_t window_bytes_ GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts after the fields it reads
};

}  // namespace ptcfs
