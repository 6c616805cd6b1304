// A generation that no change or save of this mount wrote, adopted (a
// cluster worker catching up with its job after it lost its membership,
// worker/rejoin.h): written by the caller as the store's only writer (state
// "rejoining"), then served in its own config as a commit is.
//
// Thread safety: Run from one thread at a time per context (the writer role
// refuses a second).
#pragma once

#include <functional>

#include "fs/writes/write_context.h"

namespace ptcfs {

class AdoptWrite {
 public:
  explicit AdoptWrite(WriteContext& ctx) : ctx_(ctx) {}

  // Runs `write`, which commits the generation, with the writer role, then
  // serves the store's current generation in its own config and removes the
  // generations it replaced that no open file reads. last_error stays as it
  // was when served (the caller's own, until it is done).
  // \error FailedPrecondition while a writer holds the role; as `write` (the
  //         generation served before stays); as SpecFromManifest,
  //         ConfigFromManifest, LoadDatasetState and Snapshot::Create.
  //         Each is kept as last_error too.
  ptc::Status Run(const std::function<ptc::Status(ptc::Store&)>& write);

 private:
  WriteContext& ctx_;
};

}  // namespace ptcfs
