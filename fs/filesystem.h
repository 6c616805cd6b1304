// The mounted filesystem as a plain object: the inode table, the snapshot
// being served and the operations the FUSE callbacks call. Every operation
// returns a Result; fuse_ops.cc turns it into exactly one reply. Testable
// without a mount.
//
// Layout (docs/mount_format.md):
//   .ptcfs/config                          current config; write one to reconfigure
//   .ptcfs/status                          JSON: generation, config, state, progress, last error
//   model/rank-RRRRR/model.safetensors     (+ optim.safetensors with optimizer state)
//   model/rank-RRRRR/tensors/<name>.npy    (+ dtypes.json)
//   megatron/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt  (+ latest_checkpointed_iteration.txt)
//                                          with --format megatron|all
//   dcp/.metadata, dcp/__W_0.distcp        PyTorch DCP of the generation, with --format dcp|all
//   hf/config.json, hf/model-0000K-of-0000N.safetensors (+ model.safetensors.index.json)
//                                          Hugging Face's save_pretrained of the model, with --format hf|all
//   data/rank-RRRRR/{ids.txt,samples.idx,samples.bin | samples.jsonl}  when the store has a dataset
//                                          (under group-G/ per length group)
//
// Thread safety: all methods may be called concurrently, also on one open
// file. Lock order: the Controller's locks (its WriteContext's), then
// staging_mu_, then mu_; mu_ is never held while calling the Controller,
// sending a reply or notifying the kernel. An open file's own lock (Handle::mu) is never held with another.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fs/controller.h"
#include "fs/passthrough.h"
#include "fs/scrub.h"
#include "fs/staging.h"
#include "ptc/base/mutex.h"
#include "view/snapshot.h"
#include "view/view_tree.h"
#include "view/virtual_file.h"

namespace ptcfs {

constexpr uint64_t kRootInode = 1;
// The staging area of saves into megatron/, under the store root.
constexpr std::string_view kStagingDir = "ingest";
// Saves into dcp/ are staged under this directory of the staging area (a
// name megatron/ does not show and refuses to make).
constexpr std::string_view kDcpStaging = ".dcp";

// What the mount shows (ViewOptions: its formats and names) and how it runs.
struct MountOptions : ViewOptions {
  std::string store;
  int transform_threads = 2;
  CompactionPolicy compaction;  // when to compact in the background after a reconfigure
  // The Env the store is opened with (a cluster worker's PeerEnv, which reads
  // other workers' pieces from them); null: the default. Must outlive the mount.
  ptc::Env* env = nullptr;
  // One worker of a cluster: it may hold no ranks of the config (its pieces
  // are still read by the others); alone, a mount must show some.
  bool in_cluster = false;
  // Let the kernel read files that exist verbatim on disk (fs/passthrough.h);
  // false: every file through the daemon (--passthrough off).
  bool passthrough = true;
  // The background check of those files (fs/scrub.h); off with passthrough.
  ScrubOptions scrub;
};

struct Node;

struct Entry {
  uint64_t ino = 0;
  struct stat attr = {};
  double timeout = 0;  // seconds the kernel may cache the entry and its attributes
};

struct DirEntry {
  std::string name;
  uint64_t ino;
  mode_t mode;
};

// Leaves chars uninitialised on resize: a read reply's buffer is written
// before it is sent, and zero-filling 512 KiB per read costs a memory pass.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// What a read returns: bytes, or a range of a shard file to splice.
struct ReadReply {
  std::vector<char, UninitializedAllocator<char>> bytes;
  VirtualFile::FdRange fd_range;  // fd >= 0: reply from this file instead
  size_t fd_length = 0;
};

struct OpenReply {
  uint64_t fh = 0;
  bool direct_io = false;
  bool keep_cache = false;
  int32_t backing_id = 0;  // > 0: the kernel reads the file from this backing file (passthrough)
};

class Filesystem : public ChangeApplier {
 public:
  // \error as Store::Open (missing or invalid store: names the path),
  //        FailedPrecondition for an empty store, as Snapshot::Create.
  static ptc::Result<std::unique_ptr<Filesystem>> Create(const MountOptions& options);
  ~Filesystem();

  // Called (outside any lock) when entries under model/ must be dropped by the kernel.
  void SetInvalidateCallback(std::function<void(uint64_t parent, const std::string& name)> fn);

