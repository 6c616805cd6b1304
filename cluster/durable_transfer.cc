#include "cluster/durable_transfer.h"

#include <memory>
#include <set>

#include "cluster/durable.h"
#include "cluster/durable_restore.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store_layout.h"

namespace ptc::cluster {

Result<TransferStats> ExportToTier(Env* env, const Store& store, const DurableLocation& tier) {
  std::shared_ptr<const GenerationManifest> m = store.CurrentSnapshot();
  if (m == nullptr) return FailedPreconditionError(store.root() + ": the store holds no generation");
  std::set<int> workers;
  for (const ShardRecord& s : m->shards) workers.insert(s.worker);
  TransferStats stats{m->generation, 0, 0};
  for (int w : workers) {
    PTC_RETURN_IF_ERROR(WriteDurableShare(env, store, *m, w, tier.dir, nullptr, tier.get()));
    for (const ShardRecord& s : DurableShare(*m, w)) {
      ++stats.pieces;
      stats.bytes += s.nbytes;
    }
  }
  const DurableIdentity id{kExportJob, store.root() + "@generation " + std::to_string(m->generation)};
  PTC_ASSIGN_OR_RETURN(bool complete, CompleteDurable(tier.get(), *m, id, *workers.begin(), tier.dir));
  if (!complete) return InternalError(tier.name + ": a share is missing after the export wrote every one");
  return stats;
}

Result<TransferStats> ImportFromTier(const DurableLocation& tier, Store& store) {
  const std::string path = JoinPath(tier.dir, kDurableManifest);
  if (!tier.get()->Exists(path)) return NotFoundError(tier.name + ": no durable.json: the tier holds no complete copy");
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(tier.get(), path));
  PTC_ASSIGN_OR_RETURN(GenerationManifest copy, DecodeManifest(tier.name + "/" + std::string(kDurableManifest), text));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<GenerationWriter> writer, store.BeginGeneration());
  TransferStats stats;
  // Each share's object whole into the store (its pieces then described in
  // it, on worker 0): the bytes written once, as they arrive.
  for (const auto& [w, pieces] : SharesOf(copy)) {
    const std::string name = "tier-" + WorkerDirName(w) + ".bin";
    PTC_ASSIGN_OR_RETURN(std::vector<ShardRecord> linked, LinkShare(tier, copy, pieces, store, *writer, 0, name));
    for (ShardRecord& s : linked) {
      ++stats.pieces;
      stats.bytes += s.nbytes;
      writer->AddShard(std::move(s));
    }
  }
  stats.generation = writer->generation();
  GenerationManifest meta = copy;
  meta.shards.clear();
  meta.rank_file_copies.clear();  // the copy's files are the import's own
  meta.extra.erase("durable");
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  return stats;
}

}  // namespace ptc::cluster
