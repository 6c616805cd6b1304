#include "fs/filesystem.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "fs/node.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/dataset/state.h"
#include "ptc/format/npy.h"
#include "ptc/store/model_spec.h"

namespace ptcfs {

int ErrnoOf(const ptc::Status& s) {
  // The causes a writer can act on reach it as they are (a full disk is
  // ENOSPC, not EIO); any other OS error stays the code's errno below.
  switch (s.os_errno()) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case EROFS:
    case ENOTEMPTY:
    case ENAMETOOLONG:
      return s.os_errno();
    default:
      break;
  }
  switch (s.code()) {
    case ptc::Code::kOk:
      return 0;
    case ptc::Code::kInvalidArgument:
      return EINVAL;
    case ptc::Code::kNotFound:
      return ENOENT;
    case ptc::Code::kAlreadyExists:
      return EEXIST;
    case ptc::Code::kPermissionDenied:
      return EACCES;
    case ptc::Code::kFailedPrecondition:
      return EBUSY;
    case ptc::Code::kUnimplemented:
      return ENOSYS;
    case ptc::Code::kCorruption:
    case ptc::Code::kIOError:
    case ptc::Code::kInternal:
      return EIO;
  }
  return EIO;
}

namespace {

// A file the tree lists is never "not found": a shard or dataset file it
// needs is missing, which is an I/O error (EIO) naming that file.
ptc::Status AsReadError(const ptc::Status& s) {
  if (s.code() != ptc::Code::kNotFound) return s;
  return ptc::IOError("missing file: " + s.message());
}

}  // namespace

Filesystem::Filesystem(const MountOptions& options)
    : options_(options),
      views_(MakeViewTrees(options)),
      passthrough_(options.passthrough),
      staging_(options.store + "/" + std::string(kStagingDir)) {}
Filesystem::~Filesystem() {
  if (controller_) {
    // At unmount no file is open: replaced generations kept for open files go now.
    {
      ptc::MutexLock lock(&mu_);
      handles_.clear();
      if (!kept_.empty()) collect_due_ = true;
    }
    controller_->CollectIfIdle();
    controller_->Stop();  // a rewrite's thread serves through this mount and its scrubber
  }
  scrubber_.reset();  // its thread reads the store and reports to the controller
  controller_.reset();
}

ptc::Result<std::unique_ptr<Filesystem>> Filesystem::Create(const MountOptions& options) {
  std::unique_ptr<Filesystem> fs(new Filesystem(options));
  PTC_ASSIGN_OR_RETURN(fs->store_, ptc::Store::Open(options.env ? options.env : ptc::Env::Default(), options.store));
  if (!fs->store_->has_generation()) {
    return ptc::FailedPreconditionError(options.store + ": the store holds no generation yet (import one first)");
  }
  auto generation = fs->store_->CurrentSnapshot();
  PTC_ASSIGN_OR_RETURN(ptc::ModelSpec spec, ptc::SpecFromManifest(*generation), options.store);
  PTC_ASSIGN_OR_RETURN(ptc::ParallelConfig config, ptc::ConfigFromManifest(*generation));
  PTC_ASSIGN_OR_RETURN(std::optional<ptc::DatasetState> dataset, ptc::LoadDatasetState(*fs->store_));
  std::shared_ptr<const ptc::DatasetSource> source;
  if (dataset) {
    PTC_ASSIGN_OR_RETURN(source, ptc::OpenDatasetSource(ptc::Env::Default(), *fs->store_, *dataset),
                         options.store + ": the store's dataset");
  }
  if (!options.in_cluster && options.worker >= 0 && !config.HoldsRanks(options.worker)) {
    return ptc::InvalidArgumentError("worker " + std::to_string(options.worker) + " holds no ranks in config " +
                                     config.ToString() + " (its workers: " + ptc::WorkersText(config) + ")");
  }
  auto checks = std::make_shared<ShardChecks>();
  PTC_ASSIGN_OR_RETURN(ptc::ModelLayout layout, ptc::ModelLayout::Make(std::move(spec), config), options.store);
  PTC_ASSIGN_OR_RETURN(
      auto snap, Snapshot::Create(*fs->store_, generation, std::move(layout), options.worker, checks, dataset, source));
  Filesystem* self = fs.get();
  fs->controller_ = std::make_unique<Controller>(
      fs->store_.get(), options.worker, options.transform_threads, options.compaction, checks, source,
      [self](std::shared_ptr<const Snapshot> s) { self->Serve(s); }, [self] { return self->CollectReplaced(); });
  fs->controller_->SetMegatronNames(options.megatron_names);
  ScrubOptions scrub = options.scrub;
  scrub.enabled = scrub.enabled && options.passthrough;  // only what the kernel reads needs it
  fs->scrubber_ = std::make_unique<Scrubber>(fs->store_.get(), scrub, [self](const std::string& error) {
    self->controller_->RecordError(error);
    ptc::MutexLock lock(&self->mu_);
    self->verbatim_.clear();  // decided again, without the bad file
  });
  fs->scrubber_->Serve(snap);
  ptc::MutexLock lock(&fs->mu_);
  auto root = std::make_shared<Node>();
  fs->AddNode(root);
  auto meta = std::make_shared<Node>();
  root->children[".ptcfs"] = fs->AddNode(meta);
  auto config_node = std::make_shared<Node>();
  config_node->what = Node::ConfigFile{};
  meta->children["config"] = fs->AddNode(config_node);
  auto status_node = std::make_shared<Node>();
  status_node->what = Node::StatusFile{};
  meta->children["status"] = fs->AddNode(status_node);
  fs->snapshot_ = snap;
  fs->announced_ = snap;
  fs->served_sec_ = snap->commit_time().tv_sec;
  fs->served_nsec_ = snap->commit_time().tv_nsec;
  fs->AddTrees(*root, snap);
  return fs;
}