  ptc::Result<Entry> Lookup(uint64_t parent, const std::string& name);
  void Forget(uint64_t ino, uint64_t n);
  ptc::Result<Entry> GetAttr(uint64_t ino);
  ptc::Result<std::vector<DirEntry>> ReadDir(uint64_t ino);
  ptc::Result<OpenReply> Open(uint64_t ino, int flags);
  ptc::Result<ReadReply> Read(uint64_t fh, uint64_t offset, size_t size);
  ptc::Result<size_t> Write(uint64_t fh, const char* data, size_t size, uint64_t offset);
  ptc::Status Truncate(uint64_t ino, uint64_t size);
  // chmod, chown: nothing changes but files and directories of a save (staged).
  // \error PermissionDenied elsewhere (fuse_ops replies EPERM); NotFound for an unknown inode.
  ptc::Status ChangeModeOrOwner(uint64_t ino);
  // Closes `fh`. The last file of a generation that a commit replaced closes:
  // that generation is removed (Controller::CollectIfIdle).
  void Release(uint64_t fh) EXCLUDES(mu_);

  // Saves into megatron/ (docs/megatron_format.md): new directories and files
  // under megatron/ go to the staging area; a write of
  // latest_checkpointed_iteration.txt commits the iteration it names when the
  // file is flushed (close), and the close fails (EIO) if the save does not.
  // Saves into dcp/ (docs/dcp_format.md): new directories of dcp/ and what is
  // written in them go to the staging area too (kDcpStaging); see Rename.
  // Elsewhere: PermissionDenied (EACCES).
  ptc::Result<Entry> Mkdir(uint64_t parent, const std::string& name) EXCLUDES(staging_mu_, mu_);
  ptc::Result<std::pair<Entry, OpenReply>> Create(uint64_t parent, const std::string& name, int flags)
      EXCLUDES(staging_mu_, mu_);
  // A rename of dcp/SAVE/.metadata.tmp onto dcp/SAVE/.metadata (how dcp.save
  // finishes) commits that save (Controller::IngestDcp); the rename fails with
  // EIO when the save does not commit (the staged files stay), and with EBUSY
  // while a change runs (the file keeps its old name: the save may retry).
  ptc::Status Rename(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name)
      EXCLUDES(staging_mu_, mu_);
  ptc::Status Unlink(uint64_t parent, const std::string& name, bool directory) EXCLUDES(staging_mu_, mu_);
  ptc::Status Flush(uint64_t fh);
  ptc::Status Fsync(uint64_t fh);
  // The changes a cluster job agreed (ChangeApplier, fs/participant.h).
  // A change of layout: Controller::Apply over the snapshot served.
  ptc::Status ApplyRelayout(const std::string& request, std::shared_ptr<AgreedChange> change) override;
  // A compaction: Controller::ApplyCompaction of the snapshot served.
  ptc::Status ApplyCompaction(bool rank_files, std::shared_ptr<AgreedChange> change) override;
  // A save of `iteration` that another worker of the cluster job committed
  // its latest file for: this mount's part is the rank files staged here
  // (Controller::ApplySave), removed from the staging area once committed.
  ptc::Status ApplySave(uint64_t iteration, std::shared_ptr<AgreedChange> change) override;
  // A DCP save (`metadata`) that another worker of the cluster job received
  // the .metadata of, in staging directory `save` (kDcpStaging/NAME): this
  // mount's part is the chunk files written here (Controller::ApplyDcpSave),
  // removed from the staging area once committed.
  // \error InvalidArgument for a `save` that is not kDcpStaging/NAME; as Controller::ApplyDcpSave.
  ptc::Status ApplyDcpSave(const std::string& save, std::string metadata,
                           std::shared_ptr<AgreedChange> change) override;

  // Starts the mount's own background work (the scrub): in the serving
  // process, after the daemon forked and before the session loop.
  void StartBackground();

  Controller& controller() { return *controller_; }
  Passthrough& passthrough() { return passthrough_; }
  // .ptcfs/status's "passthrough": its state and how each model file of the
  // served layout is read ("kernel" or "daemon").
  nlohmann::json PassthroughStatus() const EXCLUDES(mu_);
  const ptc::Store& store() const { return *store_; }
  std::shared_ptr<const Snapshot> snapshot() const EXCLUDES(mu_);
  // The snapshot .ptcfs/config and .ptcfs/status describe (announced_).
  std::shared_ptr<const Snapshot> Announced() const EXCLUDES(mu_);

