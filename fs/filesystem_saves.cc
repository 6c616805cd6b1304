// Filesystem: saves written into megatron/ and dcp/ by a framework
// (view/megatron_view.cc, view/dcp_view.cc show what is committed):
// directories and files land in the staging area (fs/staging.h); writing
// megatron/latest_checkpointed_iteration.txt commits the iteration it names
// on flush, renaming dcp/SAVE/.metadata.tmp onto .metadata commits that save.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "fs/filesystem.h"
#include "fs/node.h"
#include "ptc/checkpoint/dcp/dcp.h"

namespace ptcfs {
namespace {

bool Writing(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

// The iteration a framework wrote into the latest file.
ptc::Result<uint64_t> ParseIteration(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  uint64_t it = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), it);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return ptc::InvalidArgumentError(std::string(ptc::megatron::kLatestFile) + ": '" + text +
                                     "' is not an iteration number");
  }
  return it;
}

}  // namespace

void Filesystem::AddStaged(Node& dir, const std::shared_ptr<const Snapshot>& snap) {
  const std::string& path = StagedOf(dir);
  for (const auto& [name, is_dir] : staging_.List(path)) {
    if (dir.children.count(name)) continue;             // rendered entries win (saves cannot create them)
    if (path.empty() && name == kDcpStaging) continue;  // dcp/'s saves, not megatron/'s
    auto n = std::make_shared<Node>();
    if (is_dir) {
      n->what = Node::StagedDir{};
    } else {
      n->what = Node::StagedFile{};
    }
    n->snap = snap;
    StagedOf(*n) = path.empty() ? name : path + "/" + name;
    if (is_dir) AddStaged(*n, snap);
    dir.children[name] = AddNode(n);
  }
}

ptc::Result<std::shared_ptr<Node>> Filesystem::StagingParent(uint64_t parent) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> p, NodeOf(parent));
  if (p->kind() != Node::kSaveDir && p->kind() != Node::kStagedDir) {
    return ptc::Status(ptc::Code::kPermissionDenied, "only megatron/ and dcp/ take new files (saves)");
  }
  return p;
}

ptc::Result<Entry> Filesystem::Mkdir(uint64_t parent, const std::string& name) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> p, StagingParent(parent));
  if (p->saves() == SaveKind::kMegatron && name == kDcpStaging) {
    return ptc::Status(ptc::Code::kPermissionDenied, "megatron/" + name + ": a name ptcfs keeps for dcp/'s saves");
  }
  ptc::MutexLock staging(&staging_mu_);
  std::string parent_path;
  {
    ptc::MutexLock lock(&mu_);
    if (p->children.count(name)) return ptc::AlreadyExistsError(name);
    parent_path = StagedOf(*p);
  }
  if (ptc::Status nested = CheckNotInsideDcpSave(parent_path, name); !nested.ok()) {
    controller_->RecordError(nested.message());  // what dcp.save's OSError cannot say
    return nested;
  }
  PTC_ASSIGN_OR_RETURN(std::string rel, Staging::Join(parent_path, name));
  if (p->saves() == SaveKind::kDcp && !staging_.Stat(parent_path).ok()) PTC_RETURN_IF_ERROR(staging_.Mkdir(parent_path));
  PTC_RETURN_IF_ERROR(staging_.Mkdir(rel));
  auto n = std::make_shared<Node>();
  n->what = Node::StagedDir{};
  n->snap = p->snap;
  ptc::MutexLock lock(&mu_);
  StagedOf(*n) = rel;
  p->children[name] = AddNode(n);
  LookupsOf(*n)++;
  return Entry{n->ino, Attr(*n, 0), Timeout(*n)};
}

