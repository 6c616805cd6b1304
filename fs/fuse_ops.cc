// The FUSE edge: each callback calls one Filesystem method and sends exactly
// one reply. Nothing here decides anything.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "fs/fuse_io.h"
#include "fs/mount.h"
#include "fs/mountinfo.h"

namespace ptcfs {
namespace {

// Spliced replies above ~1 MiB need a larger pipe than root may configure
// here; libfuse would silently copy. Reads are capped at 512 KiB.
constexpr unsigned kMaxIo = 512 * 1024;

// The kernel reads ahead at most min(the mount's bdi read_ahead_kb, the
// max_readahead of the INIT reply), and a FUSE mount's bdi starts at 128 KiB:
// a sequential first read then waits on one 128 KiB request after another,
// and on each 4 MiB checksum block verified on the way. 4 MiB keeps up to
// eight 512 KiB requests of one reader in flight (a larger window made one
// reader's first reads slower). The window grows to this only on sequential
// reads.
constexpr unsigned kReadahead = 4 << 20;

// The kernel keeps at most max_background asynchronous requests (readahead)
// in flight per mount and stops reading ahead past congestion_threshold of
// them; its defaults (12 and 9) are one reader's window at most, so
// concurrent readers (a rank's loader each) waited on synchronous reads
// instead. Eight readers' windows of eight requests fit under these.
constexpr unsigned kMaxBackground = 96;
constexpr unsigned kCongestionThreshold = 72;

Filesystem* Fs(fuse_req_t req) { return static_cast<Filesystem*>(fuse_req_userdata(req)); }

// The one place an exception from a callback's work is caught: the request
// fails with EIO (or, for forget, gets its no-reply) and the exception is kept
// as last_error. The daemon never ends on an input. The callbacks reply as
// their last step, so a caught exception means no reply was sent.
template <auto Op, bool kReplies = true>
struct Guarded;
template <typename... Args, void (*Op)(fuse_req_t, Args...), bool kReplies>
struct Guarded<Op, kReplies> {
  static void Call(fuse_req_t req, Args... args) noexcept {
    try {
      Op(req, args...);
      return;
    } catch (const std::exception& e) {
      Record(req, e.what());
    } catch (...) {
      Record(req, "unknown exception");
    }
    if (kReplies) {
      fuse_reply_err(req, EIO);
    } else {
      fuse_reply_none(req);
    }
  }
  static void Record(fuse_req_t req, const char* what) noexcept {
    try {
      Fs(req)->controller().RecordError(std::string("internal error: ") + what);
    } catch (...) {  // out of memory: the EIO alone
    }
  }
};

void OpInit(void* userdata, struct fuse_conn_info* conn) {
  conn->max_write = kMaxIo;          // also sets max_pages, hence the largest read
  conn->max_read = kMaxIo;           // must match the max_read mount option
  conn->max_readahead = kReadahead;  // with SetMountReadahead
  conn->max_background = kMaxBackground;
  conn->congestion_threshold = kCongestionThreshold;
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;  // invalidation is explicit
}

struct fuse_entry_param EntryParam(const Entry& e) {
  struct fuse_entry_param p = {};
  p.ino = e.ino;
  p.attr = e.attr;
  p.attr_timeout = e.timeout;
  p.entry_timeout = e.timeout;
  return p;
}

void OpLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto e = Fs(req)->Lookup(parent, name);
  if (!e.ok()) {
    fuse_reply_err(req, ErrnoOf(e.status()));
    return;
  }
  struct fuse_entry_param p = EntryParam(*e);
  fuse_reply_entry(req, &p);
}

void OpForget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  Fs(req)->Forget(ino, n);
  fuse_reply_none(req);
}

void OpForgetMulti(fuse_req_t req, size_t count, struct fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) Fs(req)->Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OpGetAttr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info*) {
  auto e = Fs(req)->GetAttr(ino);
  if (!e.ok()) {
    fuse_reply_err(req, ErrnoOf(e.status()));
    return;
  }
  fuse_reply_attr(req, &e->attr, e->timeout);
}

void OpSetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, struct fuse_file_info* fi) {
  if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    // Modes and owners are the mount's: refused (EPERM) but for staged saves.
    ptc::Status s = Fs(req)->ChangeModeOrOwner(ino);
    if (!s.ok()) {
      fuse_reply_err(req, s.code() == ptc::Code::kPermissionDenied ? EPERM : ErrnoOf(s));
      return;
    }
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    ptc::Status s = Fs(req)->Truncate(ino, attr->st_size);
    if (!s.ok()) {
      fuse_reply_err(req, ErrnoOf(s));
      return;
    }
  }
  OpGetAttr(req, ino, fi);
}

void OpReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info*) {
  auto entries = Fs(req)->ReadDir(ino);
  if (!entries.ok()) {
    fuse_reply_err(req, ErrnoOf(entries.status()));
    return;
  }
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < entries->size(); ++i) {
    struct stat st = {};
    st.st_ino = (*entries)[i].ino;
    st.st_mode = (*entries)[i].mode;
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, (*entries)[i].name.c_str(), &st,
                                    static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OpOpen(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info* fi) {
  auto r = Fs(req)->Open(ino, fi->flags);
  if (!r.ok()) {
    fuse_reply_err(req, ErrnoOf(r.status()));
    return;
  }
  // A backing id travels in the fh to the custom I/O, which moves it where
  // the kernel looks (fs/fuse_io.h); handles are counted from 1, far below 2^32.
  fi->fh = r->fh >> 32 ? r->fh : EncodeOpenFh(r->fh, r->backing_id);
  fi->direct_io = r->direct_io;
  fi->keep_cache = r->keep_cache;
  fuse_reply_open(req, fi);
}

void OpRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, struct fuse_file_info* fi) {
  auto r = Fs(req)->Read(fi->fh, static_cast<uint64_t>(off), size);
  if (!r.ok()) {
    fuse_reply_err(req, ErrnoOf(r.status()));
    return;
  }
  if (r->fd_range.fd >= 0) {
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(r->fd_length);
    buf.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    buf.buf[0].fd = r->fd_range.fd;
    buf.buf[0].pos = static_cast<off_t>(r->fd_range.position);
    fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
    return;
  }
  fuse_reply_buf(req, r->bytes.data(), r->bytes.size());
}

void OpWrite(fuse_req_t req, fuse_ino_t, const char* data, size_t size, off_t off, struct fuse_file_info* fi) {
  auto r = Fs(req)->Write(fi->fh, data, size, static_cast<uint64_t>(off));
  if (!r.ok()) {
    fuse_reply_err(req, ErrnoOf(r.status()));
    return;
  }
  fuse_reply_write(req, *r);
}

void OpRelease(fuse_req_t req, fuse_ino_t, struct fuse_file_info* fi) {
  Fs(req)->Release(fi->fh);
  fuse_reply_err(req, 0);
}

void OpFlush(fuse_req_t req, fuse_ino_t, struct fuse_file_info* fi) {
  fuse_reply_err(req, ErrnoOf(Fs(req)->Flush(fi->fh)));
}

void OpFsync(fuse_req_t req, fuse_ino_t, int, struct fuse_file_info* fi) {
  fuse_reply_err(req, ErrnoOf(Fs(req)->Fsync(fi->fh)));
}

void OpMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t) {
  auto e = Fs(req)->Mkdir(parent, name);
  if (!e.ok()) {
    fuse_reply_err(req, ErrnoOf(e.status()));
    return;
  }
  struct fuse_entry_param p = EntryParam(*e);
  fuse_reply_entry(req, &p);
}

void OpCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t, struct fuse_file_info* fi) {
  auto r = Fs(req)->Create(parent, name, fi->flags);
  if (!r.ok()) {
    fuse_reply_err(req, ErrnoOf(r.status()));
    return;
  }
  const auto& [e, open] = *r;
  struct fuse_entry_param p = EntryParam(e);
  fi->fh = EncodeOpenFh(open.fh, open.backing_id);  // as OpOpen: a save's new file written by the kernel
  fi->direct_io = open.direct_io;
  fuse_reply_create(req, &p, fi);
}

void OpRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
              unsigned int flags) {
  if (flags != 0) {  // RENAME_EXCHANGE / RENAME_NOREPLACE
    fuse_reply_err(req, EINVAL);
    return;
  }
  fuse_reply_err(req, ErrnoOf(Fs(req)->Rename(parent, name, new_parent, new_name)));
}

void OpUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, ErrnoOf(Fs(req)->Unlink(parent, name, /*directory=*/false)));
}

void OpRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  fuse_reply_err(req, ErrnoOf(Fs(req)->Unlink(parent, name, /*directory=*/true)));
}

