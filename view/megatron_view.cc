// megatron/: Megatron-LM's checkpoint tree of the served layout,
// latest_checkpointed_iteration.txt and iter_NNNNNNN/mp_rank_TT[_PPP]/
// model_optim_rng.pt (view/megatron_file.h), or with --ckpt-format
// torch_dist iter_NNNNNNN/ as Megatron-Core's distributed checkpoint
// (metadata.json, common.pt and the DCP files in its keys). The directory
// takes Megatron's saves (SaveKind::kMegatron); writing the latest file
// commits one.
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "ptc/base/mutex.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/zip_reader.h"
#include "view/megatron_file.h"
#include "view/view_tree.h"

namespace ptcfs {

namespace {

// The storages' CRCs as a Megatron rank file of the generation holds them
// (view/rank_files.h), read from its zip directory instead of computed from
// every tensor: when a rank file holds `plan`'s file verbatim (every shard at
// its offset; every literal byte, the headers with those CRCs included, the
// same). The compaction computed them from the verified shards (`ptcfs
// verify` checks the tensor bytes, not these CRCs). nullopt when no rank
// file holds it.
std::optional<std::vector<uint32_t>> CrcsFromRankFile(const Snapshot& snap, const MegatronFilePlan& plan, int worker) {
  const std::vector<uint32_t> unknown(plan.torch.storage_members.size(), 0);
  auto draft = MakeMegatronFile(snap.reader(), plan, unknown, worker);
  if (!draft.ok()) return std::nullopt;
  auto candidates = (*draft)->VerbatimFiles(snap.copies());
  if (!candidates.ok()) return std::nullopt;
  const ptc::Store& store = snap.store();
  for (const std::string& path : *candidates) {
    auto f = store.env()->OpenRead(store.AbsPath(path));
    if (!f.ok()) continue;
    auto zip = ptc::ReadZipDirectory(**f, path);
    if (!zip.ok()) continue;
    std::vector<uint32_t> crcs;
    for (size_t member : plan.torch.storage_members) {
      const ptc::ZipEntry* e = zip->Find(plan.torch.members[member].name);
      if (e == nullptr) break;
      crcs.push_back(e->crc32);
    }
    if (crcs.size() != unknown.size()) continue;
    auto file = MakeMegatronFile(snap.reader(), plan, crcs, worker);
    if (file.ok() && (*file)->CheckVerbatim(**f).ok()) return crcs;
  }
  return std::nullopt;
}

// The CRC-32s of the storages of Megatron files, by (config, rank, iteration):
// the same config and iteration give the same bytes, whichever generation
// holds them, so only the first open of a file pays for them.
// Thread safety: internally locked; two first opens may both compute them.
class CrcCache {
 public:
  using Key = std::tuple<std::string, int, uint64_t>;
  std::vector<uint32_t> Find(const Key& key) const EXCLUDES(mu_) {
    ptc::MutexLock lock(&mu_);
    auto it = crcs_.find(key);
    return it == crcs_.end() ? std::vector<uint32_t>{} : it->second;
  }
  void Put(const Key& key, std::vector<uint32_t> crcs) EXCLUDES(mu_) {
    ptc::MutexLock lock(&mu_);
    crcs_[key] = std::move(crcs);
  }

 private:
  mutable ptc::Mutex mu_;
  std::map<Key, std::vector<uint32_t>> crcs_ GUARDED_BY(mu_);
};

// Megatron's groups (0 with weight decay, 1 without) that hold a routed
// expert's parameter of `plan` (Megatron-Core's torch_dist keys).
std::vector<size_t> ExpertGroups(const ptc::dcp::Plan& plan) {
  std::set<size_t> groups;
  for (const ptc::dcp::Tensor& t : plan.tensors) {
    if (t.expert < 0 || ptc::dcp::WithoutChainedPrefix(t.key).first.starts_with("optimizer.")) continue;
    const ptc::LocalTensor param{t.name, t.dtype, t.shape, {}};
    groups.insert(ptc::megatron::WithoutWeightDecay(param) ? 1 : 0);
  }
  return {groups.begin(), groups.end()};
}

// A rank's model_optim_rng.pt. Its CRCs come from the cache, from a rank
// file that holds it, or from reading the rank's tensors once.
class MegatronRenderer final : public FileRenderer {
 public:
  MegatronRenderer(std::shared_ptr<const Snapshot> snap, size_t view, ptc::megatron::NameSet names,
                   std::shared_ptr<CrcCache> crcs)
      : snap_(std::move(snap)), view_(view), names_(names), crcs_(std::move(crcs)) {}

