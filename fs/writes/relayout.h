// A change of layout (docs/design.md, "A reconfigure, step by step"): the
// request checked into a layout and data position, served at once over the
// current generation's pieces, then written in the background. Alone
// (LocalChange) this worker writes the whole store and then compacts it when
// the policy says so (CompactionWrite); in a job it writes its own part (the
// participants' pieces read, the last resort's where none holds a region)
// and commits it with the job's change.
//
// Thread safety: Run from one thread; the rewrite it starts runs on the
// context's background thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "fs/participant.h"
#include "fs/writes/write_context.h"
#include "view/snapshot.h"

namespace ptcfs {

struct ChangeSource;  // what a change of the job reads (relayout.cc)

class RelayoutWrite {
 public:
  // `request`: as ParseRelayoutRequest takes it; `current`: the snapshot served now.
  RelayoutWrite(WriteContext& ctx, std::string request, std::shared_ptr<const Snapshot> current)
      : ctx_(ctx), request_(std::move(request)), current_(std::move(current)) {}

  // Checks the request (a mount alone serves a worker of its config), serves
  // the new layout over the current generation, takes the writer role and
  // starts the rewrite (state "repartitioning"; then "serving", or "failed"
  // with last_error; in a job the layout served before is served again and
  // change->Failed is called). In a job, an error here calls change->Failed
  // and leaves the state "failed" (unless a writer holds the role).
  // \error InvalidArgument naming what is wrong (also kept as last_error);
  //        FailedPrecondition while a writer holds the role.
  ptc::Status Run(std::shared_ptr<AgreedChange> change);

 private:
  ptc::Status Start(std::shared_ptr<AgreedChange> change);
  // On the background thread: writes and commits `layout` (from `src`, or
  // the store's current generation alone), serves it, removes what it
  // replaced and, alone, compacts it when due.
  void Rewrite(const ptc::ModelLayout& layout, std::optional<ptc::DatasetState> dataset,
               std::shared_ptr<AgreedChange> change, std::optional<ChangeSource> src);
  ptc::Result<std::shared_ptr<const Snapshot>> Write(const ptc::ModelLayout& layout,
                                                     const std::optional<ptc::DatasetState>& dataset,
                                                     AgreedChange& change, std::optional<ChangeSource>& src);

  WriteContext& ctx_;
  std::string request_;
  std::shared_ptr<const Snapshot> current_;
};

}  // namespace ptcfs
