// The persistent store: a directory of immutable generations, each a manifest
// plus HDF5 shard files, and a root manifest naming the current one.
// docs/store_format.md describes the layout and the commit protocol.
//
//   STORE/manifest.json                     {"format":"ptcfs-store","version":1,"generation":7}
//   STORE/gen-000007/manifest.json          the GenerationManifest (manifest.h)
//   STORE/gen-000007/worker-00/<name>.s0.h5 one stored shard per HDF5 file
//
// A generation becomes current only when the root manifest.json is renamed
// into place; a failure at any earlier point leaves the previous generation
// current and its files untouched.
//
// The Env carries every byte ptcfs itself writes (manifests, tensor bytes,
// directories), but HDF5 creates the shard files' metadata through the OS
// (h5shard.h): a Store needs an Env backed by the real filesystem (Env::Default
// or a wrapper of it such as FaultInjectionEnv), not NewMemEnv.
//
// Thread safety: Store's const methods may be called from any thread. At most
// one GenerationWriter exists at a time; it must not outlive its Store.
// current() returns a reference that a Commit replaces: readers that run
// concurrently with a writer use CurrentSnapshot().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ptc/base/checksum.h"
#include "ptc/base/env.h"
#include "ptc/store/manifest.h"
#include "ptc/base/status.h"

namespace ptc {

class GenerationWriter;

class Store {
 public:
  // Creates a store at `root`, which must not exist or be an empty directory;
  // writes manifest.json with generation 0 (no generation yet).
  // \error AlreadyExists when `root` is a file or a non-empty directory.
  // \error IOError (or an injected error) when writing fails.
  static Result<std::unique_ptr<Store>> Create(Env* env, std::string root);

  // Opens the store at `root` and loads its current generation manifest.
  // \error NotFound when ROOT/manifest.json does not exist ("ROOT/manifest.json: ...").
  // \error Corruption when it is not a store manifest, or the generation it names is
  //        missing or its manifest is invalid (message names the file).
  static Result<std::unique_ptr<Store>> Open(Env* env, std::string root);

  ~Store();

  const std::string& root() const { return root_; }
  Env* env() const { return env_; }
  bool has_generation() const;
  // The current generation number; 0 when there is none.
  uint64_t current_generation() const;
  // REQUIRES: has_generation(). Valid until the next Commit through this Store.
  const GenerationManifest& current() const;
  // The current manifest, kept alive for as long as the caller holds it; null when none.
  std::shared_ptr<const GenerationManifest> CurrentSnapshot() const;

  // Reads and validates gen-NNNNNN/manifest.json.
  // \error NotFound when that generation does not exist.
  // \error Corruption when its manifest is invalid or names another generation.
  Result<GenerationManifest> LoadGeneration(uint64_t g) const;

  // ROOT/rel.
  std::string AbsPath(const std::string& rel) const;

  // Starts generation current+1, first removing any leftover uncommitted
  // gen-NNNNNN directories numbered above the current generation.
  // \error FailedPrecondition when another GenerationWriter is active.
  // \error IOError (or injected) when the directory cannot be prepared.
  Result<std::unique_ptr<GenerationWriter>> BeginGeneration();

  // Removes generation directories that are neither current nor in
  // `keep_generations`, and every shard file in any gen-* directory that no
  // current or kept manifest references (files in old generation directories
  // that the current manifest references stay). Leaves directories numbered
  // above the current generation alone.
  // \error FailedPrecondition when a GenerationWriter is active.
  // \error Corruption when a kept manifest cannot be read; IOError when removal fails.
  Status CollectGarbage(const std::set<uint64_t>& keep_generations = {});

  // "gen-000007".
  static std::string GenerationDirName(uint64_t g);

 private:
  friend class GenerationWriter;
  Store(Env* env, std::string root);
  void SetCurrent(std::shared_ptr<const GenerationManifest> m);
  void WriterDone();
  Status RemoveUncommitted();

  Env* const env_;
  const std::string root_;
  mutable std::mutex mu_;
  std::shared_ptr<const GenerationManifest> current_;  // GUARDED_BY(mu_); null: none
  bool writer_active_ = false;                         // GUARDED_BY(mu_)
};

// Writes one new shard file's bytes sequentially, computing the checksum.
// Used by one thread at a time.
class ShardSink {
 public:
  ~ShardSink();
  // \error InvalidArgument when more than nbytes would be written; IOError from the Env.
  Status Append(const void* data, size_t n);
  // Checks that exactly nbytes were written, closes the file (made durable by Commit; its
  // writeback starts now), and returns the record (to pass to GenerationWriter::AddShard).
  // \error FailedPrecondition when fewer bytes were written or Finish was called before.
  Result<ShardRecord> Finish();

 private:
  friend class GenerationWriter;
  ShardSink(std::string abs_path, ShardRecord record, std::unique_ptr<WritableFile> file);
  std::string abs_path_;
  ShardRecord record_;  // offset/nbytes/file set; checksum on Finish
  std::unique_ptr<WritableFile> file_;
  ShardHasher hash_;
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