  ptc::Result<std::unique_ptr<VirtualFile>> Render() const override {
    const Snapshot& snap = *snap_;
    const ptc::RankView& view = snap.views()[view_];
    const int worker = snap.WorkerOf(view.rank);
    PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state, snap.megatron());
    PTC_ASSIGN_OR_RETURN(MegatronFilePlan plan, PlanMegatronFile(snap.spec(), snap.config(), view, state, names_));
    const CrcCache::Key key{snap.config().ToString(), view.rank, state.iteration};
    std::vector<uint32_t> crcs = crcs_->Find(key);
    if (crcs.empty() && !plan.state.storages.empty()) {
      auto check = [&](const ptc::ShardRecord& shard, uint64_t at, uint64_t n) { return snap.Check(shard, at, n); };
      if (auto written = CrcsFromRankFile(snap, plan, worker)) {
        crcs = std::move(*written);
      } else {
        PTC_ASSIGN_OR_RETURN(crcs, StorageCrcs(snap.reader(), plan, worker, check));
      }
      crcs_->Put(key, crcs);
    }
    return MakeMegatronFile(snap.reader(), plan, crcs, worker);
  }

 private:
  std::shared_ptr<const Snapshot> snap_;
  size_t view_;
  ptc::megatron::NameSet names_;
  std::shared_ptr<CrcCache> crcs_;
};

// The file of the distributed optimizer's bucket states (beside __W_0/__W_1.distcp).
constexpr const char* kDistOptimizerFile = "__0_2.distcp";

class MegatronView final : public ViewTree {
 public:
  explicit MegatronView(const ViewOptions& options)
      : names_(options.megatron_names), torch_dist_(options.megatron_torch_dist), worker_(options.worker) {}
  std::string_view name() const override { return "megatron"; }
  SaveKind saves() const override { return SaveKind::kMegatron; }

  ptc::Result<std::vector<TreeFile>> Build(const std::shared_ptr<const Snapshot>& snap) const override {
    PTC_ASSIGN_OR_RETURN(ptc::megatron::MegatronState state, snap->megatron());
    std::vector<TreeFile> files;
    TreeFile latest = LiteralFile(std::string(ptc::megatron::kLatestFile), std::to_string(state.iteration));
    latest.commits_save = true;
    files.push_back(std::move(latest));
    const std::string iter = ptc::megatron::IterationDirName(state.iteration) + "/";
    if (torch_dist_) {
      PTC_RETURN_IF_ERROR(AddTorchDist(snap, state, iter, &files));
      return files;
    }
    const ptc::ParallelConfig& config = snap->config();
    PTC_RETURN_IF_ERROR(ptc::megatron::CheckLegacySave(config));
    for (size_t v : MegatronRanks(snap->views())) {
      const ptc::RankView& view = snap->views()[v];
      PTC_ASSIGN_OR_RETURN(MegatronFilePlan plan, PlanMegatronFile(snap->spec(), config, view, state, names_),
                           ptc::RankDirName(view.rank));
      TreeFile f;
      f.path = iter + MegatronRankDir(view, config) + "/" + std::string(ptc::megatron::kRankFile);
      f.size = plan.size;
      f.renderer = std::make_shared<MegatronRenderer>(snap, v, names_, crcs_);
      f.kernel_readable = true;
      files.push_back(std::move(f));
    }
    return files;
  }

