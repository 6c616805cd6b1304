// The inode table's entries and the open-file handles of Filesystem: shared by
// its implementation files (filesystem.cc, filesystem_megatron.cc) only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "fs/filesystem.h"
#include "ptc/checkpoint/dcp.h"
#include "ptc/checkpoint/hf.h"

namespace ptcfs {

// Model entries are cached by the kernel for long: a layout change replaces
// them with new inodes and invalidates explicitly.
constexpr double kModelTimeout = 3600;

struct Node {
  enum Kind {
    kDir,
    kConfig,
    kStatus,
    kModelFile,
    kOptimFile,
    kNpyFile,
    kLiteralFile,
    kDataFile,
    kMegatronFile,
    kDcpFile,      // dcp/__W_0.distcp: `view` indexes the plan's files
    kHfFile,       // hf/model-0000K-of-0000N.safetensors: `view` indexes the plan's shards
    kMegatronDir,  // megatron/: takes new directories (saves)
    kDcpDir,       // dcp/: takes new directories (dcp.save's checkpoint_id)
    kLatestFile,   // megatron/latest_checkpointed_iteration.txt: a write commits a save
    kStagedDir,
    kStagedFile,  // written under megatron/, on disk in the staging area
  } kind = kDir;
  bool is_dir() const { return kind == kDir || kind == kMegatronDir || kind == kDcpDir || kind == kStagedDir; }
  std::map<std::string, uint64_t> children;       // directories
  std::shared_ptr<const Snapshot> snap;           // nodes under model/ and data/
  size_t view = 0;                                // index into snap->views()
  size_t tensor = 0;                              // kNpyFile: index into model then optim tensors
  ptc::ViewFile data_file = ptc::ViewFile::kIds;  // kDataFile, of the rank's dp coordinate
  std::optional<size_t> group;                    // kDataFile: the length group, if any
  uint64_t size = 0;                              // but kDataFile: its view knows
  std::string literal;                            // kLiteralFile, kLatestFile
  std::shared_ptr<const ptc::dcp::Plan> dcp;      // kDcpFile: the checkpoint it is part of
  std::shared_ptr<const ptc::hf::Plan> hf;        // kHfFile: the model it is part of
  uint64_t ino = 0;

 private:
  friend class Filesystem;
  // Guarded by Filesystem::mu_, which the analysis cannot name from here:
  // Filesystem reads and writes them only through LookupsOf and StagedOf, which require it.
  uint64_t lookups_ = 0;  // the kernel's lookup count
  // kMegatronDir (""), kDcpDir (kDcpStaging), kStagedDir, kStagedFile: the path in the staging area.
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
  ~Handle();  // closes fd
  std::shared_ptr<Node> node;
  std::unique_ptr<VirtualFile> file;              // model files
  std::shared_ptr<const ptc::RankDataView> data;  // data files
  int fd = -1;                                    // staged files
  bool backed = false;                            // read through the kernel: Passthrough::Release at close
  mutable ptc::Mutex mu;                          // never held together with Filesystem::mu_
  std::string text GUARDED_BY(mu);                // .ptcfs files, the latest file: content at open / written so far
  bool written GUARDED_BY(mu) = false;            // the latest file: written through this handle since its last flush
  bool sealed GUARDED_BY(mu) = false;             // staged files: its save was taken (Filesystem::Seal)
};

}  // namespace ptcfs
