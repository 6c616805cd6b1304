// What a PeerServer may serve: the data extents [offset, offset + nbytes) of
// the shard records of the generations it serves (the current one and those
// kept for readers). Nothing else of a store is reachable: not a manifest,
// not HDF5 metadata, not a file no served manifest names. Built once per set
// of served generations.
//
// Thread safety: immutable after construction; Check may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/store/manifest.h"

namespace ptc::cluster {

class ServedFiles {
 public:
  // The files of `manifests` (null entries are skipped); with worker >= 0
  // only the files of that worker's records (a cluster worker serves its own).
  explicit ServedFiles(const std::vector<std::shared_ptr<const GenerationManifest>>& manifests, int worker = -1);

  // The generations it was built from, in the order given.
  const std::vector<uint64_t>& generations() const { return generations_; }

  // Whether bytes [offset, offset + length) of `file` may be served. Looks at
  // the manifests only, never at the file system.
  // \error NotFound naming the file when no served manifest names it.
  // \error InvalidArgument when the range lies inside no shard record's data in it (or overflows).
  Status Check(std::string_view file, uint64_t offset, uint64_t length) const;

 private:
  std::vector<uint64_t> generations_;
  // file -> data extents [begin, end) of its shard records, sorted by begin, merged where they overlap.
  std::unordered_map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> extents_;
};

}  // namespace ptc::cluster
