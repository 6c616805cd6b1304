// The commit rule of a change (docs/cluster.md, "Reconfigure across
// workers"), as a pure function: given what one round of
// Coordinator::Finish read from the job's store, what this participant does
// next. Coordinator::Finish is the I/O loop around it.
//
// Thread safety: pure functions over values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/job_state.h"

namespace ptc::cluster {

// What one round of Finish read (after this worker published its part).
struct FinishRound {
  std::set<int> parts;         // the workers whose part of this change (its id) is published
  bool change_stands = false;  // the job's change key still holds this change
  uint64_t committed_generation = 0;
  // Whether the committed digest equals the digest of the referenced pieces
  // and every part read (only asked when the change's generation is committed).
  bool digest_matches = false;
  std::vector<int> members;  // the live workers, sorted
  bool past_deadline = false;
  std::chrono::milliseconds timeout{0};  // the change's deadline, for the reason an abort gives
  // Once every part is in: the error the settle of the parts into the new
  // generation's config gave (Coordinator::Finish's `settle`), which aborts
  // the change; nullopt when it settled (or parts are still to come).
  std::optional<std::string> settle_error;
};

enum class FinishAction {
  kDone,       // committed with these pieces: serve the generation
  kCorrupt,    // committed with other pieces than this worker has: refuse it
  kAborted,    // the change ended without a commit (aborted, withdrawn, or another change's generation committed)
  kCommit,     // every part is in and settled: commit (compare-and-swap), then look again
  kAbort,      // abort the change for `reason` (a worker left, the deadline, the settle's error)
  kLookAgain,  // read again at once (a commit came after this round read the parts)
  kWait,       // wait for the job's keys to change (or the poll interval), then look again
};

struct FinishDecision {
  FinishAction action = FinishAction::kWait;
  std::string reason;  // kAbort: why
  friend bool operator==(const FinishDecision&, const FinishDecision&) = default;
};

// What worker `self`, a participant of `change`, does after `round`.
FinishDecision DecideFinish(const Change& change, int self, const FinishRound& round);

}  // namespace ptc::cluster
