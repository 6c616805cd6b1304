// Writing a new generation of a Store: shard files through ShardSinks, then
// one Commit that makes the generation current (docs/store_format.md, "Commit").
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ptc/base/checksum.h"
#include "ptc/base/env.h"
#include "ptc/base/mutex.h"
#include "ptc/base/status.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"
#include "ptc/store/manifest.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/store.h"

namespace ptc {

// Writes one new shard file's bytes sequentially, computing the checksums
// (xxh64 and CRC-32 per block).
// Used by one thread at a time.
class ShardSink {
 public:
  ~ShardSink();
  // \error InvalidArgument when more than nbytes would be written; IOError from the Env.
  Status Append(const void* data, size_t n);
  // The bytes to be appended are those of `source`, in order, each checked
  // against its checksums as it was read (a verbatim copy of a shard with the
  // same tensor, boxes and dtype): the record takes its checksums and Append
  // does not hash again (only the block CRC-32s, when `source` has none).
  // Before the first Append.
  // \error FailedPrecondition when bytes were appended already or the sizes differ.
  Status AdoptChecksums(const ShardRecord& source);
  // Checks that exactly nbytes were written, closes the file (made durable by Commit; its
  // writeback starts now), and returns the record (to pass to GenerationWriter::AddShard).
  // \error FailedPrecondition when fewer bytes were written or Finish was called before.
  Result<ShardRecord> Finish();

 private:
  friend class GenerationWriter;
  // Where a copy of the shard's bytes goes (a rank file holding a copy).
  struct CopyTarget {
    std::string abs_path;
    std::unique_ptr<WritableFile> file;
    uint64_t offset = 0;
  };
  ShardSink(std::string abs_path, ShardRecord record, std::unique_ptr<WritableFile> file,
            std::vector<CopyTarget> copies);
  std::string abs_path_;
  ShardRecord record_;  // offset/nbytes/file set; checksum on Finish
  std::unique_ptr<WritableFile> file_;  // null: the bytes are in place already (NewShardIn)
  std::vector<CopyTarget> copies_;  // each Append is written to each of them too
  ShardHasher hash_;
  std::optional<ShardDigest> adopted_;  // AdoptChecksums: no hashing
  BlockCrcs adopted_crcs_;              // AdoptChecksums of a source without block CRC-32s
  uint64_t written_ = 0;
  bool finished_ = false;
};

// Builds one new generation. Thread-safe: NewShard and AddShard may be called
// concurrently; Commit once, after all of them.
class GenerationWriter {
 public:
  ~GenerationWriter();  // not committed: removes the generation directory (best effort)

  uint64_t generation() const { return generation_; }

  // Creates gen-NNNNNN/worker-WW/<sanitised tensor>.s<k>.h5 (k unique per file
  // stem and worker within this generation) with its dataset allocated, and
  // returns a sink for the shard's bytes.
  // \error InvalidArgument when worker < 0 or the boxes differ in rank.
  // \error IOError (or injected) when the file cannot be created or opened.
  Result<std::unique_ptr<ShardSink>> NewShard(const std::string& tensor, DType dtype, std::vector<Box> boxes,
                                              int worker);

  // Places shards in rank files (rank_files.h): from now on NewShard of a
  // (tensor, boxes, worker) that `files` place writes its bytes into that
  // file at its offset (created on first use: its literal bytes, zeros up to its
  // size) and describes them in an HDF5 file of external storage
  // (ShardRecord::h5). Other shards go to HDF5 files as before. A file's
  // `copies`: the bytes of those pieces, as their sinks append them, are
  // written there too, and Commit lists the copies of every piece this
  // generation wrote (GenerationManifest::rank_file_copies). Before any NewShard.
  void SetRankFiles(std::vector<RankFileSpec> files) EXCLUDES(mu_);

  // Links `src` (an absolute path on the store's file system: a rank file a
  // save staged) into the generation as gen-NNNNNN/worker-WW/`name`, copying
  // no byte: NewShardIn then places shards in it. `src` keeps its name; the
  // link goes with the generation's directory when it is not committed.
  // \error InvalidArgument for a name that is no file name or is taken; as
  //        Env::Link (EXDEV, EPERM: the caller may write the shards instead).
  Status AdoptFile(const std::string& src, int worker, const std::string& name) EXCLUDES(mu_);

