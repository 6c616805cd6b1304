// What a request to change the mounted layout says (.ptcfs/config,
// docs/mount_format.md): the config text itself, or
// {"config": "tp=4,pp=1", "step": S, "epoch": E} (step and epoch optional).
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ptc/base/status.h"
#include "ptc/model/config.h"

namespace ptcfs {

struct RelayoutRequest {
  ptc::ParallelConfig config;
  std::optional<uint64_t> step, epoch;
};

// `raw` as written (trailing newlines, spaces and NULs dropped).
// \error InvalidArgument naming the field at fault (unknown, given twice, not
//        an unsigned integer; an epoch without a step), or as ParseConfig.
ptc::Result<RelayoutRequest> ParseRelayoutRequest(const std::string& raw);

}  // namespace ptcfs
