// The inode table's entries and the open-file handles of Filesystem: shared by
// its implementation files (filesystem*.cc) only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "fs/filesystem.h"
#include "ptc/base/dir_at.h"
#include "view/view_tree.h"

namespace ptcfs {

// Model entries are cached by the kernel for long: a layout change replaces
// them with new inodes and invalidates explicitly.
constexpr double kModelTimeout = 3600;

struct Node {
  // What a node is: each kind with what only it has (a tagged variant; Kind is its index).
  struct Dir {};         // a directory of the mount's root or of a view
  struct ConfigFile {};  // .ptcfs/config: a write reconfigures
  struct StatusFile {};  // .ptcfs/status
  struct Rendered {      // a view's file, rendered on open
    std::shared_ptr<const FileRenderer> renderer;
    bool kernel_readable = false;  // TreeFile::kernel_readable
  };
  struct Literal {
    std::string text;
  };
  struct Data {  // a rank's data file, of its dp coordinate's view
    int dp_rank = 0;
    ptc::ViewFile file = ptc::ViewFile::kIds;
    std::optional<size_t> group;  // the length group, if any
  };
  struct SaveDir {  // a view's directory that takes saves: megatron/, dcp/
    SaveKind saves = SaveKind::kMegatron;
  };
  struct Latest {  // megatron/latest_checkpointed_iteration.txt: a write commits a save
    std::string text;
  };
  struct StagedDir {};
  struct StagedFile {};  // written under megatron/ or dcp/, on disk in the staging area
  enum Kind {
    kDir,
    kConfig,
    kStatus,
    kRenderedFile,
    kLiteralFile,
    kDataFile,
    kSaveDir,
    kLatestFile,
    kStagedDir,
    kStagedFile,
  };
  std::variant<Dir, ConfigFile, StatusFile, Rendered, Literal, Data, SaveDir, Latest, StagedDir, StagedFile> what;

  Kind kind() const { return static_cast<Kind>(what.index()); }
  bool is_dir() const { return kind() == kDir || kind() == kSaveDir || kind() == kStagedDir; }
  SaveKind saves() const {
    const auto* d = std::get_if<SaveDir>(&what);
    return d ? d->saves : SaveKind::kNone;
  }
  bool kernel_readable() const {
    const auto* r = std::get_if<Rendered>(&what);
    return r && r->kernel_readable;
  }

  std::map<std::string, uint64_t> children;  // directories
  std::shared_ptr<const Snapshot> snap;      // nodes of the trees a snapshot shows
  uint64_t size = 0;                         // files but data files (their view knows)
  uint64_t ino = 0;

 private:
  friend class Filesystem;
  // Guarded by Filesystem::mu_, which the analysis cannot name from here:
  // Filesystem reads and writes them only through LookupsOf and StagedOf, which require it.
  uint64_t lookups_ = 0;  // the kernel's lookup count
  // kSaveDir ("" for megatron/, kDcpStaging for dcp/), kStagedDir, kStagedFile: the path in the staging area.
  // A rename in the staging area rewrites it (of the node and all below it).
  std::string staged_;
};

inline uint64_t& Filesystem::LookupsOf(Node& node) const { return node.lookups_; }
inline std::string& Filesystem::StagedOf(Node& node) const { return node.staged_; }
inline const std::string& Filesystem::StagedOf(const Node& node) const { return node.staged_; }

// An open file. Requests on one handle may run concurrently (libfuse's
// multithreaded loop: a write and a flush of the same file): what they change
// is guarded by the handle's mu; the other fields are set before the handle is
// published (Filesystem::handles_) and never change.
struct Filesystem::Handle {
  // What is open: each kind with what only it has (a tagged variant).
  struct Text {};  // .ptcfs files, literal files, the latest file: `text`
  struct Rendered {
    std::unique_ptr<VirtualFile> file;
    bool backed = false;  // read through the kernel: Passthrough::Release at close
  };
  struct Data {
    std::shared_ptr<const ptc::RankDataView> view;
  };
  struct Staged {
    ptc::UniqueFd fd;
    // Written and read by the kernel in the staged file itself (its backing
    // id, fs/passthrough.h): no byte comes through the daemon; Passthrough::Release at close.
    bool backed = false;
    bool writable = false;  // opened for writing
  };
  std::shared_ptr<Node> node;
  std::variant<Text, Rendered, Data, Staged> what;

  const VirtualFile* file() const {
    const auto* r = std::get_if<Rendered>(&what);
    return r ? r->file.get() : nullptr;
  }
  bool backed() const {  // through the kernel: Passthrough::Release at close
    if (const auto* s = std::get_if<Staged>(&what)) return s->backed;
    const auto* r = std::get_if<Rendered>(&what);
    return r && r->backed;
  }
  const ptc::RankDataView* data() const {
    const auto* d = std::get_if<Data>(&what);
    return d ? d->view.get() : nullptr;
  }
  int fd() const {  // staged files; -1 otherwise
    const auto* f = std::get_if<Staged>(&what);
    return f ? f->fd.get() : -1;
  }
  mutable ptc::Mutex mu;                          // never held together with Filesystem::mu_
  std::string text GUARDED_BY(mu);                // .ptcfs files, the latest file: content at open / written so far
  bool written GUARDED_BY(mu) = false;            // the latest file: written through this handle since its last flush
  bool sealed GUARDED_BY(mu) = false;             // staged files: its save was taken (Filesystem::Seal)
  // A staged file the kernel writes: its process closed it (FLUSH) since it was opened.
  bool flushed GUARDED_BY(mu) = false;
};

}  // namespace ptcfs