ptc::Result<std::pair<Entry, OpenReply>> Filesystem::Create(uint64_t parent, const std::string& name, int flags) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> p, StagingParent(parent));
  if (p->saves() == SaveKind::kDcp) {
    return ptc::Status(ptc::Code::kPermissionDenied,
                       "dcp/" + name + ": dcp/ takes directories (a dcp.save checkpoint_id), not files");
  }
  ptc::MutexLock staging(&staging_mu_);
  std::shared_ptr<Node> n;
  std::string parent_path;
  {
    ptc::MutexLock lock(&mu_);
    if (auto it = p->children.find(name); it != p->children.end()) {
      auto c = nodes_.find(it->second);
      if (c == nodes_.end()) return ptc::NotFoundError(name + ": replaced by a reconfiguration");
      n = c->second;
    }
    parent_path = StagedOf(*p);
  }
  if (n == nullptr) {
    PTC_ASSIGN_OR_RETURN(std::string rel, Staging::Join(parent_path, name));
    PTC_ASSIGN_OR_RETURN(int fd, staging_.Open(rel, O_WRONLY | O_CREAT | O_TRUNC));
    ::close(fd);
    n = std::make_shared<Node>();
    n->what = Node::StagedFile{};
    n->snap = p->snap;
    ptc::MutexLock lock(&mu_);
    StagedOf(*n) = rel;
    p->children[name] = AddNode(n);
  }
  PTC_ASSIGN_OR_RETURN(OpenReply reply, OpenMegatronWritable(n, flags));
  PTC_ASSIGN_OR_RETURN(uint64_t size, SizeOf(*n));
  ptc::MutexLock lock(&mu_);
  LookupsOf(*n)++;
  return std::make_pair(Entry{n->ino, Attr(*n, size), Timeout(*n)}, reply);
}

ptc::Result<OpenReply> Filesystem::OpenMegatronWritable(const std::shared_ptr<Node>& node, int flags) {
  auto h = std::make_shared<Handle>();
  h->node = node;
  OpenReply reply;
  reply.direct_io = true;  // the kernel must not cache what a save may still change
  if (node->kind() == Node::kStagedFile) {
    const int access = flags & (O_ACCMODE | O_TRUNC | O_APPEND);
    const std::string path = StagedPath(*node);
    if (Writing(flags)) PTC_RETURN_IF_ERROR(CheckNotSealed(path));
    PTC_ASSIGN_OR_RETURN(const int fd, staging_.Open(path, access));
    Handle::Staged staged{ptc::UniqueFd(fd), false, Writing(flags)};
    reply.backing_id = StagedBackingId(*node, fd);
    staged.backed = reply.backing_id > 0;
    reply.direct_io = !staged.backed;  // the kernel's writes and reads go to the staged file's own pages
    h->what = std::move(staged);
  } else if (!Writing(flags)) {
    ptc::MutexLock lock(&h->mu);
    h->text = std::get<Node::Latest>(node->what).text;
  }
  ptc::MutexLock lock(&mu_);
  reply.fh = next_fh_++;
  handles_[reply.fh] = std::move(h);
  return reply;
}

ptc::Result<size_t> Filesystem::WriteMegatron(Handle& h, const char* data, size_t size, uint64_t offset) {
  if (h.fd() >= 0) {
    bool sealed;
    ssize_t n = 0;
    int err = 0;
    {
      ptc::MutexLock lock(&h.mu);  // Seal waits for this write
      sealed = h.sealed;
      if (!sealed) {
        n = ::pwrite(h.fd(), data, size, static_cast<off_t>(offset));
        err = errno;
      }
    }
    if (sealed) {
      return ptc::Status(ptc::Code::kPermissionDenied,
                         staging_.Path(StagedPath(*h.node)) + ": its save was taken; reopen it to write it again");
    }
    if (n < 0) return ptc::ErrnoError(staging_.Path(StagedPath(*h.node)), err);
    return static_cast<size_t>(n);
  }
  if (offset > 64 || offset + size > 64) return ptc::InvalidArgumentError("an iteration number is short");
  ptc::MutexLock lock(&h.mu);
  if (h.text.size() < offset + size) h.text.resize(offset + size);
  h.text.replace(offset, size, data, size);
  h.written = true;
  return size;
}

