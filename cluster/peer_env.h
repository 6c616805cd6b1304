// The Env a cluster worker opens its store with (docs/cluster.md). A worker's
// store holds the job's manifests and only its own shard files; a shard file
// in another worker's directory (gen-NNNNNN/worker-WW/... with WW another
// worker) is read from that worker's PeerServer. So everything above the Env
// (the mount's readers, the executor's sweeps) reads a piece on another
// worker as it reads a local one, and the parts of a change a worker lacks
// are pulled by the executor that writes them.
//
// Remote reads fetch whole checksum blocks, checked against the record of
// the manifest that names the file as they arrive (PeerClient): a read that
// misses fetches its block and the next ones of the shard (up to
// span_blocks, one request), and the last spans fetched are kept (a small
// cache shared by the files), so that a reader verifying a block and then
// reading it in parts, or sweeping a shard in order, fetches it once.
//
// Spans in flight: a reader sweeping a shard in order (a read of an open
// file that starts where that file's previous read ended, as the executor's
// readers do) has the next span fetched
// ahead on a thread of the env (up to ahead_spans at once across the env),
// so that the next span's receive overlaps the reader's use of this one
// (the executor writing and hashing it). A read of a span in flight waits for
// it; two readers of one span fetch it once. A span fetched ahead that fails
// is dropped: the reader then fetches its block itself, and gets its error.
// Memory: at most (cached_spans + ahead_spans) spans are held by the cache,
// plus one per reader fetching a span that is not in it: span_blocks * 4 MiB
// each (16 MiB by default: 96 MiB kept, plus 16 MiB per reading thread).
//
// A file of the durable tier (the last source of a piece no live worker
// holds, durable.h) is named ROOT/.durable/REL and read from durable_dir
// (through durable_env: a bucket's S3Env, or the local Env).
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/peer_client.h"
#include "cluster/peer_protocol.h"
#include "ptc/base/env.h"
#include "ptc/base/mutex.h"
#include "ptc/store/manifest.h"

namespace ptc::cluster {

struct PeerEnvOptions {
  int self = 0;                     // this worker: its directories are local
  PeerClientOptions client;         // token, deadlines
  size_t span_blocks = 4;           // blocks fetched at once by a read that misses (4 MiB each)
  size_t cached_spans = 4;          // spans kept (their buffers are reused)
  size_t ahead_spans = 2;           // spans fetched ahead of sequential readers, at once (0: none)
  // The job's durable tier (durable.h): ROOT/.durable/REL is read as
  // durable_dir/REL through durable_env (null: the local Env). Empty: none.
  std::string durable_dir;
  std::shared_ptr<Env> durable_env;
};

class PeerEnv : public Env {
 public:
  // `local` (not owned) holds the store at `root`; other paths are local too.
  PeerEnv(Env* local, std::string root, PeerEnvOptions options);
  // Waits for the spans being fetched ahead and joins the env's threads.
  ~PeerEnv() override;

  // Where the workers serve (from membership). A worker not listed has no
  // reachable files (reads fail with IOError naming it).
  void SetPeers(std::map<int, PeerAddress> peers) EXCLUDES(mu_);
  // The manifests whose records say what a remote file holds (the served
  // generations; null entries are skipped); a remote file no record names
  // cannot be read.
  void SetManifests(std::vector<std::shared_ptr<const GenerationManifest>> manifests) EXCLUDES(mu_);
  // The store's current generation (the store opened on this env), consulted
  // after those manifests: a generation committed here is readable at once,
  // before the next SetManifests. Called without the env's lock held.
  void SetCurrent(std::function<std::shared_ptr<const GenerationManifest>()> current) EXCLUDES(mu_);

  // The worker whose directory holds `path`, when it is a shard file path of
  // another worker under the store root; -1 otherwise.
  int RemoteWorker(const std::string& path) const;

  struct Stats {
    uint64_t requests = 0;              // ReadShardRange calls
    uint64_t bytes = 0;                 // bytes fetched
    uint64_t cache_hits = 0;            // reads of a span fetched (or being fetched) before
    uint64_t ahead = 0;                 // spans fetched ahead of a reader
    uint64_t ahead_failed = 0;          // of which failed (dropped; the reader fetched again)
    ConnectionPoolStats connections{};  // the client's kept connections
  };
  Stats stats() const EXCLUDES(mu_);