 private:
  struct Handle;
  explicit Filesystem(const MountOptions& options);
  // The node of inode `ino`, as the kernel names it.
  // \error NotFound (ENOENT) when the inode is not in the table (never was, or forgotten).
  ptc::Result<std::shared_ptr<Node>> NodeOf(uint64_t ino) const EXCLUDES(mu_);
  // The open file `fh` (fuse_file_info::fh), from Open or Create until Release.
  // \error InvalidArgument (EINVAL) for a handle not open.
  ptc::Result<std::shared_ptr<Handle>> HandleOf(uint64_t fh) const EXCLUDES(mu_);
  uint64_t AddNode(std::shared_ptr<Node> node) REQUIRES(mu_);
  // The kernel's lookup count of `node` (Node::lookups_): guarded by mu_,
  // which Node cannot name, so every access goes through here.
  uint64_t& LookupsOf(Node& node) const REQUIRES(mu_);
  // The staging path of `node` (Node::staged_), guarded by mu_ like LookupsOf.
  std::string& StagedOf(Node& node) const REQUIRES(mu_);
  const std::string& StagedOf(const Node& node) const REQUIRES(mu_);
  // A copy of it, for a request that uses it outside mu_.
  std::string StagedPath(const Node& node) const EXCLUDES(mu_);
  // Every view's tree (views_) and data/ of `snap` under `root`; a view that
  // cannot show `snap` is left out, its error recorded (.ptcfs/status).
  void AddTrees(Node& root, const std::shared_ptr<const Snapshot>& snap) REQUIRES(mu_);
  // The nodes of `view`'s `files`; a view that takes saves gets what the staging area holds.
  std::shared_ptr<Node> BuildViewTree(const ViewTree& view, const std::shared_ptr<const Snapshot>& snap,
                                      std::vector<TreeFile> files) REQUIRES(mu_);
  std::shared_ptr<Node> BuildDataTree(const std::shared_ptr<const Snapshot>& snap) REQUIRES(mu_);
  // Nodes for what the staging area holds under `dir` (recursively).
  void AddStaged(Node& dir, const std::shared_ptr<const Snapshot>& snap) REQUIRES(mu_);
  // Rename of staged entries; `to_parent` receives the staged path of the target directory.
  ptc::Status RenameStaged(uint64_t parent, const std::string& name, uint64_t new_parent, const std::string& new_name,
                           std::string* to_parent) EXCLUDES(staging_mu_, mu_);
  // Whether renaming onto `new_name` in the staged directory `to_parent` completes a DCP save.
  static bool IsDcpCommit(const std::string& to_parent, const std::string& new_name);
  // PermissionDenied naming dcp/.../`name` when the staged directory `parent`
  // is inside a DCP save (kDcpStaging/NAME/...): a save holds files only.
  static ptc::Status CheckNotInsideDcpSave(const std::string& parent, const std::string& name);
  // Commits the DCP save staged at `save` (kDcpStaging/NAME) and removes it from the staging area.
  // \error as Controller::IngestDcp (EIO, or EBUSY while a rewrite runs).
  ptc::Status CommitDcp(const std::string& save) EXCLUDES(staging_mu_, mu_);
  ptc::Result<OpenReply> OpenMegatronWritable(const std::shared_ptr<Node>& node, int flags) REQUIRES(staging_mu_)
      EXCLUDES(mu_);
  // A save's staged rank files become its pieces' files (the store links them,
  // CheckpointSource::adopt_files): from the moment the save is taken nothing
  // may change them. Seal(dir) ends every write through the open handles of
  // files under the staged directory `dir` (an in-flight write first) and
  // refuses new writes, truncations and opens for writing there until
  // Unseal(dir) (the save done, committed or not: a refused save may be
  // written again).
  // \error FailedPrecondition (EBUSY) naming a file of `dir` the kernel
  //        writes (passthrough) that is still open for writing: no save is
  //        taken that could change after it (nothing sealed then).
  ptc::Status Seal(const std::string& dir) EXCLUDES(staging_mu_, mu_);
  void Unseal(const std::string& dir) EXCLUDES(staging_mu_, mu_);
  // PermissionDenied naming `path` when it lies under a sealed directory.
  ptc::Status CheckNotSealed(const std::string& path) const REQUIRES(staging_mu_) EXCLUDES(mu_);
  // The backing id a staged file's open answers with (the kernel then writes
  // and reads the staged file itself), registered from `fd`; 0 when passthrough
  // is off or the kernel refuses the file (the daemon serves it: today's path).
  int32_t StagedBackingId(const Node& node, int fd) EXCLUDES(mu_);
  ptc::Result<size_t> WriteMegatron(Handle& h, const char* data, size_t size, uint64_t offset) EXCLUDES(mu_);
  // The directory `parent` if saves may write in it.
  ptc::Result<std::shared_ptr<Node>> StagingParent(uint64_t parent) EXCLUDES(mu_);
  std::shared_ptr<Node> NewDir(const std::shared_ptr<const Snapshot>& snap);
  void Serve(std::shared_ptr<const Snapshot> snap) EXCLUDES(mu_);  // swaps the tree, then invalidates
  // After Serve switched generations: removes the replaced generations that no
  // file open now reads.
  // \error from Store::CollectGarbage (not FailedPrecondition: kept for the next commit).
  ptc::Status CollectReplaced() EXCLUDES(mu_);
  // The file's size: data files ask their view (built on first use).
  ptc::Result<uint64_t> SizeOf(const Node& node) const EXCLUDES(mu_);
  struct stat Attr(const Node& node, uint64_t size) const;
  static double Timeout(const Node& node);
  ptc::Result<std::unique_ptr<VirtualFile>> Render(const Node& node) const;