void Filesystem::SetInvalidateCallback(std::function<void(uint64_t, const std::string&)> fn) {
  invalidate_ = std::move(fn);
}

uint64_t Filesystem::AddNode(std::shared_ptr<Node> node) {
  node->ino = next_ino_++;
  nodes_[node->ino] = node;
  return node->ino;
}

ptc::Result<std::shared_ptr<Node>> Filesystem::NodeOf(uint64_t ino) const {
  ptc::MutexLock lock(&mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end()) return ptc::NotFoundError("inode " + std::to_string(ino));
  return it->second;
}

ptc::Result<std::shared_ptr<Filesystem::Handle>> Filesystem::HandleOf(uint64_t fh) const {
  ptc::MutexLock lock(&mu_);
  auto it = handles_.find(fh);
  if (it == handles_.end()) return ptc::InvalidArgumentError("bad file handle");
  return it->second;
}

std::shared_ptr<const Snapshot> Filesystem::snapshot() const {
  ptc::MutexLock lock(&mu_);
  return snapshot_;
}

std::shared_ptr<const Snapshot> Filesystem::Announced() const {
  ptc::MutexLock lock(&mu_);
  return announced_;
}

std::string Filesystem::StagedPath(const Node& node) const {
  ptc::MutexLock lock(&mu_);
  return StagedOf(node);
}

void Filesystem::AddTrees(Node& root, const std::shared_ptr<const Snapshot>& snap) {
  // The replaced trees stay in nodes_ until the kernel forgets them.
  for (const std::unique_ptr<ViewTree>& view : views_) {
    const std::string name(view->name());
    auto files = view->Build(snap);
    if (!files.ok()) {
      root.children.erase(name);
      controller_->RecordError(name + "/: " + files.status().message());
      continue;
    }
    root.children[name] = AddNode(BuildViewTree(*view, snap, std::move(files).value()));
  }
  if (snap->dataset()) root.children["data"] = AddNode(BuildDataTree(snap));
}

