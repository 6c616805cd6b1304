#include "fs/writes/mount_status.h"

namespace ptcfs {

const char* MountStateName(MountState state) {
  switch (state) {
    case MountState::kServing:
      return "serving";
    case MountState::kProposed:
      return "proposed";
    case MountState::kRepartitioning:
      return "repartitioning";
    case MountState::kSaving:
      return "saving";
    case MountState::kRejoining:
      return "rejoining";
    case MountState::kFailed:
      return "failed";
  }
  return "unknown";
}

const char* CompactionStateName(CompactionState state) {
  switch (state) {
    case CompactionState::kNone:
      return "none";
    case CompactionState::kRunning:
      return "running";
    case CompactionState::kDone:
      return "done";
    case CompactionState::kCancelled:
      return "cancelled";
    case CompactionState::kFailed:
      return "failed";
  }
  return "unknown";
}

void MountStatus::SetLastError(const std::string& error) {
  if (error.size() <= kMaxLastError) {
    last_error = error;
    return;
  }
  last_error = error.substr(0, kMaxLastError) + "... (" + std::to_string(error.size() - kMaxLastError) + " bytes cut)";
}

void MountStatus::Resolve(const std::string& why) {
  if (state != MountState::kFailed) return;
  state = MountState::kServing;
  earlier_error = last_error + " (resolved: " + why + ")";
  if (earlier_error.size() > kMaxLastError) earlier_error = earlier_error.substr(0, kMaxLastError) + "...";
  last_error.clear();
}

}  // namespace ptcfs
