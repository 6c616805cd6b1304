// A Megatron save through megatron/ (legacy files, model_optim_rng.pt per
// rank; a torch_dist save is a DcpSaveWrite), committed with its data
// position as one generation in the current config with the save's tp and
// pp. Alone (LocalChange) the whole save is imported, its staged files
// becoming the pieces' files; in a job this worker writes the rank files
// staged on it into pieces of its own, and the parts of every worker settle
// into one generation (view/save_parts.h), committed everywhere or nowhere.
//
// Thread safety: Run with the writer role held.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fs/participant.h"
#include "fs/writes/write_context.h"
#include "view/snapshot.h"

namespace ptcfs {

class MegatronSaveWrite {
 public:
  // The save of `iteration` staged under `staging_root`, over `current`.
  MegatronSaveWrite(WriteContext& ctx, std::string staging_root, uint64_t iteration,
                    std::shared_ptr<const Snapshot> current)
      : ctx_(ctx), staging_root_(std::move(staging_root)), iteration_(iteration), current_(std::move(current)) {}

  // Writes the save (alone) or this worker's part (in a job, perhaps no
  // file), commits it with `change`, serves it and removes what it replaced.
  // \error InvalidArgument with zero=1 (Megatron's files do not hold ZeRO-1
  //        state), for a consumed_train_samples that is no position of the
  //        dataset or a state dict iteration other than the save's, in a job
  //        for a torch_dist save here; as OpenMegatronCheckpoint and
  //        ImportInto alone (a missing rank names it); in a job as
  //        OpenMegatronSavePart, change.BeforeSaveCommit and SettleSave.
  ptc::Status Run(AgreedChange& change);

 private:
  ptc::Status SaveWhole();
  ptc::Status SavePart(AgreedChange& change);

  WriteContext& ctx_;
  const std::string staging_root_;
  const uint64_t iteration_;
  const std::shared_ptr<const Snapshot> current_;
};

}  // namespace ptcfs