std::shared_ptr<Node> Filesystem::BuildViewTree(const ViewTree& view, const std::shared_ptr<const Snapshot>& snap,
                                                std::vector<TreeFile> files) {
  auto top = NewDir(snap);
  if (view.saves() != SaveKind::kNone) {
    top->what = Node::SaveDir{view.saves()};
    StagedOf(*top) = view.saves() == SaveKind::kDcp ? std::string(kDcpStaging) : "";
  }
  std::map<std::string, Node*> dirs{{"", top.get()}};  // by path below the view's directory
  for (TreeFile& f : files) {
    const size_t slash = f.path.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : f.path.substr(0, slash);
    Node* dir = top.get();
    size_t at = 0;
    while (at < parent.size()) {  // each directory of its path, made on first use
      const size_t end = std::min(parent.find('/', at), parent.size());
      const std::string path = parent.substr(0, end);
      auto [it, added] = dirs.emplace(path, nullptr);
      if (added) {
        auto d = NewDir(snap);
        it->second = d.get();
        dir->children[parent.substr(at, end - at)] = AddNode(std::move(d));
      }
      dir = it->second;
      at = end + 1;
    }
    auto n = std::make_shared<Node>();
    if (f.renderer) {
      n->what = Node::Rendered{std::move(f.renderer), f.kernel_readable};
    } else if (f.commits_save) {
      n->what = Node::Latest{std::move(f.literal)};
    } else {
      n->what = Node::Literal{std::move(f.literal)};
    }
    n->snap = snap;
    n->size = f.size;
    dir->children[slash == std::string::npos ? f.path : f.path.substr(slash + 1)] = AddNode(std::move(n));
  }
  if (top->kind() == Node::kSaveDir) AddStaged(*top, snap);  // saves under way
  return top;
}

std::shared_ptr<Node> Filesystem::NewDir(const std::shared_ptr<const Snapshot>& snap) {
  auto dir = std::make_shared<Node>();
  dir->snap = snap;  // so that Forget can drop it once replaced
  return dir;
}

std::shared_ptr<Node> Filesystem::BuildDataTree(const std::shared_ptr<const Snapshot>& snap) {
  const ptc::DatasetState& state = *snap->dataset();
  const size_t groups = state.length_buckets.size();
  auto data = NewDir(snap);
  auto add_files = [&](Node& dir, int dp_rank, std::optional<size_t> group) REQUIRES(mu_) {
    for (ptc::ViewFile f : ptc::ViewFiles(state.format)) {
      auto n = std::make_shared<Node>();
      n->what = Node::Data{dp_rank, f, group};
      n->snap = snap;
      dir.children[std::string(ptc::ViewFileName(f))] = AddNode(n);
    }
  };
  for (const ptc::RankView& view : snap->views()) {
    auto dir = NewDir(snap);
    const int dp_rank = snap->config().CoordsOf(view.rank).dp;
    if (groups == 0) {
      add_files(*dir, dp_rank, std::nullopt);
    } else {
      for (size_t g = 0; g < groups; ++g) {
        auto group_dir = NewDir(snap);
        add_files(*group_dir, dp_rank, g);
        dir->children["group-" + std::to_string(g)] = AddNode(group_dir);
      }
    }
    data->children[ptc::RankDirName(view.rank)] = AddNode(dir);
  }
  return data;
}

void Filesystem::StartBackground() { scrubber_->Start(); }

void Filesystem::Serve(std::shared_ptr<const Snapshot> snap) {
  {
    ptc::MutexLock lock(&mu_);
    if (snap->generation() != snapshot_->generation()) collect_due_ = true;
    snapshot_ = snap;
    served_sec_ = snap->commit_time().tv_sec;
    served_nsec_ = snap->commit_time().tv_nsec;
    // Nodes of the replaced trees that the kernel does not know go now; the
    // others when it forgets them (Forget).
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      it = it->second->snap && LookupsOf(*it->second) == 0 ? nodes_.erase(it) : std::next(it);
    }
    std::erase_if(verbatim_, [&](const auto& v) REQUIRES(mu_) { return !nodes_.count(v.first); });
    AddTrees(*nodes_.at(kRootInode), snap);
  }
  if (invalidate_) {
    for (const std::unique_ptr<ViewTree>& view : views_) invalidate_(kRootInode, std::string(view->name()));
    invalidate_(kRootInode, "data");
  }
  if (scrubber_) scrubber_->Serve(snap);
  ptc::MutexLock lock(&mu_);
  if (snapshot_ == snap) announced_ = snap;  // unless a later Serve replaced it meanwhile: that one announces
}

ptc::Status Filesystem::CollectReplaced() {
  std::set<uint64_t> live;  // the generations open files read (a file opens its shard files lazily)
  {
    ptc::MutexLock lock(&mu_);
    if (!collect_due_) return ptc::Status::OK();
    collect_due_ = false;
    for (const auto& [fh, h] : handles_) {
      if (h->node->snap) live.insert(h->node->snap->generation());
    }
    kept_ = live;
    kept_.erase(snapshot_->generation());
  }
  ptc::Status s = store_->CollectGarbage(live);
  if (s.code() == ptc::Code::kFailedPrecondition) return ptc::Status::OK();  // a writer: removed after the next commit
  return s;
}