struct fuse_lowlevel_ops MakeOps() {
  struct fuse_lowlevel_ops ops = {};
  ops.init = OpInit;
  ops.lookup = Guarded<OpLookup>::Call;
  ops.forget = Guarded<OpForget, /*kReplies=*/false>::Call;
  ops.forget_multi = Guarded<OpForgetMulti, /*kReplies=*/false>::Call;
  ops.getattr = Guarded<OpGetAttr>::Call;
  ops.setattr = Guarded<OpSetAttr>::Call;
  ops.readdir = Guarded<OpReadDir>::Call;
  ops.open = Guarded<OpOpen>::Call;
  ops.read = Guarded<OpRead>::Call;
  ops.write = Guarded<OpWrite>::Call;
  ops.release = Guarded<OpRelease>::Call;
  ops.flush = Guarded<OpFlush>::Call;
  ops.fsync = Guarded<OpFsync>::Call;
  ops.mkdir = Guarded<OpMkdir>::Call;
  ops.create = Guarded<OpCreate>::Call;
  ops.rename = Guarded<OpRename>::Call;
  ops.unlink = Guarded<OpUnlink>::Call;
  ops.rmdir = Guarded<OpRmdir>::Call;
  return ops;
}

// Raises the readahead of the FUSE mount just made at `mountpoint` to `bytes`
// (its bdi's read_ahead_kb), before the INIT reply: the kernel then keeps
// min(this, max_readahead). Best effort: without the right to write
// /sys/class/bdi (not root), or when the mount is not found, the kernel's
// default (128 KiB) stays. Must not touch the mount itself: nothing answers
// its requests yet (the parent directory is resolved, not the mountpoint).
void SetMountReadahead(const std::string& mountpoint, unsigned bytes) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(mountpoint, ec).lexically_normal();
  if (ec) return;
  if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
  const std::filesystem::path parent = std::filesystem::canonical(p.parent_path(), ec);
  if (ec) return;
  const std::string device = MountDevice((parent / p.filename()).string());
  if (device.empty()) return;
  std::ofstream out("/sys/class/bdi/" + device + "/read_ahead_kb");
  out << bytes / 1024 << "\n";
}

}  // namespace

ptc::Status MountAndServe(const MountOptions& options, const SessionOptions& session) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<Filesystem> fs, Filesystem::Create(options));
  const struct fuse_lowlevel_ops ops = MakeOps();
  std::vector<std::string> argv_s = {"ptcfs", "-o", "fsname=ptcfs,subtype=ptcfs,max_read=" + std::to_string(kMaxIo)};
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  struct fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  struct fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), fs.get());
  if (se == nullptr) return ptc::IOError("fuse_session_new failed");
  fs->SetInvalidateCallback([se](uint64_t parent, const std::string& name) {
    fuse_lowlevel_notify_inval_entry(se, parent, name.c_str(), name.size());
  });
  ptc::Status result;
  if (fuse_set_signal_handlers(se) != 0) {
    result = ptc::IOError("cannot install signal handlers");
  } else if (fuse_session_mount(se, session.mountpoint.c_str()) != 0) {
    result = ptc::IOError(session.mountpoint + ": mount failed (does the directory exist? is FUSE available?)");
  } else if (options.passthrough && !(result = InstallPassthroughIo(se, fs->passthrough())).ok()) {
    fuse_session_unmount(se);
  } else {
    SetMountReadahead(session.mountpoint, kReadahead);
    if (!session.foreground) fuse_daemonize(0);
    fs->StartBackground();  // threads do not cross the fork
    std::shared_ptr<void> attached;
    if (session.attach) {
      auto a = session.attach(*fs);
      if (a.ok()) {
        attached = std::move(a).value();
      } else {
        result = a.status();
        std::fprintf(stderr, "ptcfs mount: %s\n", result.ToString().c_str());
      }
    }
    if (result.ok()) {
      struct fuse_loop_config* config = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(config, static_cast<unsigned>(session.threads));
      fuse_loop_cfg_set_clone_fd(config, 1);
      if (fuse_session_loop_mt(se, config) != 0) result = ptc::IOError("FUSE session loop failed");
      fuse_loop_cfg_destroy(config);
    }
    attached.reset();  // its threads end before the file system goes
    fuse_session_unmount(se);
  }
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  return result;
}

}  // namespace ptcfs