  // Env. A remote file: OpenRead reads it from its worker, Exists is true
  // (the worker holds it; reading checks it), FileSize is the end of its
  // records' data; writing, listing or removing one is local (and finds
  // nothing).
  Result<std::unique_ptr<RandomAccessFile>> OpenRead(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> OpenWrite(const std::string& path) override { return local_->OpenWrite(path); }
  Result<std::unique_ptr<WritableFile>> OpenExisting(const std::string& path) override {
    return local_->OpenExisting(path);
  }
  bool Exists(const std::string& path) override;
  // False for a file of a worker that is not a live member (SetPeers).
  bool Reachable(const std::string& path) override EXCLUDES(mu_);
  Result<uint64_t> FileSize(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override { return local_->ListDir(path); }
  Status CreateDirs(const std::string& path) override { return local_->CreateDirs(path); }
  Status Rename(const std::string& from, const std::string& to) override { return local_->Rename(from, to); }
  Status Link(const std::string& from, const std::string& to) override { return local_->Link(from, to); }
  Status Remove(const std::string& path) override { return local_->Remove(path); }
  Status RemoveTree(const std::string& path) override { return local_->RemoveTree(path); }
  Status SyncDir(const std::string& path) override { return local_->SyncDir(path); }
  Status SyncFileSystem(const std::string& path) override { return local_->SyncFileSystem(path); }
  bool IsDirectory(const std::string& path) override { return local_->IsDirectory(path); }
  Result<std::unique_ptr<OutputDir>> OpenOutputDir(const std::string& path) override {
    return local_->OpenOutputDir(path);
  }

 private:
  class RemoteFile;
  // The records naming `rel` (one per distinct data range), and the worker's address.
  struct Target {
    PeerAddress peer;
    std::vector<ShardRecord> records;
  };
  // The local Env and `path` itself, or the tier's Env and where it holds it.
  std::pair<Env*, std::string> LocalPath(const std::string& path) const;
  Result<Target> Lookup(int worker, const std::string& rel) const EXCLUDES(mu_);
  // A span of blocks [first, end) of (file, data offset): fetched, or being
  // fetched (ready false) by a reader or ahead of one.
  struct Span {
    std::string file;
    uint64_t offset = 0;
    size_t first = 0, end = 0;
    uint64_t begin = 0;  // shard offset of bytes[0]
    std::shared_ptr<char[]> bytes;
    bool ahead = false;  // fetched ahead of a sequential reader
    bool ready = false;  // bytes and status final
    Status status;
  };
  struct AheadJob {
    PeerAddress peer;
    ShardRecord record;
    std::shared_ptr<Span> span;
  };

  // Copies bytes [skip, skip + n) of block `block` of `record` (as served by
  // `peer`) into dst: from the span in the cache holding it (waiting while it
  // is fetched), else fetched with the span it begins (then kept). A
  // `sequential` read (a step of a sweep) has the next span fetched ahead.
  Status ReadBlock(const PeerAddress& peer, const ShardRecord& record, size_t block, uint64_t skip, uint64_t n,
                   char* dst, bool sequential) EXCLUDES(mu_);
  // The cached span of `record` holding `block` (moved to the front), or null.
  std::shared_ptr<Span> FindSpan(const ShardRecord& record, size_t block) REQUIRES(mu_);
  // A new span of `record` from `first` (span_blocks at most), in flight, at the cache's front.
  std::shared_ptr<Span> AddSpan(const ShardRecord& record, size_t first, bool ahead) REQUIRES(mu_);
  // Has the span after `span` fetched ahead when it is not cached and there is room.
  void MaybeAhead(const PeerAddress& peer, const ShardRecord& record, const Span& span) REQUIRES(mu_);
  // Fetches `span` (in flight, this thread's to fill), then wakes its readers;
  // a failed span leaves the cache.
  void Fill(const PeerAddress& peer, const ShardRecord& record, const std::shared_ptr<Span>& span) EXCLUDES(mu_);
  // Drops the oldest fetched spans beyond the bound.
  void Trim() REQUIRES(mu_);
  // The loop of a thread fetching spans ahead.
  void AheadLoop() EXCLUDES(mu_);

  // A buffer for a span: a free one, or a new one.
  std::shared_ptr<char[]> SpanBuffer() EXCLUDES(mu_);

  Env* const local_;
  const std::string root_;  // with a final '/'
  const PeerEnvOptions options_;
  const PeerClient client_;
  mutable Mutex mu_;
  std::map<int, PeerAddress> peers_ GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const GenerationManifest>> manifests_ GUARDED_BY(mu_);
  std::function<std::shared_ptr<const GenerationManifest>()> current_ GUARDED_BY(mu_);
  CondVar arrived_{&mu_};                                   // a span got ready
  std::list<std::shared_ptr<Span>> cache_ GUARDED_BY(mu_);  // most recent first
  std::vector<std::shared_ptr<char[]>> free_ GUARDED_BY(mu_);  // span buffers no one holds
  // Spans to fetch ahead, and the threads that fetch them (started at the first).
  CondVar work_{&mu_};
  std::list<AheadJob> ahead_jobs_ GUARDED_BY(mu_);
  size_t ahead_in_flight_ GUARDED_BY(mu_) = 0;  // queued or being fetched
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> fetchers_ GUARDED_BY(mu_);
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace ptc::cluster