ptc::Result<uint64_t> Filesystem::SizeOf(const Node& n) const {
  if (n.kind() == Node::kStagedFile) {
    PTC_ASSIGN_OR_RETURN(struct stat st, staging_.Stat(StagedPath(n)));
    return static_cast<uint64_t>(st.st_size);
  }
  const auto* data = std::get_if<Node::Data>(&n.what);
  if (data == nullptr) return n.size;
  PTC_ASSIGN_OR_RETURN(auto view, n.snap->DataView(data->dp_rank, data->group));
  return view->FileSize(data->file);
}

struct stat Filesystem::Attr(const Node& n, uint64_t size) const {
  struct stat st = {};
  st.st_ino = n.ino;
  const bool writable = n.kind() == Node::kConfig || n.kind() == Node::kLatestFile || n.kind() == Node::kStagedFile ||
                        n.kind() == Node::kSaveDir || n.kind() == Node::kStagedDir;
  st.st_nlink = n.is_dir() ? 2 : 1;
  st.st_mode = (n.is_dir() ? S_IFDIR | 0555 : S_IFREG | 0444) | (writable ? 0200 : 0);
  st.st_size = static_cast<off_t>(size);
  st.st_blksize = 512 * 1024;
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  // Every file and directory dates from the commit of the generation it shows.
  struct timespec t = {static_cast<time_t>(served_sec_.load()), static_cast<long>(served_nsec_.load())};
  if (n.snap) t = n.snap->commit_time();
  st.st_atim = st.st_mtim = st.st_ctim = t;
  return st;
}

ptc::Result<Entry> Filesystem::Lookup(uint64_t parent, const std::string& name) {
  std::shared_ptr<Node> node;
  {
    ptc::MutexLock lock(&mu_);
    auto p = nodes_.find(parent);
    if (p == nodes_.end() || !p->second->is_dir()) return ptc::NotFoundError("no directory " + std::to_string(parent));
    auto c = p->second->children.find(name);
    if (c == p->second->children.end()) return ptc::NotFoundError(name);
    auto n = nodes_.find(c->second);
    if (n == nodes_.end()) return ptc::NotFoundError(name + ": replaced by a reconfiguration");
    node = n->second;
  }
  PTC_ASSIGN_OR_RETURN(uint64_t size, SizeOf(*node));
  {
    ptc::MutexLock lock(&mu_);
    LookupsOf(*node)++;
  }
  return Entry{node->ino, Attr(*node, size), Timeout(*node)};
}

void Filesystem::Forget(uint64_t ino, uint64_t n) {
  ptc::MutexLock lock(&mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end() || ino == kRootInode) return;
  Node& node = *it->second;
  uint64_t& lookups = LookupsOf(node);
  lookups = lookups > n ? lookups - n : 0;
  // Nodes of replaced trees go once the kernel has forgotten them.
  if (lookups == 0 && node.snap && node.snap != snapshot_) nodes_.erase(it);
}

double Filesystem::Timeout(const Node& node) {
  switch (node.kind()) {
    case Node::kConfig:
    case Node::kStatus:
    case Node::kSaveDir:
    case Node::kLatestFile:
    case Node::kStagedDir:
    case Node::kStagedFile:
      return 0.0;  // change without a new inode
    default:
      return kModelTimeout;
  }
}

ptc::Result<Entry> Filesystem::GetAttr(uint64_t ino) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, NodeOf(ino));
  PTC_ASSIGN_OR_RETURN(uint64_t size, SizeOf(*node));
  struct stat st = Attr(*node, size);
  if (node->kind() == Node::kConfig) st.st_size = static_cast<off_t>(Announced()->config().ToString().size() + 1);
  if (node->kind() == Node::kStatus) {
    st.st_size = static_cast<off_t>(controller_->StatusJson(Announced(), PassthroughStatus()).size());
  }
  return Entry{ino, st, Timeout(*node)};
}

ptc::Result<std::vector<DirEntry>> Filesystem::ReadDir(uint64_t ino) {
  ptc::MutexLock lock(&mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end()) return ptc::NotFoundError("inode " + std::to_string(ino));
  if (!it->second->is_dir()) return ptc::InvalidArgumentError("not a directory");
  std::vector<DirEntry> out;
  for (const auto& [name, child] : it->second->children) {
    auto c = nodes_.find(child);
    if (c == nodes_.end()) continue;  // of a replaced tree, forgotten
    out.push_back({name, child, c->second->is_dir() ? mode_t(S_IFDIR) : mode_t(S_IFREG)});
  }
  return out;
}

