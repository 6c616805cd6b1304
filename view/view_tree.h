// A ViewTree is one directory of a mount's root (model/, megatron/, dcp/,
// hf/): the files a snapshot shows there, each a literal or a file rendered
// from the stored pieces when opened. Building one is pure (no FUSE, no
// inode): the daemon (fs/filesystem.h) makes its inodes from the listing, and
// adds what only a mount has (the saves under way in its staging area).
//
// Adding a view is one implementation of ViewTree (a file of its own, as
// view/model_view.cc) and its line in MakeViewTrees.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/checkpoint/megatron/names.h"
#include "view/snapshot.h"
#include "view/virtual_file.h"

namespace ptcfs {

// What a mount shows, as `ptcfs mount`'s --format, --names, --ckpt-format and --dcp-names say.
struct ViewOptions {
  int worker = -1;  // -1: every rank of the config
  bool safetensors = true;
  bool npy = true;
  bool megatron = false;  // megatron/ (Megatron-LM torch files)
  bool dcp = false;       // dcp/ (PyTorch Distributed Checkpoint, ptc/checkpoint/dcp/dcp.h)
  bool hf = false;        // hf/ (Hugging Face's save_pretrained, ptc/checkpoint/hf/hf.h)
  uint64_t hf_shard_bytes = ptc::hf::kDefaultShardBytes;  // hf/'s max_shard_size
  // The name set megatron/ renders (saves may use either).
  ptc::megatron::NameSet megatron_names = ptc::megatron::NameSet::kTe;
  // megatron/iter_N/ as Megatron-Core's torch_dist checkpoint instead of the
  // legacy mp_rank_* tree (--ckpt-format torch_dist).
  bool megatron_torch_dist = false;
  // The keys dcp/ names its tensors by (a save into it may use either).
  ptc::dcp::Keys dcp_keys = ptc::dcp::Keys::kTorch;
};

// A file whose bytes are rendered from the stored pieces when it is opened.
class FileRenderer {
 public:
  virtual ~FileRenderer() = default;
  // \error as the format's plan; a piece's read errors come with the reads that reach it.
  virtual ptc::Result<std::unique_ptr<VirtualFile>> Render() const = 0;
};

// One file of a view.
struct TreeFile {
  // Below the view's directory, '/'-separated; its directories are those its path names.
  std::string path;
  uint64_t size = 0;
  std::shared_ptr<const FileRenderer> renderer;  // null: `literal` is the file
  std::string literal;
  // A rank file (view/rank_files.h) may hold it byte for byte, so the kernel
  // may read it from there (fs/passthrough.h).
  bool kernel_readable = false;
  // Writing it commits a save (Megatron's latest_checkpointed_iteration.txt).
  bool commits_save = false;
};

// The saves a view's directory takes (a framework writing into it).
enum class SaveKind { kNone, kMegatron, kDcp };

class ViewTree {
 public:
  virtual ~ViewTree() = default;
  // Its directory at the mount's root.
  virtual std::string_view name() const = 0;
  virtual SaveKind saves() const { return SaveKind::kNone; }
  // The files `snap` shows, in the order they are listed; a later file of a
  // path takes an earlier one's place.
  // \error the format's: the mount then shows no such directory and names the error in its status.
  virtual ptc::Result<std::vector<TreeFile>> Build(const std::shared_ptr<const Snapshot>& snap) const = 0;
};

// The views `options` asks for, model/ first.
std::vector<std::unique_ptr<ViewTree>> MakeViewTrees(const ViewOptions& options);

// The implementations (view/*_view.cc).
std::unique_ptr<ViewTree> MakeModelView(const ViewOptions& options);
std::unique_ptr<ViewTree> MakeMegatronView(const ViewOptions& options);
std::unique_ptr<ViewTree> MakeDcpView(const ViewOptions& options);
std::unique_ptr<ViewTree> MakeHfView(const ViewOptions& options);

// A literal file of `text`.
TreeFile LiteralFile(std::string path, std::string text);

// `plan`'s .metadata and chunk files under each of `dirs` ("" or ending in
// '/'), one plan and one .metadata text shared by all: dcp/'s (and its save's
// own directory), and those of a torch_dist directory (view/dcp_view.cc).
// The chunks prefer the pieces of `worker` (-1: any).
void AddDcpFiles(const std::vector<std::string>& dirs, const std::shared_ptr<const Snapshot>& snap, ptc::dcp::Plan plan,
                 int worker, std::vector<TreeFile>* files);

}  // namespace ptcfs