  // A shard whose bytes already lie at `offset` in the file `name` adopted
  // for `worker`: the sink writes nothing and checksums what is appended (the
  // caller reads those very bytes); the record points into the file, and an
  // HDF5 file of external storage describes them there (ShardRecord::h5).
  // \error FailedPrecondition when `name` was not adopted; InvalidArgument
  //        when the shard does not fit in the file; as NewShard.
  Result<std::unique_ptr<ShardSink>> NewShardIn(const std::string& tensor, DType dtype, std::vector<Box> boxes,
                                                int worker, const std::string& name, uint64_t offset);

  // Adds a finished shard, or a shard of an older generation (its file stays where it is).
  void AddShard(ShardRecord record);

  // The shards added so far: all of them, and those whose files this
  // generation wrote.
  std::vector<ShardRecord> Shards() const;
  std::vector<ShardRecord> Written() const;

  // Makes the generation current: validates the manifest (meta with the added
  // shards; meta.shards, meta.generation and meta.parent are replaced;
  // meta.rank_file_copies keeps the copies whose piece is the very record the
  // current generation has (a commit of the same pieces: a dataset advance),
  // and gains those this writer wrote, SetRankFiles), syncs the
  // shard directories, writes gen-NNNNNN/manifest.json atomically, then renames
  // the root manifest.json into place. Before that rename any failure returns the
  // error, leaves the previous generation current and removes the partial
  // directory (best effort; BeginGeneration removes what remains).
  // \error InvalidArgument when the manifest does not validate (message names the tensor/shard).
  // \error NotFound when a shard's file does not exist.
  // After a failed Commit the writer is spent (its directory is removed): destroy
  // it and call BeginGeneration again.
  // \error FailedPrecondition when already committed or after a failed Commit.
  // \error IOError (or injected) from the Env. If only the final fsync of the root
  //        directory fails, the rename has happened: the new generation is current,
  //        and the error says "committed but not durable".
  Status Commit(GenerationManifest meta);

 private:
  friend class Store;
  GenerationWriter(Store* store, uint64_t generation);
  // A shard's record (no checksums yet) and the absolute path of the file
  // its bytes go to: a new HDF5 file; or, described by one, a rank file
  // (rank_files_), or `in` (file name, offset) of an adopted file.
  Result<std::string> PrepareShardFile(const std::string& tensor, DType dtype, const std::vector<Box>& boxes,
                                       int worker, ShardRecord& record,
                                       std::optional<std::pair<std::string, uint64_t>> in = std::nullopt);
  // gen-NNNNNN/worker-WW, made unless it was. EXCLUDES(mu_)
  Result<std::string> WorkerDir(int worker) EXCLUDES(mu_);
  // The copies of a new shard's bytes rank_files_ want: (absolute path, offset)
  // each, their files made. REQUIRES: the worker directory exists.
  Result<std::vector<std::pair<std::string, uint64_t>>> PrepareCopies(const ShardRecord& record) EXCLUDES(mu_);
  // meta's copies kept (see Commit) and those this writer wrote.
  std::vector<RankFileCopies> CopiesToCommit(const GenerationManifest& meta) const EXCLUDES(mu_);
  // Where rank_files_ place a shard: (file index, offset), or nullopt.
  std::optional<std::pair<size_t, uint64_t>> PlacementOf(const std::string& tensor, const std::vector<Box>& boxes,
                                                         int worker) const EXCLUDES(mu_);
  // Creates rank file `index` (literals, zeros) unless done already.
  // REQUIRES: its worker directory exists.
  Status EnsureRankFile(size_t index) EXCLUDES(mu_);
  Status WriteGeneration(std::string_view manifest_text);
  Status SwitchRoot();

  Store* const store_;
  const uint64_t generation_;
  const std::string dir_;  // "gen-NNNNNN", relative
  mutable Mutex mu_;
  std::vector<ShardRecord> shards_ GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, int> counters_ GUARDED_BY(mu_);  // (stem, worker) -> next k
  std::set<int> workers_ GUARDED_BY(mu_);                                // worker dirs created
  std::set<std::pair<int, std::string>> adopted_ GUARDED_BY(mu_);        // (worker, file name) AdoptFile linked
  std::vector<RankFileSpec> rank_files_ GUARDED_BY(mu_);
  std::map<std::tuple<int, std::string, std::vector<Box>>, std::pair<size_t, uint64_t>> placements_ GUARDED_BY(mu_);
  // (worker, tensor, boxes) -> (rank file index, offset) of each copy
  std::map<std::tuple<int, std::string, std::vector<Box>>, std::vector<std::pair<size_t, uint64_t>>> copies_
      GUARDED_BY(mu_);
  std::vector<bool> rank_file_made_ GUARDED_BY(mu_);
  bool committed_ = false;
  bool aborted_ = false;  // a Commit failed: the directory is gone
};

}  // namespace ptc
