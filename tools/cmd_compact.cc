// ptcfs compact: store the current generation in its own layout.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "ptc/store/store.h"
#include "tools/cli_numbers.h"
#include "tools/commands.h"
#include "tools/progress.h"
#include "transform/execute.h"
#include "view/rank_files.h"

namespace ptcfs {
namespace {

struct CompactArgs {
  std::string store;
  int64_t generation = -1;  // -1: whatever is current
  int threads = 2;
  bool keep_old = false;
  bool rank_files = false;
  std::string rank_file_copies = "stored";
  std::string rank_file_format = "safetensors";
  std::string names = "te";
  std::optional<std::string> dcp_names;
  bool wait = false;
};

ptc::Status RunCompact(const CompactArgs& a) {
  PTC_ASSIGN_OR_RETURN(ptc::StoreLock lock, LockStore(a.store, a.wait));
  PTC_ASSIGN_OR_RETURN(auto store, ptc::Store::OpenLocked(ptc::Env::Default(), a.store, std::move(lock)));
  if (!store->has_generation()) return ptc::FailedPreconditionError(a.store + ": the store holds no generation yet");
  const uint64_t current = store->current_generation();
  if (a.generation >= 0 && static_cast<uint64_t>(a.generation) != current) {
    return ptc::FailedPreconditionError(a.store + ": --generation " + std::to_string(a.generation) +
                                        " is not the current generation (" + std::to_string(current) +
                                        "); only the current generation is compacted");
  }
  const auto start = std::chrono::steady_clock::now();
  RankFileOptions options;
  PTC_ASSIGN_OR_RETURN(options.copy_budget, ParseCopyBudget(a.rank_file_copies), "--rank-file-copies");
  const bool torch_dist = a.rank_file_format == "torch_dist";  // the DCP files of megatron/'s torch_dist tree
  PTC_ASSIGN_OR_RETURN(options.format, ParseRankFileFormat(torch_dist ? "dcp" : a.rank_file_format),
                       "--rank-file-format");
  PTC_ASSIGN_OR_RETURN(options.names, ptc::megatron::ParseNameSet(a.names), "--names");
  if (a.dcp_names && a.rank_file_format != "dcp") {
    return ptc::InvalidArgumentError("--dcp-names " + *a.dcp_names + ": names the keys of --rank-file-format dcp");
  }
  options.dcp_keys = torch_dist                                      ? ptc::dcp::Keys::kMegatronCore
                     : a.dcp_names.value_or("torch") == "torchtitan" ? ptc::dcp::Keys::kTorchtitan
                                                                     : ptc::dcp::Keys::kTorch;
  PTC_ASSIGN_OR_RETURN(ptc::transform::Compaction c,
                       ptc::transform::PlanCompaction(*store, ptc::transform::CommitMode::kCompact,
                                                      a.rank_files && BoxTargets(options)));
  std::vector<ptc::RankFileSpec> files;
  if (a.rank_files) {
    PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(c.spec, c.config));
    PTC_ASSIGN_OR_RETURN(RankFileCompaction rf, PrepareRankFileCompaction(*store, std::move(c), layout, options));
    c = std::move(rf.compaction);
    files = std::move(rf.files);
  }
  if (c.covering.writes.targets.empty()) {
    std::printf("generation %llu is compact: every shard of %s is stored as it is (%s); nothing written\n",
                static_cast<unsigned long long>(current), c.source->config.c_str(),
                HumanBytes(c.covering.bytes_referenced).c_str());
    return ptc::Status::OK();
  }
  ptc::transform::ExecuteResult r;
  {
    Progress progress("compact", c.covering.bytes_written);
    ptc::transform::ExecuteOptions options;
    options.threads = a.threads;
    options.progress = progress.fn();
    options.rank_files = files;
    PTC_ASSIGN_OR_RETURN(r, ptc::transform::ExecuteCovering(*store, c.source, c.spec, c.config, c.covering, options));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("generation %llu compacted as generation %llu in %.2f s: %llu shards written (%s), %llu kept (%s)\n",
              static_cast<unsigned long long>(current), static_cast<unsigned long long>(r.generation), secs,
              static_cast<unsigned long long>(r.shards_written), HumanBytes(r.bytes_written).c_str(),
              static_cast<unsigned long long>(r.shards_referenced), HumanBytes(r.bytes_referenced).c_str());
  CollectAfterCommit("compact", *store, a.keep_old);
  return ptc::Status::OK();
}

}  // namespace

void AddRankFileCopiesOption(CLI::App* sub, std::string* value) {
  sub->add_option("--rank-file-copies", *value,
                  "with rank files: bytes of copies a worker's rank files may hold, so that the files of\n"
                  "ranks sharing a piece (replicated norms and biases, tied embeddings, data-parallel\n"
                  "replicas) exist whole too: stored (default: as many as the worker's stored pieces),\n"
                  "all, none, or a size (K, M, G, T); the files with the fewest copy bytes first")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            ptc::Result<uint64_t> budget = ParseCopyBudget(text);
            return budget.ok() ? std::string() : budget.status().message();
          },
          "all|none|stored|SIZE"));
}

void AddCompactCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<CompactArgs>();
  CLI::App* sub = app.add_subcommand(
      "compact",
      "Store the current generation in its own layout: every shard its config's ranks read becomes one\n"
      "contiguous stored shard per worker. A transform or reconfigure commits the new layout as a\n"
      "covering of older pieces (no bytes copied), so reads then assemble each shard from several\n"
      "pieces; compact writes them out once, streamed in bounded chunks on --threads threads, durable\n"
      "before the commit, as a new generation. Shards already stored as they are are kept. Nothing is\n"
      "committed when the generation is compact already. Older generations are removed after the\n"
      "commit unless --keep-old. One writer at a time: while a mount or another command writes STORE\n"
      "this fails naming it (--wait waits).");
  sub->add_option("STORE", a->store, "store directory")->required();
  sub->add_option("--generation", a->generation,
                  "compact only if this is the current generation (guards against compacting a newer one)")
      ->check(AtLeast(0));
  sub->add_option("--threads", a->threads, "writer threads")->check(CLI::Range(1, 256));
  sub->add_flag("--keep-old", a->keep_old, "keep earlier generations' files");
  sub->add_flag("--rank-files", a->rank_files,
                "write each rank's safetensors files whole, the shards inside them (HDF5 files describe\n"
                "them as external storage), so that a mount lets the kernel read them (passthrough);\n"
                "rewrites every shard once when the generation has no rank files yet");
  AddRankFileCopiesOption(sub, &a->rank_file_copies);
  sub->add_option("--rank-file-format", a->rank_file_format,
                  "with rank files: which files they are: safetensors (model/, the default), megatron\n"
                  "(the model_optim_rng.pt files of megatron/ that `ptcfs mount --format megatron`\n"
                  "shows; their zip headers hold each tensor's CRC-32, so every tensor is read once more),\n"
                  "dcp (the __W_0.distcp files of dcp/, `--format dcp`; keys as --dcp-names) or torch_dist\n"
                  "(those of megatron/ with `--format megatron --ckpt-format torch_dist`); for dcp and\n"
                  "torch_dist each box of a fused tensor is stored as a piece of its own, as DCP's chunks are")
      ->check(CLI::IsMember({"safetensors", "megatron", "dcp", "torch_dist"}));
  sub->add_option("--dcp-names", a->dcp_names, "with --rank-file-format dcp: " + std::string(kDcpNamesHelp))
      ->check(CLI::IsMember({"torch", "torchtitan"}));
  sub->add_option("--names", a->names, "with --rank-file-format megatron: " + std::string(kMegatronNamesHelp))
      ->check(CLI::IsMember({"te", "local"}));
  AddWaitFlag(sub, &a->wait);
  sub->callback([a, exit_code] { *exit_code = Report("compact", RunCompact(*a)); });
}

}  // namespace ptcfs
