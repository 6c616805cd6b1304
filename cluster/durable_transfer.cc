#include "cluster/durable_transfer.h"

#include <deque>
#include <future>
#include <memory>
#include <set>

#include "cluster/durable.h"
#include "ptc/store/generation_writer.h"

namespace ptc::cluster {
namespace {

constexpr uint64_t kChunk = 8 << 20;
// Ranged GETs in flight ahead of the writes (memory: kAhead * kChunk).
constexpr size_t kAhead = 4;

// One piece of the copy, streamed from its object into a new shard of `writer`.
Status CopyPiece(Env* tier, const std::string& dir, const ShardRecord& s, DType dtype, GenerationWriter& writer,
                 char* buffer) {
  const std::string path = JoinPath(dir, s.file);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> object, tier->OpenRead(path));
  if (object->Size() < s.offset + s.nbytes) {
    return CorruptionError(object->path() + ": " + std::to_string(object->Size()) + " bytes, but tensor '" + s.tensor +
                           "' lies at " + std::to_string(s.offset) + "+" + std::to_string(s.nbytes));
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ShardSink> sink, writer.NewShard(s.tensor, dtype, s.boxes, /*worker=*/0));
  // Chunk i is read into buffer slot i % kAhead while earlier ones are written.
  const uint64_t chunks = (s.nbytes + kChunk - 1) / kChunk;
  std::deque<std::future<Status>> reads;
  auto start = [&](uint64_t i) {
    char* slot = buffer + (i % kAhead) * kChunk;
    const uint64_t at = i * kChunk, n = std::min(kChunk, s.nbytes - at);
    reads.push_back(std::async(std::launch::async, [&object, slot, at, n, off = s.offset] {
      return object->Read(off + at, n, slot);
    }));
  };
  Status failed;
  for (uint64_t i = 0; i < std::min<uint64_t>(kAhead, chunks); ++i) start(i);
  for (uint64_t i = 0; i < chunks && !reads.empty(); ++i) {
    Status read = reads.front().get();
    reads.pop_front();
    if (failed.ok()) failed = read;
    if (failed.ok()) {
      const uint64_t at = i * kChunk;
      failed = sink->Append(buffer + (i % kAhead) * kChunk, std::min(kChunk, s.nbytes - at));
    }
    if (failed.ok() && i + kAhead < chunks) start(i + kAhead);
  }
  PTC_RETURN_IF_ERROR(failed);
  PTC_ASSIGN_OR_RETURN(ShardRecord written, sink->Finish());
  if (written.checksum != s.checksum) {
    return CorruptionError(object->path() + ": tensor '" + s.tensor + "' at " + std::to_string(s.offset) + "+" +
                           std::to_string(s.nbytes) + " does not match its checksum in durable.json (altered)");
  }
  writer.AddShard(std::move(written));
  return Status::OK();
}

}  // namespace

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
  auto buffer = std::make_unique_for_overwrite<char[]>(kChunk * kAhead);
  TransferStats stats;
  for (const ShardRecord& s : copy.shards) {
    const TensorRecord* t = FindTensor(copy, s.tensor);
    if (t == nullptr) return CorruptionError(tier.name + "/durable.json: piece of unknown tensor '" + s.tensor + "'");
    PTC_RETURN_IF_ERROR(CopyPiece(tier.get(), tier.dir, s, t->dtype, *writer, buffer.get()));
    ++stats.pieces;
    stats.bytes += s.nbytes;
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
