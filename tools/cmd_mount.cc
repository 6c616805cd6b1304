// ptcfs mount / reconfigure / umount (and `ptcfs cluster`: cmd_cluster.cc).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "fs/mount.h"
#include "fs/mountinfo.h"
#include "ptc/base/json_fields.h"
#include "ptc/base/regular_file.h"
#include "ptc/checkpoint/hf/hf.h"
#include "tools/cli_numbers.h"
#include "tools/cluster_mount.h"
#include "tools/commands.h"
#include "tools/path_check.h"
#include "tools/progress.h"

namespace ptcfs {
namespace {

struct MountArgs {
  std::string store, mountpoint, format = "both";
  std::optional<std::string> names;          // --names, megatron/ only
  std::optional<std::string> ckpt_format;    // --ckpt-format, megatron/ only
  std::optional<std::string> dcp_names;      // --dcp-names, dcp/ only
  std::optional<std::string> hf_shard_size;  // --hf-shard-size, hf/ only
  int worker = -1;
  int threads = 8;
  int transform_threads = 2;
  bool foreground = false;
  bool nonempty = false;
  bool wait = false;  // for the writer lock
  CompactionPolicy compaction;
  std::string passthrough = "auto";
  int64_t scrub_interval = 3600;  // seconds
  int64_t scrub_rate = 256;       // MiB/s; 0: off
  std::string rank_file_copies = "stored";
  ClusterArgs cluster;
};

// Refuses a mountpoint that is not an existing directory, is already a mount
// point, or (unless `nonempty`) holds entries: each names the path.
ptc::Status CheckMountpoint(const std::string& mountpoint, bool nonempty) {
  struct stat st;
  if (stat(mountpoint.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOTCONN) {
      return ptc::FailedPreconditionError(mountpoint + ": a disconnected mount is there (ptcfs umount " + mountpoint +
                                          ")");
    }
    if (err == ENOENT) return ptc::NotFoundError(mountpoint + ": no such directory (create it first)");
    return ptc::ErrnoError(mountpoint, err);
  }
  if (!S_ISDIR(st.st_mode)) return ptc::InvalidArgumentError(mountpoint + ": not a directory");
  std::error_code ec;
  const std::string canonical = std::filesystem::canonical(mountpoint, ec).string();
  if (!ec && !MountDevice(canonical).empty()) {
    return ptc::FailedPreconditionError(mountpoint + ": already a mount point (unmount it first)");
  }
  if (!nonempty && !std::filesystem::is_empty(mountpoint, ec)) {
    return ptc::FailedPreconditionError(mountpoint + ": directory is not empty (--nonempty mounts over it)");
  }
  return ptc::Status::OK();
}

// The writer lock for the daemon's whole life, taken before the store is read;
// the daemon keeps it across fuse_daemonize's fork. With `wait`, a held lock
// is waited for as the other writers wait (LockStore): saying whom on stderr.
// `create`: the directory may be no store yet (a cluster worker joining with
// an empty disk takes its job's generation from a peer).
ptc::Result<ptc::StoreLock> LockForMount(const std::string& store, bool wait, bool create) {
  ptc::StoreLockOptions options = WriterLockOptions(false, create);
  options.follow_fork = true;
  ptc::Result<ptc::StoreLock> lock = ptc::StoreLock::Acquire(store, options);
  if (lock.ok() || lock.status().code() != ptc::Code::kFailedPrecondition) return lock;
  if (!wait) {
    return ptc::FailedPreconditionError(lock.status().message() +
                                        "; a store has one mount (or writer) at a time (--wait waits for it)");
  }
  std::fprintf(stderr, "%s; waiting\n", lock.status().message().c_str());
  options.wait = true;
  return ptc::StoreLock::Acquire(store, options);
}

ptc::Status RunMount(const MountArgs& a) {
  if (a.ckpt_format && a.format != "megatron" && a.format != "all") {
    return ptc::InvalidArgumentError("--ckpt-format " + *a.ckpt_format +
                                     ": the format of megatron/ (--format megatron or all)");
  }
  if (a.dcp_names && a.format != "dcp" && a.format != "all") {
    return ptc::InvalidArgumentError("--dcp-names " + *a.dcp_names + ": names the keys of dcp/ (--format dcp or all)");
  }
  if (a.names && a.format != "megatron" && a.format != "all") {
    return ptc::InvalidArgumentError("--names " + *a.names +
                                     ": names the files of megatron/ (--format megatron or all)");
  }
  if (a.hf_shard_size && a.format != "hf" && a.format != "all") {
    return ptc::InvalidArgumentError("--hf-shard-size " + *a.hf_shard_size +
                                     ": sizes the shards of hf/ (--format hf or all)");
  }
  uint64_t hf_shard_bytes = ptc::hf::kDefaultShardBytes;
  if (a.hf_shard_size) {
    PTC_ASSIGN_OR_RETURN(hf_shard_bytes, ptc::hf::ParseShardSize(*a.hf_shard_size), "--hf-shard-size");
  }
  PTC_RETURN_IF_ERROR(CheckMountpoint(a.mountpoint, a.nonempty));
  PTC_RETURN_IF_ERROR(CheckMountpointApart(a.store, a.mountpoint));
  PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockForMount(a.store, a.wait, /*create=*/!a.cluster.url.empty()));
  if (a.wait) PTC_RETURN_IF_ERROR(CheckMountpoint(a.mountpoint, a.nonempty));  // it may have changed meanwhile
  MountOptions options;
  // The daemon changes its directory to /: keep the store path absolute.
  options.store = std::filesystem::absolute(a.store).lexically_normal().string();
  options.worker = a.worker;
  options.safetensors = a.format == "safetensors" || a.format == "both" || a.format == "all";
  options.npy = a.format == "npy" || a.format == "both" || a.format == "all";
  options.megatron = a.format == "megatron" || a.format == "all";
  options.dcp = a.format == "dcp" || a.format == "all";
  options.hf = a.format == "hf" || a.format == "all";
  options.hf_shard_bytes = hf_shard_bytes;
  PTC_ASSIGN_OR_RETURN(options.megatron_names, ptc::megatron::ParseNameSet(a.names.value_or("te")), "--names");
  options.megatron_torch_dist = a.ckpt_format.value_or("torch") == "torch_dist";
  if (a.dcp_names.value_or("torch") == "torchtitan") options.dcp_keys = ptc::dcp::Keys::kTorchtitan;
  options.transform_threads = a.transform_threads;
  options.compaction = a.compaction;
  options.passthrough = a.passthrough == "auto";
  options.scrub.enabled = a.scrub_rate > 0;
  options.scrub.interval = std::chrono::seconds(a.scrub_interval);
  options.scrub.rate = static_cast<uint64_t>(a.scrub_rate) << 20;
  options.compaction.rank_files = options.passthrough;
  // Rank files are the files the job reads: megatron/'s when the mount shows
  // only that tree (its DCP files for torch_dist), dcp/'s when it shows only dcp/.
  RankFileOptions& rank_files = options.compaction.rank_file_options;
  if (a.format == "megatron" && !options.megatron_torch_dist) {
    rank_files.format = RankFileFormat::kMegatron;
    rank_files.names = options.megatron_names;
  } else if (a.format == "megatron" || a.format == "dcp") {
    rank_files.format = RankFileFormat::kDcp;
    rank_files.dcp_keys = a.format == "dcp" ? options.dcp_keys : ptc::dcp::Keys::kMegatronCore;
  }
  PTC_ASSIGN_OR_RETURN(options.compaction.rank_file_options.copy_budget, ParseCopyBudget(a.rank_file_copies),
                       "--rank-file-copies");
  SessionOptions session{a.mountpoint, a.foreground, a.threads, nullptr};
  std::unique_ptr<worker::Worker> cluster;
  if (!a.cluster.url.empty()) {
    PTC_ASSIGN_OR_RETURN(cluster, PrepareClusterWorker(a.cluster, options.store, a.worker));
    options.env = cluster->env();
    options.in_cluster = true;
    session.attach = [&cluster](Filesystem& fs) { return cluster->Attach(fs); };
  }
  return MountAndServe(options, session);
}

// fusermount3 -u MOUNTPOINT, run without a shell; its complaint becomes ours.
ptc::Status FuseUnmount(const std::string& mountpoint) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return ptc::ErrnoError("umount: pipe", errno);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  const char* argv[] = {"fusermount3", "-u", "--", mountpoint.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, "fusermount3", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; spawned == 0 && (n = read(out[0], buf, sizeof buf)) != 0;) {
    if (n > 0 && said.size() < 4096) said.append(buf, static_cast<size_t>(n));
    if (n < 0 && errno != EINTR) break;
  }
  close(out[0]);
  if (spawned != 0) return ptc::ErrnoError("umount: running fusermount3 (Debian package fuse3)", spawned);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ptc::Status::OK();
  if (said.find("busy") != std::string::npos) {
    return ptc::FailedPreconditionError(mountpoint +
                                        ": busy: a process has a file open there or its working "
                                        "directory in it (`fuser -vm " +
                                        mountpoint +
                                        "` lists them); close them and "
                                        "unmount again");
  }
  if (said.find("not found in") != std::string::npos || said.find("Invalid argument") != std::string::npos) {
    return ptc::InvalidArgumentError(mountpoint + ": not a mount point");
  }
  if (said.find("No such file") != std::string::npos) return ptc::NotFoundError(mountpoint + ": no such directory");
  const size_t colon = said.rfind(": ");
  std::string why = OneLine(colon == std::string::npos ? said : said.substr(colon + 2));
  return ptc::IOError(mountpoint + ": unmount failed: " + (why.empty() ? "fusermount3 failed" : why));
}

