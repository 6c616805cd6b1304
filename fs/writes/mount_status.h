// What .ptcfs/status says of a mount's writes (docs/mount_format.md): its
// state, its last error and its background compaction. A value: the
// WriteContext keeps one under its lock.
//
// Thread safety: none (a plain value).
#pragma once

#include <cstddef>
#include <string>

#include "transform/covering.h"

namespace ptcfs {

// What the mount is doing (.ptcfs/status "state", docs/mount_format.md).
enum class MountState {
  kServing,         // serving its generation, nothing under way
  kProposed,        // a request went to the job; this worker has not applied it yet
  kRepartitioning,  // a change of layout is being written (served at once from the old shards)
  kSaving,          // a save through megatron/ is being committed
  kRejoining,       // a cluster worker brings its store to the job's generation
  kFailed,          // the last change or save failed (last_error says why); serving as before
};
// "serving", "proposed", "repartitioning", "saving", "rejoining", "failed".
const char* MountStateName(MountState state);

// The background compaction (.ptcfs/status "compaction" "state").
enum class CompactionState {
  kNone,       // none ran yet
  kRunning,    // writing (the mount serves meanwhile)
  kDone,       // committed
  kCancelled,  // a writer took the role, or the job aborted it: nothing committed
  kFailed,     // failed here (last_error says why): nothing committed
};
// "none", "running", "done", "cancelled", "failed".
const char* CompactionStateName(CompactionState state);

struct MountStatus {
  // The most bytes of last_error kept; longer ones end in "... (N bytes cut)".
  static constexpr size_t kMaxLastError = 4096;

  MountState state = MountState::kServing;
  std::string last_error;
  std::string earlier_error;  // a failure a later event resolved (Recovered)
  // The background compaction: its state, why the last one was cancelled or
  // failed, the served generation's fragmentation when last measured.
  CompactionState compaction = CompactionState::kNone;
  std::string compaction_why;
  ptc::transform::Fragmentation fragmentation;

  // A rewrite, save or adopted generation holds the store's writer role.
  bool writing() const {
    return state == MountState::kRepartitioning || state == MountState::kSaving || state == MountState::kRejoining;
  }
  // Keeps `error` as last_error, cut to kMaxLastError bytes.
  void SetLastError(const std::string& error);
  // A "failed" state ends (`why` it is over): serving, last_error moved to
  // earlier_error with `why` after it. Nothing in another state.
  void Resolve(const std::string& why);
};

}  // namespace ptcfs