  // Whether `node`'s rendered file `file` exists verbatim on disk: then its
  // backing file is registered and `reply` asks for passthrough (the route is
  // kept for the status). A backing file removed or truncated under the mount
  // fails the open.
  // \error IOError naming the backing file when removed or truncated.
  ptc::Status OpenPassthrough(const Node& node, const VirtualFile& file, OpenReply* reply) EXCLUDES(mu_);
  // The file on disk that holds `node`'s rendered `file` byte for byte, opened:
  // the first of file.VerbatimFiles (its pieces, or copies of them) whose size,
  // header and padding agree (CheckVerbatim; a file with another header, a
  // replica's, is passed over); nullptr when none does.
  // \error IOError naming the file when one that would back it is missing,
  //        removed or truncated (and no other holds it).
  ptc::Result<std::unique_ptr<ptc::RandomAccessFile>> BackingFile(const Node& node, const VirtualFile& file) const;

  MountOptions options_;
  std::vector<std::unique_ptr<ViewTree>> views_;  // model/ first (MakeViewTrees)
  Passthrough passthrough_;
  // Per model file inode: whether its bytes exist verbatim on disk (decided on
  // first open or status, kept while the inode lives).
  mutable std::map<uint64_t, bool> verbatim_ GUARDED_BY(mu_);
  std::unique_ptr<ptc::Store> store_;
  Staging staging_;
  std::unique_ptr<Controller> controller_;
  // Checks the files the kernel reads itself; made after store_ and controller_, gone before them.
  std::unique_ptr<Scrubber> scrubber_;
  std::function<void(uint64_t, const std::string&)> invalidate_;
  // Serialises the changes of the staging area (Mkdir, Create, Rename,
  // Unlink): a staged path read before a change on disk is still the node's
  // path when the tree is updated after it.
  ptc::Mutex staging_mu_;
  std::set<std::string> sealed_ GUARDED_BY(staging_mu_);  // Seal's directories
  mutable ptc::Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ GUARDED_BY(mu_);
  // What .ptcfs/config and .ptcfs/status show: snapshot_ once the kernel has
  // dropped the replaced trees' entries (Serve), so that a reader who sees
  // the new config there opens the new layout's files, not cached old ones.
  std::shared_ptr<const Snapshot> announced_ GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<Node>> nodes_ GUARDED_BY(mu_);
  uint64_t next_ino_ GUARDED_BY(mu_) = kRootInode;
  std::map<uint64_t, std::shared_ptr<Handle>> handles_ GUARDED_BY(mu_);
  bool collect_due_ GUARDED_BY(mu_) = false;  // Serve switched generations since the last CollectReplaced
  // Replaced generations that CollectReplaced kept because open files read them.
  std::set<uint64_t> kept_ GUARDED_BY(mu_);
  // The commit time of the generation served (Snapshot::commit_time): the
  // time of nodes without a snapshot (/, .ptcfs/). Read without mu_ by Attr.
  std::atomic<int64_t> served_sec_{0}, served_nsec_{0};
  uint64_t next_fh_ GUARDED_BY(mu_) = 1;
  // Opens of staged files (saves) answered with a backing id, and through the daemon.
  std::atomic<uint64_t> staged_opens_kernel_{0}, staged_opens_daemon_{0};
};

// The errno for a Status at the FUSE boundary (the one mapping).
int ErrnoOf(const ptc::Status& status);

}  // namespace ptcfs