ptc::Result<std::unique_ptr<VirtualFile>> Filesystem::Render(const Node& n) const {
  const auto* rendered = std::get_if<Node::Rendered>(&n.what);
  if (rendered == nullptr) return ptc::InternalError("not a rendered file");
  return rendered->renderer->Render();
}

ptc::Result<OpenReply> Filesystem::Open(uint64_t ino, int flags) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, NodeOf(ino));
  if (node->is_dir()) return ptc::Status(ptc::Code::kInvalidArgument, "is a directory");
  const bool writing = (flags & O_ACCMODE) != O_RDONLY;
  if (node->kind() == Node::kStagedFile || node->kind() == Node::kLatestFile) {
    ptc::MutexLock staging(&staging_mu_);
    return OpenMegatronWritable(node, flags);
  }
  if (writing && node->kind() != Node::kConfig) {
    return ptc::Status(ptc::Code::kPermissionDenied, "model files are read-only");
  }
  auto h = std::make_shared<Handle>();
  h->node = node;
  OpenReply reply;
  if (node->kind() == Node::kConfig || node->kind() == Node::kStatus) {
    reply.direct_io = true;  // content changes; never cached
    if (!writing) {
      std::string text = node->kind() == Node::kConfig ? Announced()->config().ToString() + "\n"
                                                     : controller_->StatusJson(Announced(), PassthroughStatus());
      ptc::MutexLock lock(&h->mu);
      h->text = std::move(text);
    }
  } else if (node->kind() == Node::kDataFile) {
    const auto& data = std::get<Node::Data>(node->what);
    auto view = node->snap->DataView(data.dp_rank, data.group);
    if (!view.ok()) {
      ptc::Status s = AsReadError(view.status());
      controller_->RecordError(s.message());
      return s;
    }
    h->what = Handle::Data{*view};
    reply.keep_cache = true;
  } else if (node->kind() == Node::kRenderedFile) {
    auto file = Render(*node);
    if (!file.ok()) {
      ptc::Status s = AsReadError(file.status());
      controller_->RecordError(s.message());
      return s;
    }
    Handle::Rendered rendered{std::move(file).value()};
    reply.keep_cache = true;
    if (node->kernel_readable()) {
      if (ptc::Status s = OpenPassthrough(*node, *rendered.file, &reply); !s.ok()) {
        controller_->RecordError(s.message());
        return s;
      }
      rendered.backed = reply.backing_id > 0;
    }
    h->what = std::move(rendered);
  } else {
    ptc::MutexLock lock(&h->mu);
    h->text = std::get<Node::Literal>(node->what).text;
    reply.keep_cache = true;
  }
  ptc::MutexLock lock(&mu_);
  reply.fh = next_fh_++;
  handles_[reply.fh] = std::move(h);
  return reply;
}

ptc::Result<ReadReply> Filesystem::Read(uint64_t fh, uint64_t offset, size_t size) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Handle> h, HandleOf(fh));
  ReadReply reply;
  if (h->fd() >= 0) {
    reply.bytes.resize(size);
    const ssize_t n = ::pread(h->fd(), reply.bytes.data(), size, static_cast<off_t>(offset));
    if (n < 0) {
      const int err = errno;
      return ptc::ErrnoError(staging_.Path(StagedPath(*h->node)), err);
    }
    reply.bytes.resize(static_cast<size_t>(n));
    return reply;
  }
  if (const ptc::RankDataView* data = h->data()) {
    reply.bytes.resize(size);
    auto n = data->Read(std::get<Node::Data>(h->node->what).file, offset, size, reply.bytes.data());
    if (!n.ok()) {
      ptc::Status s = AsReadError(n.status());
      controller_->RecordError(s.message());
      return s;
    }
    reply.bytes.resize(*n);
    return reply;
  }
  const VirtualFile* file = h->file();
  if (file == nullptr) {
    ptc::MutexLock lock(&h->mu);
    if (offset < h->text.size()) {
      const size_t n = std::min<size_t>(size, h->text.size() - offset);
      reply.bytes.assign(h->text.data() + offset, h->text.data() + offset + n);
    }
    return reply;
  }
  const Snapshot& snap = *h->node->snap;
  auto check = [&](const ptc::ShardRecord& shard, uint64_t at, uint64_t n) { return snap.Check(shard, at, n); };
  VirtualFile::FdRange range = file->SingleShardRange(offset, size);
  if (range.fd >= 0) {
    reply.fd_length = static_cast<size_t>(std::min<uint64_t>(size, file->size() - offset));
    if (ptc::Status s = AsReadError(check(*range.shard, range.position - range.shard->offset, reply.fd_length));
        !s.ok()) {
      controller_->RecordError(s.message());
      return s;
    }
    reply.fd_range = range;
    return reply;
  }
  reply.bytes.resize(size);
  auto n = file->Read(offset, size, reply.bytes.data(), check);
  if (!n.ok()) {
    ptc::Status s = AsReadError(n.status());
    controller_->RecordError(s.message());
    return s;
  }
  reply.bytes.resize(*n);
  return reply;
}

