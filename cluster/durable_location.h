// Where a job's durable tier is (docs/cluster.md, "Durable tier"), as
// --durable names it: a directory every worker sees (the local Env), or
// s3://BUCKET/PREFIX, a bucket's prefix through an S3Env (cluster/s3/:
// endpoint, region and credentials from the environment, s3_config.h).
//
// Thread safety: a plain value; its Env is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ptc/base/env.h"
#include "ptc/base/status.h"

namespace ptc::cluster {

struct DurableLocation {
  std::string name;          // as shown: the absolute DIR, or s3://BUCKET/PREFIX; empty: no tier
  std::shared_ptr<Env> env;  // the bucket's; null: the local Env
  std::string dir;           // the tier's path in env: DIR, or PREFIX
  Env* get() const { return env ? env.get() : Env::Default(); }
  bool empty() const { return name.empty(); }
};

// `spec`: a directory (made absolute; created when `create`) or s3://BUCKET/PREFIX.
// \error InvalidArgument for a malformed url or missing credentials (as
//        LoadS3Config); as Env::CreateDirs for a directory.
Result<DurableLocation> OpenDurableLocation(std::string_view spec, bool create = true);

}  // namespace ptc::cluster