  // Adds a finished shard, or a shard of an older generation (its file stays where it is).
  void AddShard(ShardRecord record);

  // Makes the generation current: validates the manifest (meta with the added
  // shards; meta.shards, meta.generation and meta.parent are replaced), syncs the
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
  Result<std::string> PrepareShardFile(const std::string& tensor, DType dtype, const std::vector<Box>& boxes,
                                       int worker, ShardRecord& record);
  Status WriteGeneration(std::string_view manifest_text);
  Status SwitchRoot();

  Store* const store_;
  const uint64_t generation_;
  const std::string dir_;  // "gen-NNNNNN", relative
  std::mutex mu_;
  std::vector<ShardRecord> shards_;                      // GUARDED_BY(mu_)
  std::map<std::pair<std::string, int>, int> counters_;  // GUARDED_BY(mu_): (stem, worker) -> next k
  std::set<int> workers_;                                // GUARDED_BY(mu_): worker dirs created
  bool committed_ = false;
  bool aborted_ = false;  // a Commit failed: the directory is gone
};

// Reads n bytes at `offset_in_shard` of a shard's data.
// \error InvalidArgument when the range leaves the shard.
// \error NotFound / IOError / Corruption from the Env (a short file), naming the file.
Status ReadShardBytes(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset_in_shard, size_t n,
                      void* dst);

// Reads one shard's bytes front to back from the start of a checksum block
// and checks each block as its last byte is read, so that a caller that
// consumes a shard in order (the transform executor) checks its checksums
// without reading it a second time. Used by one thread at a time.
class VerifyingShardReader {
 public:
  // Starts at block `block` (manifest.h: BlockBegin). `shard` must outlive the reader.
  // \error InvalidArgument when the shard has no such block; NotFound / IOError from the Env.
  static Result<std::unique_ptr<VerifyingShardReader>> Open(Env* env, const Store& store, const ShardRecord& shard,
                                                            size_t block = 0);
  ~VerifyingShardReader();

  const ShardRecord& shard() const { return shard_; }
  // Offset in the shard of the next byte to read.
  uint64_t position() const { return pos_; }

  // Reads the next n bytes of the shard into dst.
  // \error InvalidArgument when that goes past the shard's end.
  // \error Corruption naming the tensor, its boxes, the file (and the block) when a block
  //        completed by these bytes does not match its checksum, or the file is short;
  //        IOError from the Env.
  Status Read(size_t n, void* dst);
  // The next n bytes of the shard, checked as Read does, without copying them
  // where possible: a pointer into a read-only mapping of the file (a window of
  // a few MiB) when the Env's file has a descriptor, else `scratch` (at least n
  // bytes) filled by Read. Valid until the next call or the reader's end. A
  // mapped file that another process truncates meanwhile raises SIGBUS: shard
  // files are immutable.
  // \error as Read.
  Result<const char*> Next(size_t n, char* scratch);
  // Checks that the whole shard was read (every block was checked on the way).
  // \error Corruption naming the tensor, its boxes and the file when fewer than
  //        shard().nbytes bytes were read, or the empty shard's checksum differs.
  Status Finish();

 private:
  VerifyingShardReader(const ShardRecord& shard, std::unique_ptr<RandomAccessFile> file, size_t block);
  Status CheckRange(size_t n) const;
  Status Consume(const char* p, size_t n);
  Status EndBlock();
  bool MapWindow(size_t n);
  const ShardRecord& shard_;
  std::unique_ptr<RandomAccessFile> file_;
  Xxh64Stream hash_;  // of the current block
  size_t block_;
  uint64_t pos_;
  bool mappable_;                 // fd, large enough, file not short
  char* map_ = nullptr;           // mapping of file bytes [map_begin_, map_begin_ + map_len_)
  uint64_t map_begin_ = 0;
  size_t map_len_ = 0;
};

// Checks the checksum blocks that hold bytes [offset, offset + n) of the shard
// (all of them, and the shard's end, when the range is the whole shard).
// \error InvalidArgument when the range leaves the shard.
// \error Corruption naming the tensor, its boxes, the file and the block when a checksum
//        differs or the file is short; NotFound / IOError from the Env.
Status VerifyShardRange(Env* env, const Store& store, const ShardRecord& shard, uint64_t offset, uint64_t n);

// VerifyShardRange over the whole shard.
Status VerifyShard(Env* env, const Store& store, const ShardRecord& shard);

// VerifyShard for every shard of `m`, and CheckH5Shard when `check_hdf5`.
// \error the first failure, as VerifyShard / CheckH5Shard.
Status VerifyGeneration(const Store& store, const GenerationManifest& m, bool check_hdf5 = true);

// Keeps [A-Za-z0-9._-], replaces other bytes with '_', truncates to 200 chars.
std::string SanitizeFileName(std::string_view tensor);

}  // namespace ptc
