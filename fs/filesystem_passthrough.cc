// Filesystem: which model files the kernel reads itself (FUSE passthrough,
// fs/passthrough.h) and the status that says so.
#include <sys/stat.h>

#include <cerrno>
#include <optional>

#include "fs/filesystem.h"
#include "fs/node.h"

namespace ptcfs {

ptc::Result<std::unique_ptr<ptc::RandomAccessFile>> Filesystem::BackingFile(const Node& node,
                                                                            const VirtualFile& file) const {
  ptc::Result<std::vector<std::string>> candidates = file.VerbatimFiles(node.snap->copies());
  if (!candidates.ok()) {
    // A shard file it needs cannot be opened: served by the daemon, whose reads say why.
    if (candidates.status().code() != ptc::Code::kNotFound) return std::unique_ptr<ptc::RandomAccessFile>();
    return ptc::IOError("missing file: " + candidates.status().message());
  }
  ptc::Status failure;
  for (const std::string& path : *candidates) {
    if (scrubber_ && scrubber_->IsBad(path)) continue;  // a block failed its checksum: the daemon checks each one

    struct stat link;
    if (::lstat(store_->AbsPath(path).c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      continue;  // a link planted in the store is never the kernel's to follow
    }
    auto f = store_->env()->OpenRead(store_->AbsPath(path));
    if (!f.ok()) {
      if (f.status().code() == ptc::Code::kNotFound) failure = ptc::IOError("missing file: " + f.status().message());
      continue;
    }
    if ((*f)->fd() < 0) continue;  // not a local file (a peer's)
    struct stat st;
    if (::fstat((*f)->fd(), &st) != 0) {
      failure = ptc::ErrnoError((*f)->path(), errno);
      continue;
    }
    if (st.st_nlink == 0) {
      failure = ptc::IOError((*f)->path() + ": the backing file was removed under the mount");
      continue;
    }
    ptc::Status same = file.CheckVerbatim(**f);
    if (same.ok()) return std::move(f).value();
    if (same.code() != ptc::Code::kCorruption) failure = same;  // truncated; a Corruption: another file's header
  }
  if (!failure.ok()) return failure;
  return std::unique_ptr<ptc::RandomAccessFile>();
}

ptc::Status Filesystem::OpenPassthrough(const Node& node, const VirtualFile& file, OpenReply* reply) {
  if (!passthrough_.enabled()) return ptc::Status::OK();  // every file through the daemon: no check needed
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::RandomAccessFile> backing, BackingFile(node, file));
  {
    ptc::MutexLock lock(&mu_);
    verbatim_[node.ino] = backing != nullptr;
  }
  if (backing == nullptr) return ptc::Status::OK();
  // The kernel keeps its own reference to the file: `backing` may close after.
  ptc::Result<int32_t> id = passthrough_.Acquire(node.ino, backing->fd());
  if (id.ok()) reply->backing_id = *id;  // otherwise the daemon serves it (the status says why)
  return ptc::Status::OK();
}

nlohmann::json Filesystem::PassthroughStatus() const {
  // The files a rank file may back: model/RANK/*.safetensors, megatron/iter_*/mp_rank_*/model_optim_rng.pt,
  // dcp/__W_0.distcp and megatron/iter_*/__W_0.distcp (torch_dist).
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> files;
  {
    ptc::MutexLock lock(&mu_);
    struct Dir {
      const Node* node;
      std::string path;
      int depth;  // levels of directories below it to look into
    };
    std::vector<Dir> todo;
    const auto& root = nodes_.at(kRootInode)->children;
    for (const auto& [top, depth] : {std::pair<std::string, int>{"megatron", 3}, {"model", 2}, {"dcp", 1}}) {
      auto it = root.find(top);
      if (it == root.end()) continue;
      if (auto n = nodes_.find(it->second); n != nodes_.end()) todo.push_back({n->second.get(), top, depth});
    }
    while (!todo.empty()) {
      const Dir dir = todo.back();
      todo.pop_back();
      for (const auto& [name, ino] : dir.node->children) {
        auto n = nodes_.find(ino);
        if (n == nodes_.end()) continue;
        if (n->second->kernel_readable()) {
          files.emplace_back(dir.path + "/" + name, n->second);
        } else if (n->second->kind() == Node::kDir && dir.depth > 1) {
          todo.push_back({n->second.get(), dir.path + "/" + name, dir.depth - 1});
        }
      }
    }
  }
  const bool on = passthrough_.enabled();
  nlohmann::json by_file = nlohmann::json::object();
  size_t kernel = 0;
  for (const auto& [path, node] : files) {
    std::optional<bool> verbatim;
    {
      ptc::MutexLock lock(&mu_);
      if (auto it = verbatim_.find(node->ino); it != verbatim_.end()) verbatim = it->second;
    }
    if (!verbatim && on) {  // decided once per inode, from its rendered extents
      auto rendered = Render(*node);
      verbatim = false;
      if (rendered.ok()) {
        auto backing = BackingFile(*node, **rendered);
        verbatim = backing.ok() && *backing != nullptr;
      }
      ptc::MutexLock lock(&mu_);
      verbatim_[node->ino] = *verbatim;
    }
    const bool by_kernel = on && verbatim.value_or(false);
    kernel += by_kernel;
    by_file[path] = by_kernel ? "kernel" : "daemon";
  }
  return {{"state", passthrough_.State()},
          {"scrub", scrubber_ ? scrubber_->StatusJson() : nlohmann::json(nullptr)},
          {"kernel", kernel},
          {"daemon", files.size() - kernel},
          {"open_backing_files", passthrough_.backed()},
          {"files", by_file},
          // Opens of the files a save writes (megatron/iter_N/..., dcp/NAME/...): the kernel's or the daemon's.
          {"save_opens", {{"kernel", staged_opens_kernel_.load()}, {"daemon", staged_opens_daemon_.load()}}}};
}

}  // namespace ptcfs