ptc::Status Filesystem::Flush(uint64_t fh) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Handle> h, HandleOf(fh));
  if (h->node->kind() == Node::kStagedFile) {
    ptc::MutexLock lock(&h->mu);
    h->flushed = true;  // closed by its process (Seal takes a save the kernel wrote after this)
    return ptc::Status::OK();
  }
  if (h->node->kind() != Node::kLatestFile) return ptc::Status::OK();
  std::string text;  // what was written, read once: a write may run while this commits
  {
    ptc::MutexLock lock(&h->mu);
    if (!h->written) return ptc::Status::OK();
    h->written = false;  // one commit per write
    text = h->text;
  }
  auto iteration = ParseIteration(std::move(text));
  if (!iteration.ok()) {
    controller_->RecordError(iteration.status().message());
    return iteration.status();
  }
  const std::string dir = ptc::megatron::IterationDirName(*iteration);
  if (ptc::Status sealed = Seal(dir); !sealed.ok()) {
    controller_->RecordError(sealed.message());
    return sealed;  // EBUSY: the save may be taken again once the file is closed
  }
  ptc::Status s = controller_->Ingest(staging_.root(), *iteration, snapshot());
  // Committed: the staged iteration is in the store now.
  if (s.ok()) s = staging_.RemoveTree(dir);
  Unseal(dir);
  // close() fails with EIO, or EBUSY while a reconfiguration runs.
  return s.ok() || s.code() == ptc::Code::kFailedPrecondition ? s : ptc::IOError(s.message());
}

ptc::Status Filesystem::ApplyDcpSave(const std::string& save, std::string metadata,
                                     std::shared_ptr<AgreedChange> change) {
  // dcp/NAME (kDcpStaging/NAME), or a torch_dist iteration of megatron/ (iter_NNNNNNN).
  const std::string name = save.substr(std::min(save.size(), kDcpStaging.size() + 1));
  const bool dcp = IsDcpCommit(save, ptc::dcp::kMetadataFile) && !name.empty() && name != "." && name != "..";
  const auto iteration = ParseIteration(save.substr(std::min<size_t>(save.size(), 5)));
  const bool torch_dist = iteration.ok() && ptc::megatron::IterationDirName(*iteration) == save;
  if (!dcp && !torch_dist) {
    const ptc::Status bad = ptc::InvalidArgumentError("'" + save + "' is no save directory of dcp/ or megatron/");
    change->Failed(bad);
    return bad;
  }
  if (ptc::Status sealed = Seal(save); !sealed.ok()) {
    change->Failed(sealed);
    return sealed;
  }
  const ptc::Status s = controller_->ApplyDcpSave(
      staging_.Path(save), std::move(metadata), dcp ? ptc::dcp::Keys::kTorch : ptc::dcp::Keys::kMegatronCore,
      snapshot(), std::move(change), [this, save](bool committed) {
        // Before the new generation is served (its tree lists what the staging area holds then).
        const ptc::Status removed = committed ? staging_.RemoveTree(save) : ptc::Status::OK();
        Unseal(save);
        if (!removed.ok()) controller_->RecordError("DCP save committed; " + removed.message());
      });
  if (!s.ok()) Unseal(save);
  return s;
}

ptc::Status Filesystem::ApplySave(uint64_t iteration, std::shared_ptr<AgreedChange> change) {
  const std::string dir = ptc::megatron::IterationDirName(iteration);
  if (ptc::Status sealed = Seal(dir); !sealed.ok()) {
    change->Failed(sealed);
    return sealed;
  }
  const ptc::Status s = controller_->ApplySave(
      staging_.root(), iteration, snapshot(), std::move(change), [this, dir, iteration](bool committed) {
        const ptc::Status removed = committed ? staging_.RemoveTree(dir) : ptc::Status::OK();
        Unseal(dir);
        if (!removed.ok()) {
          controller_->RecordError("save of iteration " + std::to_string(iteration) + " committed; " +
                                   removed.message());
        }
      });
  if (!s.ok()) Unseal(dir);
  return s;
}