 private:
  // iter_N/ as Megatron-Core's torch_dist checkpoint: metadata.json, common.pt
  // and the DCP files in Megatron-Core's keys (ptc/checkpoint/dcp/dcp.h).
  // \error as PlanCheckpoint and McoreCommon.
  ptc::Status AddTorchDist(const std::shared_ptr<const Snapshot>& snap, const ptc::megatron::MegatronState& state,
                           const std::string& dir, std::vector<TreeFile>* files) const {
    // A model with routed experts at ep > 1: Megatron-Core's ChainedOptimizer (prefixed keys).
    const bool chained = snap->spec().dims.experts > 0 && snap->config().ep > 1;
    PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan,
                         ptc::dcp::PlanCheckpoint(snap->reader().manifest(), ptc::dcp::Keys::kMegatronCore, chained));
    const ptc::pickle::Value* args = state.carried.is_dict() ? state.carried.Find("args") : nullptr;
    // The optimizer's groups and step, when the store has optimizer state (its
    // fp32 masters make it Float16OptimizerWithFloat16Params' layout).
    std::vector<ptc::megatron::CarriedTensor> storages;
    std::optional<ptc::pickle::Value> optimizer_common;
    if (snap->spec().optimizer && snap->config().zero == 1) {  // the distributed optimizer's form
      PTC_ASSIGN_OR_RETURN(optimizer_common, AddDpReshardable(*snap, state, &plan));
    } else if (snap->spec().optimizer) {
      PTC_ASSIGN_OR_RETURN(optimizer_common,
                           ptc::megatron::McoreOptimizerCommon(state, /*masters=*/true, &storages,
                                                               chained ? ExpertGroups(plan) : std::vector<size_t>{}));
    }
    PTC_ASSIGN_OR_RETURN(
        std::string common,
        ptc::dcp::McoreCommon(state.iteration, args, optimizer_common ? &*optimizer_common : nullptr, storages));
    files->push_back(LiteralFile(dir + ptc::dcp::kMcoreMetadataFile, ptc::dcp::McoreMetadataJson()));
    files->push_back(LiteralFile(dir + ptc::dcp::kMcoreCommonFile, std::move(common)));
    AddDcpFiles({dir}, snap, std::move(plan), worker_, files);
    return ptc::Status::OK();
  }

  // With zero=1: the DistributedOptimizer's dp_reshardable bucket states and
  // objects in a file of their own (the plan's others stay as PlanCheckpoint
  // makes them, so compacted rank files still serve them); returns common.pt's
  // optimizer entry. \error as PlanDpReshardable and AddFlatFile.
  ptc::Result<ptc::pickle::Value> AddDpReshardable(const Snapshot& snap, const ptc::megatron::MegatronState& state,
                                                   ptc::dcp::Plan* plan) const {
    PTC_ASSIGN_OR_RETURN(ptc::megatron::DpReshardable dist,
                         ptc::megatron::PlanDpReshardable(snap.layout(), names_, state));
    std::vector<ptc::dcp::FlatTensor> flats;
    for (ptc::LocalTensor& t : dist.tensors) flats.push_back({std::move(t)});
    std::vector<ptc::dcp::Object> objects;
    for (auto& [key, value] : dist.objects) {
      PTC_ASSIGN_OR_RETURN(std::string bytes, ptc::dcp::TorchSaveBytes(ptc::pickle::Value::List({std::move(value)})),
                           key);
      objects.push_back(ptc::dcp::Object{key, std::move(bytes)});
    }
    PTC_RETURN_IF_ERROR(ptc::dcp::AddFlatFile(kDistOptimizerFile, std::move(flats), std::move(objects), plan));
    return std::move(dist.common);
  }

  ptc::megatron::NameSet names_;
  bool torch_dist_;
  int worker_;
  std::shared_ptr<CrcCache> crcs_ = std::make_shared<CrcCache>();
};

}  // namespace

std::unique_ptr<ViewTree> MakeMegatronView(const ViewOptions& options) {
  return std::make_unique<MegatronView>(options);
}

}  // namespace ptcfs
