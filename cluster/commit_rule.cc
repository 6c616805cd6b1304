#include "cluster/commit_rule.h"

#include <algorithm>

namespace ptc::cluster {

FinishDecision DecideFinish(const Change& change, int self, const FinishRound& round) {
  const bool complete = std::all_of(change.workers.begin(), change.workers.end(),
                                    [&](int w) { return round.parts.count(w) > 0; });
  if (round.committed_generation == change.generation) {
    // Parts stay until the next commit: read again when the last one came
    // after this round read them. Without this worker's own part the
    // generation is another change's (ours was aborted, its parts removed,
    // while this worker could not reach the store).
    if (!complete) return {round.parts.count(self) ? FinishAction::kLookAgain : FinishAction::kAborted, ""};
    return {round.digest_matches ? FinishAction::kDone : FinishAction::kCorrupt, ""};
  }
  // A commit removes the change and sets the committed state at once: a
  // change gone without its generation committed was aborted.
  if (!round.change_stands) return {FinishAction::kAborted, ""};
  if (complete) {
    if (round.settle_error) return {FinishAction::kAbort, *round.settle_error};
    return {FinishAction::kCommit, ""};
  }
  for (int w : change.workers) {
    if (!std::binary_search(round.members.begin(), round.members.end(), w)) {
      return {FinishAction::kAbort, "worker " + std::to_string(w) + " left the job (its lease expired)"};
    }
  }
  if (round.past_deadline) {
    return {FinishAction::kAbort,
            "not every worker finished within " + std::to_string(round.timeout.count() / 1000) + " s"};
  }
  return {FinishAction::kWait, ""};
}

}  // namespace ptc::cluster