ptc::Status Filesystem::Seal(const std::string& dir) {
  ptc::MutexLock staging(&staging_mu_);
  std::vector<std::shared_ptr<Handle>> open;
  {
    ptc::MutexLock lock(&mu_);
    for (const auto& [fh, h] : handles_) {
      if (h->fd() >= 0 && StagedOf(*h->node).starts_with(dir + "/")) open.push_back(h);
    }
  }
  // The kernel writes a backed file without the daemon: nothing can end its
  // writes, so a save is taken only once every such file was closed.
  for (const std::shared_ptr<Handle>& h : open) {
    const auto& staged = std::get<Handle::Staged>(h->what);
    bool writing = false;
    if (staged.backed && staged.writable) {
      ptc::MutexLock lock(&h->mu);
      writing = !h->flushed;
    }
    if (writing) {
      return ptc::Status(ptc::Code::kFailedPrecondition,
                         staging_.Path(StagedPath(*h->node)) +
                             ": still open for writing (the kernel writes it): close it before the save is taken");
    }
  }
  sealed_.insert(dir);
  for (const std::shared_ptr<Handle>& h : open) {
    ptc::MutexLock lock(&h->mu);
    h->sealed = true;
  }
  return ptc::Status::OK();
}

int32_t Filesystem::StagedBackingId(const Node& node, int fd) {
  if (!passthrough_.enabled()) {
    staged_opens_daemon_++;
    return 0;
  }
  // A failure (the staging area on a file system the kernel cannot stack on)
  // leaves the file to the daemon, as with passthrough off.
  ptc::Result<int32_t> id = passthrough_.Acquire(node.ino, fd);
  if (!id.ok()) controller_->RecordError(staging_.Path(StagedPath(node)) + ": written through the daemon: " +
                                         id.status().message());
  (id.ok() ? staged_opens_kernel_ : staged_opens_daemon_)++;
  return id.ok() ? *id : 0;
}

void Filesystem::Unseal(const std::string& dir) {
  ptc::MutexLock staging(&staging_mu_);
  sealed_.erase(dir);
}

ptc::Status Filesystem::CheckNotSealed(const std::string& path) const {
  for (const std::string& dir : sealed_) {
    if (path.starts_with(dir + "/")) {
      return ptc::Status(ptc::Code::kPermissionDenied,
                         staging_.Path(path) + ": its save is being taken; write it again once the save is done");
    }
  }
  return ptc::Status::OK();
}

ptc::Status Filesystem::Fsync(uint64_t fh) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Handle> h, HandleOf(fh));
  if (h->fd() >= 0 && ::fsync(h->fd()) != 0) {
    const int err = errno;
    return ptc::ErrnoError(staging_.Path(StagedPath(*h->node)), err);
  }
  return ptc::Status::OK();
}

ptc::Status Filesystem::Rename(uint64_t parent, const std::string& name, uint64_t new_parent,
                               const std::string& new_name) {
  std::string to_parent;
  PTC_RETURN_IF_ERROR(RenameStaged(parent, name, new_parent, new_name, &to_parent));
  if (!IsDcpCommit(to_parent, new_name)) return ptc::Status::OK();
  const ptc::Status s = CommitDcp(to_parent);
  if (s.code() == ptc::Code::kFailedPrecondition) {
    // Busy (EBUSY): nothing may have changed, so that the same rename can be
    // tried again; the file goes back under its old name.
    std::string unused;
    const ptc::Status back = RenameStaged(new_parent, new_name, parent, name, &unused);
    if (!back.ok()) {
      controller_->RecordError("a refused DCP commit could not move its .metadata back: " + back.message());
    }
  }
  return s;
}

ptc::Status Filesystem::CommitDcp(const std::string& save) {
  ptc::Status removed;
  // In a cluster each worker's chunk files become its pieces: no more writes into them.
  if (ptc::Status sealed = Seal(save); !sealed.ok()) {
    controller_->RecordError(sealed.message());
    return sealed;  // EBUSY: the rename is undone, the save may try again
  }
  ptc::Status s =
      controller_->IngestDcp(staging_.Path(save), save, snapshot(), [&] { removed = staging_.RemoveTree(save); });
  Unseal(save);
  if (!s.ok()) return s.code() == ptc::Code::kFailedPrecondition ? s : ptc::IOError(s.message());
  if (!removed.ok()) controller_->RecordError("DCP save committed; " + removed.message());
  return ptc::Status::OK();
}