ptc::Result<size_t> Filesystem::Write(uint64_t fh, const char* data, size_t size, uint64_t offset) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Handle> h, HandleOf(fh));
  if (h->node->kind() == Node::kStagedFile || h->node->kind() == Node::kLatestFile) {
    return WriteMegatron(*h, data, size, offset);
  }
  if (h->node->kind() != Node::kConfig) return ptc::Status(ptc::Code::kPermissionDenied, "read-only file");
  std::string request;
  {
    ptc::MutexLock lock(&h->mu);
    if (offset != h->text.size()) return ptc::InvalidArgumentError("write the config in one go from the start");
    h->text.append(data, size);
    request = h->text;
  }
  if (ptc::Status s = controller_->Reconfigure(request, snapshot()); !s.ok()) {
    // Not taken: the same write may come again (a writer's buffer flushed
    // once more at close) and gets the same answer, not "in one go".
    ptc::MutexLock lock(&h->mu);
    h->text.resize(offset);
    return s;
  }
  return size;
}

ptc::Status Filesystem::ApplyRelayout(const std::string& request, std::shared_ptr<AgreedChange> change) {
  return controller_->Apply(request, snapshot(), std::move(change));
}

ptc::Status Filesystem::ApplyCompaction(bool rank_files, std::shared_ptr<AgreedChange> change) {
  return controller_->ApplyCompaction(rank_files, snapshot(), std::move(change));
}

ptc::Status Filesystem::Truncate(uint64_t ino, uint64_t size) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, NodeOf(ino));
  if (node->kind() == Node::kStagedFile) {
    ptc::MutexLock staging(&staging_mu_);
    const std::string path = StagedPath(*node);
    PTC_RETURN_IF_ERROR(CheckNotSealed(path));
    return staging_.Truncate(path, size);
  }
  if (node->kind() != Node::kConfig && node->kind() != Node::kLatestFile) {
    return ptc::Status(ptc::Code::kPermissionDenied, "read-only file");
  }
  return ptc::Status::OK();  // replaced as a whole by the next write
}

ptc::Status Filesystem::ChangeModeOrOwner(uint64_t ino) {
  PTC_ASSIGN_OR_RETURN(std::shared_ptr<Node> node, NodeOf(ino));
  if (node->kind() == Node::kStagedFile || node->kind() == Node::kStagedDir) return ptc::Status::OK();  // ignored
  return ptc::Status(ptc::Code::kPermissionDenied, "the mount's files keep their mode and owner");
}

void Filesystem::Release(uint64_t fh) {
  std::shared_ptr<Handle> closed;  // destroyed (its descriptors closed) outside mu_
  {
    ptc::MutexLock lock(&mu_);
    auto it = handles_.find(fh);
    if (it == handles_.end()) return;
    closed = std::move(it->second);
    handles_.erase(it);
    if (closed->backed()) passthrough_.Release(closed->node->ino);
    if (!closed->node->snap || !kept_.count(closed->node->snap->generation())) return;
    const uint64_t g = closed->node->snap->generation();
    for (const auto& [other, h] : handles_) {
      if (h->node->snap && h->node->snap->generation() == g) return;  // still read
    }
    kept_.erase(g);
    collect_due_ = true;
  }
  closed.reset();
  controller_->CollectIfIdle();
}

}  // namespace ptcfs
