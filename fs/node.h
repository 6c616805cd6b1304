// The inode table's entries and the open-file handles of Filesystem: shared by
// its implementation files (filesystem.cc, filesystem_megatron.cc) only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "fs/filesystem.h"

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
    kMegatronDir,  // megatron/: takes new directories (saves)
    kLatestFile,   // megatron/latest_checkpointed_iteration.txt: a write commits a save
    kStagedDir,
    kStagedFile,  // written under megatron/, on disk in the staging area
  } kind = kDir;
  bool is_dir() const { return kind == kDir || kind == kMegatronDir || kind == kStagedDir; }
  std::map<std::string, uint64_t> children;       // directories
  std::shared_ptr<const Snapshot> snap;           // nodes under model/ and data/
  size_t view = 0;                                // index into snap->views()
  size_t tensor = 0;                              // kNpyFile: index into model then optim tensors
  ptc::ViewFile data_file = ptc::ViewFile::kIds;  // kDataFile, of the rank's dp coordinate
  std::optional<size_t> group;                    // kDataFile: the length group, if any
  uint64_t size = 0;                              // but kDataFile: its view knows
  std::string literal;                            // kLiteralFile, kLatestFile
  std::string staged;  // kMegatronDir (""), kStagedDir, kStagedFile: path in the staging area
  uint64_t ino = 0;

 private:
  friend class Filesystem;
  // The kernel's lookup count. Guarded by Filesystem::mu_, which the analysis
  // cannot name from here: Filesystem reads and writes it only through LookupsOf, which requires it.
  uint64_t lookups_ = 0;
};

inline uint64_t& Filesystem::LookupsOf(Node& node) const { return node.lookups_; }

struct Filesystem::Handle {
  ~Handle();  // closes fd
  std::shared_ptr<Node> node;
  std::unique_ptr<VirtualFile> file;              // model files
  std::shared_ptr<const ptc::RankDataView> data;  // data files
  std::string text;                               // .ptcfs files, the latest file: content at open / written so far
  bool written = false;                           // the latest file: written through this handle
  int fd = -1;                                    // staged files
};

}  // namespace ptcfs
