// Filesystem: which model files the kernel reads itself (FUSE passthrough,
// fs/passthrough.h) and the status that says so.
#include <sys/stat.h>

#include <cerrno>
#include <optional>

#include "fs/filesystem.h"
#include "fs/node.h"

namespace ptcfs {

ptc::Status Filesystem::OpenPassthrough(const Node& node, const VirtualFile& file, OpenReply* reply) {
  ptc::Result<const ptc::RandomAccessFile*> backing = file.VerbatimFile();
  if (!backing.ok()) {
    // A shard file it needs cannot be opened: served by the daemon, whose reads say why.
    if (backing.status().code() != ptc::Code::kNotFound) return ptc::Status::OK();
    return ptc::IOError("missing file: " + backing.status().message());
  }
  {
    ptc::MutexLock lock(&mu_);
    verbatim_[node.ino] = *backing != nullptr;
  }
  if (*backing == nullptr || !passthrough_.enabled()) return ptc::Status::OK();
  const ptc::RandomAccessFile& f = **backing;
  struct stat st;
  if (::fstat(f.fd(), &st) != 0) return ptc::ErrnoError(f.path(), errno);
  if (st.st_nlink == 0) return ptc::IOError(f.path() + ": the backing file was removed under the mount");
  PTC_RETURN_IF_ERROR(file.CheckVerbatim(f));
  ptc::Result<int32_t> id = passthrough_.Acquire(node.ino, f.fd());
  if (id.ok()) reply->backing_id = *id;  // otherwise the daemon serves it (the status says why)
  return ptc::Status::OK();
}

nlohmann::json Filesystem::PassthroughStatus() const {
  std::vector<std::pair<std::string, std::shared_ptr<Node>>> files;
  {
    ptc::MutexLock lock(&mu_);
    const auto model = nodes_.at(kRootInode)->children.find("model");
    auto ranks = model == nodes_.at(kRootInode)->children.end() ? nodes_.end() : nodes_.find(model->second);
    if (ranks != nodes_.end()) {
      for (const auto& [rank, dir_ino] : ranks->second->children) {
        auto dir = nodes_.find(dir_ino);
        if (dir == nodes_.end()) continue;
        for (const auto& [name, ino] : dir->second->children) {
          auto n = nodes_.find(ino);
          if (n == nodes_.end()) continue;
          if (n->second->kind == Node::kModelFile || n->second->kind == Node::kOptimFile) {
            files.emplace_back("model/" + rank + "/" + name, n->second);
          }
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
        auto backing = (*rendered)->VerbatimFile();
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
          {"kernel", kernel},
          {"daemon", files.size() - kernel},
          {"open_backing_files", passthrough_.backed()},
          {"files", by_file}};
}

}  // namespace ptcfs