ptc::Result<nlohmann::json> ReadStatus(const std::string& mountpoint) {
  // Read without blocking: a FIFO at that path (no mount there) is refused.
  ptc::Result<std::string> text = ptc::ReadRegularFile(mountpoint + "/.ptcfs/status");
  if (text.status().code() == ptc::Code::kNotFound) {
    return ptc::NotFoundError(mountpoint + ": not a ptcfs mount (no .ptcfs/status)");
  }
  PTC_RETURN_IF_ERROR(text.status().WithContext(mountpoint + ": not a ptcfs mount"));
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded()) return ptc::CorruptionError(mountpoint + "/.ptcfs/status: not JSON");
  return j;
}

// Unmounts, then waits (up to a minute) until the daemon that served the
// mount has exited, so that its store is free again: `ptcfs umount M && ptcfs
// mount S M` does not meet the old daemon's lock.
ptc::Status RunUmount(const std::string& mountpoint) {
  pid_t daemon = 0;  // unknown for a disconnected mount: nothing to wait for
  if (auto status = ReadStatus(mountpoint); status.ok() && (*status)["pid"].is_number_integer()) {
    daemon = (*status)["pid"].get<pid_t>();
  }
  PTC_RETURN_IF_ERROR(FuseUnmount(mountpoint));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (daemon > 0 && ::kill(daemon, 0) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      return ptc::FailedPreconditionError(mountpoint + ": unmounted, but its daemon (pid " + std::to_string(daemon) +
                                          ") is still finishing after 60 s; its store stays locked until it exits");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ptc::Status::OK();
}

struct ReconfigureArgs {
  std::string mountpoint, to;
  std::optional<uint64_t> step, epoch;
  bool no_wait = false;
};

// What .ptcfs/config is written: the config, or JSON with the data position.
std::string ConfigRequest(const ReconfigureArgs& a) {
  if (!a.step) return a.to + "\n";
  nlohmann::json j = {{"config", a.to}, {"step", *a.step}};
  if (a.epoch) j["epoch"] = *a.epoch;
  return ptc::JsonText(j) + "\n";
}

ptc::Status RunReconfigure(const ReconfigureArgs& a) {
  const std::string& mountpoint = a.mountpoint;
  PTC_RETURN_IF_ERROR(ReadStatus(mountpoint).status());  // a ptcfs mount
  const std::string path = mountpoint + "/.ptcfs/config";
  PTC_ASSIGN_OR_RETURN(const int fd, ptc::OpenRegularFile(path, O_WRONLY | O_TRUNC, "open for writing"));
  const std::string text = ConfigRequest(a);
  ssize_t n = write(fd, text.data(), text.size());
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    auto status = ReadStatus(mountpoint);
    std::string why = status.ok() && (*status)["last_error"].is_string() ? (*status)["last_error"].get<std::string>()
                                                                         : std::strerror(err);
    // EINVAL: the request is wrong (exit 2, as any bad argument); anything
    // else (EBUSY: a save or change under way) is the mount's state (exit 1).
    if (n < 0 && err != EINVAL) {
      return ptc::FailedPreconditionError("refused (" + std::string(std::strerror(err)) + "): " + why);
    }
    return ptc::InvalidArgumentError("rejected: " + why);
  }
  if (a.no_wait) return ptc::Status::OK();
  std::unique_ptr<Progress> progress;
  uint64_t shown = 0;
  while (true) {
    PTC_ASSIGN_OR_RETURN(nlohmann::json s, ReadStatus(mountpoint));
    // A cluster mount hands the request to the job ("proposed") until its agent applies it.
    const std::string state = s["state"];
    if (state == "repartitioning" && !progress && s["bytes_total"].get<uint64_t>() > 0) {
      progress = std::make_unique<Progress>("reconfigure", s["bytes_total"].get<uint64_t>());
    }
    if (progress && s["bytes_done"].get<uint64_t>() > shown) {
      progress->Add(s["bytes_done"].get<uint64_t>() - shown);
      shown = s["bytes_done"].get<uint64_t>();
    }
    if (state == "serving") {
      progress.reset();
      std::printf("%s: serving %s, generation %llu\n", mountpoint.c_str(), s["config"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(s["generation"].get<uint64_t>()));
      return ptc::Status::OK();
    }
    if (state == "failed") return ptc::IOError("rewrite failed: " + ptc::JsonText(s["last_error"]));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// mount's options for a worker of a cluster job (group "Cluster").
void AddClusterOptions(CLI::App* mount, ClusterArgs* cluster) {
  mount
      ->add_option("--cluster", cluster->url,
                   "etcd://HOST:PORT[,HOST:PORT...]/JOB: this mount is worker --worker of JOB, its state\n"
                   "agreed through etcd; a reconfigure on any worker's mount changes every worker's\n"
                   "(docs/cluster.md). A store behind the job (or an empty directory: a new disk) first\n"
                   "takes the job's committed generation from a live worker. When a worker's lease\n"
                   "expires the others move onto the survivors (configs with replicas=R lose nothing\n"
                   "while fewer than R workers are gone). Needs --worker, --listen and --token-file")
      ->group("Cluster");
  mount->add_option("--listen", cluster->listen, "HOST:PORT: where this worker serves its shard files to the others")
      ->group("Cluster");
  mount->add_option("--token-file", cluster->token_file, "the job's shared token (a file of mode 0600)")
      ->group("Cluster");
  mount->add_option("--lease", cluster->lease_seconds, "seconds after which a silent worker has left the job")
      ->check(CLI::Range(2, 3600))
      ->group("Cluster");
  mount
      ->add_option("--durable", cluster->durable,
                   "DIR or s3://BUCKET/PREFIX: the job's durable tier, a directory every worker sees at\n"
                   "this path (a shared file system) or a bucket (endpoint, region and keys from\n"
                   "AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or\n"
                   "~/.aws/credentials). The workers copy the job's tensors into it once per contents; a\n"
                   "piece that no live worker holds any more (more than replicas-1 workers lost) is read\n"
                   "from it")
      ->group("Cluster");
  mount
      ->add_option("--change-timeout", cluster->timeout_seconds,
                   "seconds a reconfigure may take across the workers before it is aborted")
      ->check(CLI::Range(1, 86400))
      ->group("Cluster");
}

void AddReconfigureCommand(CLI::App& app, int* exit_code) {
  auto r = std::make_shared<ReconfigureArgs>();
  CLI::App* re = app.add_subcommand(
      "reconfigure",
      "Change the parallel config of a mounted store. The new layout is readable at once (served\n"
      "from the current shards); the store is rewritten in the background and this command waits\n"
      "for the commit, showing progress (unless --no-wait). A bad config is rejected, nothing changes.");
  re->footer(
      "With --step S the dataset position moves too: data/rank-RRRRR/ shows, for the new config,\n"
      "the samples each rank reads from step S on (consumed = S x global batch), committed with the\n"
      "new layout. Examples:\n"
      "  ptcfs reconfigure /mnt/ptc --to tp=4,pp=1\n"
      "  ptcfs reconfigure /mnt/ptc --to tp=2,pp=2,dp=3 --step 1200");
  re->add_option("MOUNTPOINT", r->mountpoint, "a ptcfs mount")->required();
  re->add_option("--to", r->to, "new parallel config, e.g. tp=4,pp=1")->required();
  re->add_option("--step", r->step, "training steps taken in the epoch: the data position from which ranks read");
  re->add_option("--epoch", r->epoch, "with --step: the epoch (default: the current one)")->needs("--step");
  re->add_flag("--no-wait", r->no_wait, "return once the new layout is served");
  re->callback([r, exit_code] { *exit_code = Report("reconfigure", RunReconfigure(*r)); });
}

void AddUmountCommand(CLI::App& app, int* exit_code) {
  auto target = std::make_shared<std::string>();
  CLI::App* um = app.add_subcommand(
      "umount", "Unmount a ptcfs mount (fusermount3 -u) and wait until its daemon has exited (its store free).");
  um->add_option("MOUNTPOINT", *target, "a ptcfs mount")->required();
  um->callback([target, exit_code] { *exit_code = Report("umount", RunUmount(*target)); });
}

}  // namespace

void AddMountCommands(CLI::App& app, int* exit_code) {
  auto m = std::make_shared<MountArgs>();
  CLI::App* mount = app.add_subcommand(
      "mount",
      "Serve STORE at MOUNTPOINT: model/rank-RRRRR/model.safetensors (+ optim.safetensors) and\n"
      "model/rank-RRRRR/tensors/<name>.npy for the ranks of --worker (all ranks without it),\n"
      "rendered on read from the stored shards, and data/rank-RRRRR/{ids.txt,samples.idx,samples.bin}\n"
      "when the store holds a dataset; .ptcfs/config and .ptcfs/status control it\n"
      "(docs/mount_format.md). Returns once mounted; `ptcfs umount` stops it. The daemon holds\n"
      "STORE's writer lock while it runs: a second mount of STORE, and import/transform/data\n"
      "commands on it, fail naming the daemon (--wait waits for it). MOUNTPOINT must be an empty\n"
      "directory that is not a mount point already.");
  mount->add_option("STORE", m->store, "store directory")->required();
  mount->add_option("MOUNTPOINT", m->mountpoint, "an existing empty directory")->required();
  mount->add_option("--worker", m->worker, "show only the ranks of this worker");
  mount
      ->add_option("--format", m->format,
                   "which model files to show: safetensors, npy, both (the two; default), megatron\n"
                   "(megatron/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt), dcp (dcp/: PyTorch\n"
                   "Distributed Checkpoint of the whole state, for torch.distributed.checkpoint.load at any\n"
                   "world size; docs/dcp_format.md), hf (hf/: the model as Hugging Face's save_pretrained\n"
                   "writes it, for from_pretrained; docs/hf_format.md), or all")
      ->check(CLI::IsMember({"safetensors", "npy", "both", "megatron", "dcp", "hf", "all"}));
  mount->add_option("--hf-shard-size", m->hf_shard_size,
                    "hf/'s largest shard, as save_pretrained's max_shard_size: 5GB (default), 500MB, 2GiB, bytes");
  mount->add_option("--names", m->names, kMegatronNamesHelp)->check(CLI::IsMember({"te", "local"}));
  mount
      ->add_option("--ckpt-format", m->ckpt_format,
                   "what megatron/iter_NNNNNNN/ holds, as Megatron's flag of that name: torch (default:\n"
                   "mp_rank_TT[_PPP]/model_optim_rng.pt per rank) or torch_dist (Megatron-Core's distributed\n"
                   "checkpoint: metadata.json, common.pt and DCP files, loadable at any tp/pp;\n"
                   "docs/dcp_format.md)")
      ->check(CLI::IsMember({"torch", "torch_dist"}));
  mount->add_option("--dcp-names", m->dcp_names, kDcpNamesHelp)->check(CLI::IsMember({"torch", "torchtitan"}));
  mount->add_flag("-f,--foreground", m->foreground, "stay in the foreground");
  mount->add_flag("--nonempty", m->nonempty, "mount over a directory that holds files (hidden while mounted)");
  mount->add_flag("--wait", m->wait,
                  "when another process writes the store (a mount, a transform), wait for it, then mount");
  mount->add_option("--threads", m->threads, "FUSE threads")->check(CLI::Range(1, 256));
  mount->add_option("--transform-threads", m->transform_threads, "threads rewriting the store on reconfigure")
      ->check(CLI::Range(1, 256));
  mount
      ->add_option("--compact-pieces", m->compaction.max_pieces_per_shard,
                   "after a reconfigure, compact in the background (lowest priority; a reconfigure\n"
                   "cancels it) when the layout's shards are read from more than this many stored pieces\n"
                   "on average (default 8; 0: never on this rule). On a cluster mount the job compacts\n"
                   "as a change of its own, proposed by the lowest live worker")
      ->check(AtLeast(0));
  mount
      ->add_option("--compact-min-piece", m->compaction.min_piece_bytes,
                   "... or when one is read from a piece smaller than this many bytes (default 0: never)")
      ->check(AtLeast(0));
  mount
      ->add_option("--passthrough", m->passthrough,
                   "auto (default): the kernel reads the model files that exist byte for byte on disk\n"
                   "(rank files, written by a compaction) itself, at the speed of a local file (FUSE\n"
                   "passthrough: Linux >= 6.9, a root daemon); others, and all with off, are served by\n"
                   "the daemon. A compaction writes the files the mount shows as rank files: megatron/'s\n"
                   "with --format megatron, dcp/'s with --format dcp, else model/'s safetensors files.\n"
                   ".ptcfs/status \"passthrough\" says which way each file is read")
      ->check(CLI::IsMember({"auto", "off"}));
  mount
      ->add_option("--scrub-interval", m->scrub_interval,
                   "seconds between the background checks of the files the kernel reads itself\n"
                   "(default 3600): each stored block read back against its checksum, also after each\n"
                   "new generation; a file with a bad block is served by the daemon from then on (its\n"
                   "reads fail that block with EIO) and named in .ptcfs/status \"passthrough\".\"scrub\"")
      ->check(AtLeast(1));
  mount->add_option("--scrub-rate", m->scrub_rate, "MiB a second those checks read at most (default 256; 0: no checks)")
      ->check(AtLeast(0));
  AddRankFileCopiesOption(mount, &m->rank_file_copies);
  AddClusterOptions(mount, &m->cluster);
  mount->callback([m, exit_code] { *exit_code = Report("mount", RunMount(*m)); });
  AddReconfigureCommand(app, exit_code);
  AddUmountCommand(app, exit_code);
  AddClusterCommand(app, exit_code);
}

}  // namespace ptcfs