ptc::Status Filesystem::RenameStaged(uint64_t parent, const std::string& name, uint64_t new_parent,
                                     const std::string& new_name, std::string* to_parent_out) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> from_dir, StagingParent(parent));
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> to_dir, StagingParent(new_parent));
  ptc::MutexLock staging(&staging_mu_);
  std::shared_ptr<Node> node;
  std::string from, to_parent;
  {
    ptc::MutexLock lock(&mu_);
    auto it = from_dir->children.find(name);
    if (it == from_dir->children.end() || !nodes_.count(it->second)) return ptc::NotFoundError(name);
    node = nodes_.at(it->second);
    if (node->kind() != Node::kStagedFile && node->kind() != Node::kStagedDir) {
      return ptc::Status(ptc::Code::kPermissionDenied, name + ": rendered files cannot be moved");
    }
    if (auto t = to_dir->children.find(new_name); t != to_dir->children.end() && nodes_.count(t->second)) {
      const Node& target = *nodes_.at(t->second);
      if (target.kind() != Node::kStagedFile && target.kind() != Node::kStagedDir) {
        return ptc::Status(ptc::Code::kPermissionDenied, new_name + ": rendered files cannot be replaced");
      }
    }
    from = StagedOf(*node);
    to_parent = StagedOf(*to_dir);
  }
  if (node->kind() == Node::kStagedDir) PTC_RETURN_IF_ERROR(CheckNotInsideDcpSave(to_parent, new_name));
  if (new_name == ptc::dcp::kMetadataFile && to_parent.starts_with(std::string(kDcpStaging) + "/") &&
      !IsDcpCommit(to_parent, new_name)) {
    return ptc::Status(ptc::Code::kPermissionDenied,
                       "dcp/" + to_parent.substr(kDcpStaging.size() + 1) + "/" + new_name +
                           ": not a save's .metadata (a save is a directory directly under dcp/); nothing committed");
  }
  PTC_ASSIGN_OR_RETURN(std::string to, Staging::Join(to_parent, new_name));
  PTC_RETURN_IF_ERROR(staging_.Rename(from, to));
  *to_parent_out = to_parent;
  ptc::MutexLock lock(&mu_);
  from_dir->children.erase(name);
  to_dir->children[new_name] = node->ino;
  // The node and everything under it now live at the new path (staging_mu_
  // held: their paths still start with `from`).
  std::vector<Node*> stack = {node.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    std::string& staged = StagedOf(*n);
    staged = to + staged.substr(from.size());
    for (const auto& [unused, ino] : n->children) {
      if (auto c = nodes_.find(ino); c != nodes_.end()) stack.push_back(c->second.get());
    }
  }
  return ptc::Status::OK();
}

ptc::Status Filesystem::CheckNotInsideDcpSave(const std::string& parent, const std::string& name) {
  const std::string prefix = std::string(kDcpStaging) + "/";
  if (!parent.starts_with(prefix)) return ptc::Status::OK();
  return ptc::Status(ptc::Code::kPermissionDenied,
                     "dcp/" + parent.substr(prefix.size()) + "/" + name +
                         ": a DCP save is a directory directly under dcp/ (dcp/NAME, its files in it); "
                         "no directory is taken inside one");
}

bool Filesystem::IsDcpCommit(const std::string& to_parent, const std::string& new_name) {
  const std::string prefix = std::string(kDcpStaging) + "/";
  return new_name == ptc::dcp::kMetadataFile && to_parent.rfind(prefix, 0) == 0 &&
         to_parent.find('/', prefix.size()) == std::string::npos;
}

ptc::Status Filesystem::Unlink(uint64_t parent, const std::string& name, bool directory) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> dir, StagingParent(parent));
  ptc::MutexLock staging(&staging_mu_);
  std::shared_ptr<Node> node;
  std::string path;
  {
    ptc::MutexLock lock(&mu_);
    auto it = dir->children.find(name);
    if (it == dir->children.end() || !nodes_.count(it->second)) return ptc::NotFoundError(name);
    node = nodes_.at(it->second);
    path = StagedOf(*node);
  }
  if (node->kind() != (directory ? Node::kStagedDir : Node::kStagedFile)) {
    return ptc::Status(ptc::Code::kPermissionDenied, name + ": only files and directories of saves can be removed");
  }
  PTC_RETURN_IF_ERROR(directory ? staging_.Rmdir(path) : staging_.Unlink(path));
  ptc::MutexLock lock(&mu_);
  dir->children.erase(name);
  return ptc::Status::OK();
}

}  // namespace ptcfs
