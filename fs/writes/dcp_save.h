// A save in PyTorch DCP files committed as one generation in the current
// config, each chunk a stored piece (ptc/checkpoint/dcp/read.h): a dcp.save
// into dcp/ (torch's keys; the data position stays), or Megatron-Core's
// torch_dist save into megatron/ (its keys, with its common.pt's state,
// TorchDistState). Alone (LocalChange) the whole save is written; in a job
// each worker writes the chunk files written on it, and the parts settle
// into one generation (view/save_parts.h), committed everywhere or nowhere.
//
// Thread safety: Run with the writer role held.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "fs/participant.h"
#include "fs/writes/torch_dist.h"
#include "fs/writes/write_context.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "view/snapshot.h"

namespace ptcfs {

class DcpSaveWrite {
 public:
  // The save in `dir` (in the staging area), its keys as `keys` says, over
  // `current`. `state`: a torch_dist save's, as the proposer read it (in a
  // job published in its part: every worker commits it); null otherwise.
  // `names`: the registration order a torch_dist save of the distributed
  // optimizer is read in (the mount's --names).
  DcpSaveWrite(WriteContext& ctx, std::string dir, ptc::dcp::Keys keys, std::shared_ptr<const Snapshot> current,
               ptc::megatron::NameSet names, const TorchDistState* state = nullptr)
      : ctx_(ctx), dir_(std::move(dir)), keys_(keys), current_(std::move(current)), names_(names), state_(state) {}

  // Writes the save (alone) or this worker's part of it (in a job: the
  // chunk files in the directory, perhaps none; `metadata` the .metadata the
  // job agreed), commits it with `change`, serves it and removes what it
  // replaced. `committed` (when set) runs after the commit and before the
  // new generation is served.
  // \error InvalidArgument when the save holds no optimizer state and the
  //        store does (it would be lost); alone as OpenDcp (naming the key and
  //        chunk) and WriteDcp; in a job as OpenDcpPart,
  //        change.BeforeSaveCommit and SettleDcpSave (a chunk file on no
  //        worker or on two).
  ptc::Status Run(AgreedChange& change, const std::string& metadata, const std::function<void()>& committed);

 private:
  ptc::Status SaveWhole(const std::function<void()>& committed);
  ptc::Status SavePart(AgreedChange& change, const std::string& metadata, const std::function<void()>& committed);
  // The name a save into dcp/ was saved under (dcp/NAME shows the state
  // again); empty for a torch_dist save.
  std::string SaveName() const;

  WriteContext& ctx_;
  const std::string dir_;
  const ptc::dcp::Keys keys_;
  const std::shared_ptr<const Snapshot> current_;
  const ptc::megatron::NameSet names_;
  const TorchDistState* const state_;
};

}  // namespace ptcfs
