// Reading regions of global tensors out of one committed generation.
//
// Each part of a requested region is taken from exactly one stored copy:
// copies on the preferred worker first, then the others in manifest order.
// With verification on, a shard's checksum is checked the first time any of
// its bytes are used, so corrupt data never reaches a caller.
//
// Thread safety: Read may be called from several threads at once.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ptc/base/mutex.h"
#include "ptc/store/store.h"

namespace ptc {

class GenerationReader {
 public:
  // `store` must outlive the reader; the manifest is shared, so a reader keeps
  // serving its generation after the store moves on.
  GenerationReader(const Store& store, std::shared_ptr<const GenerationManifest> manifest, bool verify);

  const GenerationManifest& manifest() const { return *manifest_; }

  // Copies `region` of global tensor `tensor` into `dst` (laid out as
  // dst_layout over dst_box).
  // \error NotFound naming the tensor and the part of the region no stored copy holds.
  // \error Corruption naming the shard when its checksum fails (verify on).
  // \error IOError / NotFound from the Env, naming the file.
  Status Read(const std::string& tensor, const Box& region, void* dst, const Box& dst_box, const Layout& dst_layout,
              int prefer_worker = -1) const;

  // Calls fn(shard, stored_box, data_offset_of_that_box_in_file, part) for
  // parts that tile `region`, each taken from one stored copy (the preferred
  // worker's first, copies the Env says are unreachable last). The mapping
  // without the reading, for callers that serve bytes straight from the files.
  // \error NotFound as Read; errors of fn are returned as they are.
  using PartFn = std::function<Status(const ShardRecord&, const Box&, uint64_t, const Box&)>;
  Status Cover(const std::string& tensor, const Box& region, int prefer_worker, const PartFn& fn) const;

  // The open file of a shard, its checksum verified first when verify is on.
  // The pointer stays valid as long as the reader.
  // \error Corruption naming the shard; NotFound / IOError from the Env.
  Result<const RandomAccessFile*> File(const ShardRecord& shard) const;

  // Copies `region` out of one given shard of this generation.
  // REQUIRES: region lies inside one box of `shard`.
  // \error as Read.
  Status ReadShard(const ShardRecord& shard, const Box& region, void* dst, const Box& dst_box,
                   const Layout& dst_layout) const;

 private:
  const Store& store_;
  std::shared_ptr<const GenerationManifest> manifest_;
  const bool verify_;
  std::map<std::string, std::vector<const ShardRecord*>> by_tensor_;
  std::map<std::string, size_t> dtype_size_;
  // Guards the two caches only: never held across file I/O (an open or a
  // verification of one shard must not hold up reads of the others).
  mutable Mutex mu_;
  mutable std::map<std::string, std::unique_ptr<RandomAccessFile>> files_ GUARDED_BY(mu_);
  mutable std::map<const ShardRecord*, Status> verified_ GUARDED_BY(mu_);
};

}  // namespace ptc
