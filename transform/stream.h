// Internal to the executor (execute.cc): one pass over a group of shards.
//
// A copy group is a set of target shards to write and the source shards their
// copies read, closed under sharing a source (a tensor's shards under a tp
// change, for instance). When every shard of a group stores its boxes in
// order of their first coordinate (row), the group is written in one sweep
// over global rows: for each band of rows, each source's rows are read once,
// in file order, and hashed (so every source is read whole, in order, and its
// checksum is checked from the same bytes that feed the copy: no second pass);
// each target's rows are assembled from them (or are the very bytes read, when
// a target's band equals a source's) and appended to the new shard, in order.
//
// A corrupt source fails its group with Corruption naming the shard; bytes
// already written from it are only in the uncommitted generation, which the
// caller then discards.
//
// Thread safety: StreamGroup for different groups may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ptc/store/generation_writer.h"
#include "ptc/store/store.h"
#include "transform/execute.h"
#include "transform/plan.h"

namespace ptc::transform::internal {

struct CopyGroup {
  std::vector<size_t> targets;  // indices into Plan::targets, ascending
  std::vector<size_t> sources;  // indices into the source manifest's shards, ascending
  uint64_t bytes = 0;           // target bytes
  bool streamable = false;      // StreamGroup can write it
};

// Copies of target t are plan.copies[first_copy[t] .. first_copy[t+1]).
std::vector<size_t> FirstCopies(const Plan& plan);

// The copy groups of the targets in `to_write`, largest first.
std::vector<CopyGroup> GroupTargets(const Plan& plan, const std::vector<size_t>& first_copy,
                                    const std::vector<size_t>& to_write, const GenerationManifest& source);

// The source shard target t is a verbatim copy of (one copy from a shard of
// the same tensor and boxes: the same bytes in the same order), or null.
// Its sink then takes that shard's checksums (ShardSink::AdoptChecksums):
// the reader checks every byte against them, so nothing is hashed twice.
const ShardRecord* VerbatimSource(const Plan& plan, const std::vector<size_t>& first_copy, size_t t,
                                  const GenerationManifest& source);

// An uninitialised buffer, grown on demand and reused (one per thread).
class Scratch {
 public:
  char* Get(size_t n);

 private:
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0;
};

// Writes every target of a streamable group into `writer` (AddShard).
// \error Corruption naming a source shard whose checksum fails or whose file is short.
// \error as GenerationWriter::NewShard, ShardSink and the Env.
Status StreamGroup(const CopyGroup& group, const Plan& plan, const std::vector<size_t>& first_copy, const Store& store,
                   const GenerationManifest& source, GenerationWriter* writer, const ExecuteOptions& options,
                   Scratch* scratch);

}  // namespace ptc::transform::internal
