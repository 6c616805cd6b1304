#include "cluster/durable_restore.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "ptc/base/json_fields.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store_layout.h"

namespace ptc::cluster {
namespace {

// The download: ranged GETs of kChunk bytes, kStreams at once, each written
// where it belongs in the local file (memory: kStreams * kChunk).
constexpr uint64_t kChunk = 8 << 20;
constexpr int kStreams = 4;
// Bytes read back per append of a piece to its sink.
constexpr uint64_t kCheckChunk = 4 << 20;

// Each worker's pieces of `copy`, in offset order.
std::map<int, std::vector<const ShardRecord*>> PiecesByWorker(const GenerationManifest& copy) {
  std::map<int, std::vector<const ShardRecord*>> out;
  for (const ShardRecord& s : copy.shards) out[s.worker].push_back(&s);
  for (auto& [w, pieces] : out) {
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const ShardRecord* a, const ShardRecord* b) { return a->offset < b->offset; });
  }
  return out;
}

// Downloads `object` of `tier` into the local file `path` (`size` bytes).
Status Download(Env* tier, const std::string& object, uint64_t size, Env* local, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, tier->OpenRead(object));
  if (in->Size() != size) {
    return CorruptionError(in->path() + ": " + std::to_string(in->Size()) + " bytes, but durable.json places " +
                           std::to_string(size) + " bytes of pieces in it");
  }
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, local->OpenWrite(path));
  const uint64_t chunks = (size + kChunk - 1) / kChunk;
  std::atomic<uint64_t> next{0};
  std::vector<Status> failed(kStreams);
  std::vector<std::thread> streams;
  for (int t = 0; t < kStreams; ++t) {
    streams.emplace_back([&, t] {
      auto buffer = std::make_unique_for_overwrite<char[]>(kChunk);
      for (uint64_t i; (i = next++) < chunks;) {
        const uint64_t at = i * kChunk, n = std::min(kChunk, size - at);
        Status s = in->Read(at, n, buffer.get());
        if (s.ok()) s = out->PWrite(at, buffer.get(), n);
        if (!s.ok()) {
          failed[t] = s;
          next = chunks;  // the others stop at their next chunk
          return;
        }
      }
    });
  }
  for (std::thread& s : streams) s.join();
  for (const Status& s : failed) PTC_RETURN_IF_ERROR(s);
  PTC_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

// The pieces of `worker` written as `restored` says, from the adopted file:
// each read back, its checksums computed and compared with its record.
Status AddPieces(const GenerationManifest& restored, int worker, const std::string& object, GenerationWriter& writer,
                 Env* local, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, local->OpenRead(path));
  auto buffer = std::make_unique_for_overwrite<char[]>(kCheckChunk);
  const auto tensors = TensorsByName(restored);
  for (const ShardRecord& want : restored.shards) {
    if (want.worker != worker) continue;
    const auto t = tensors.find(want.tensor);
    if (t == tensors.end()) return CorruptionError(object + ": piece of unknown tensor '" + want.tensor + "'");
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ShardSink> sink,
                         writer.NewShardIn(want.tensor, t->second->dtype, want.boxes, worker,
                                           std::string(kRestoredFile), want.offset));
    for (uint64_t at = 0; at < want.nbytes;) {
      const uint64_t n = std::min(kCheckChunk, want.nbytes - at);
      PTC_RETURN_IF_ERROR(in->Read(want.offset + at, n, buffer.get()));
      PTC_RETURN_IF_ERROR(sink->Append(buffer.get(), n));
      at += n;
    }
    PTC_ASSIGN_OR_RETURN(ShardRecord got, sink->Finish());
    if (got != want) {
      return CorruptionError(object + ": tensor '" + want.tensor + "' at " + std::to_string(want.offset) + "+" +
                             std::to_string(want.nbytes) +
                             (got.checksum != want.checksum || got.block_checksums != want.block_checksums
                                  ? " does not match its checksum in durable.json (altered)"
                                  : " is not stored where the restored manifest places it (" + got.h5 + ")"));
    }
    writer.AddShard(std::move(got));
  }
  return Status::OK();
}

}  // namespace

Result<DurableCopy> ReadDurableCopy(const DurableLocation& tier, const std::string& job) {
  const std::string path = JoinPath(tier.dir, kDurableManifest);
  const std::string label = tier.name + "/" + std::string(kDurableManifest);
  if (!tier.get()->Exists(path)) return NotFoundError(label + ": the durable tier holds no complete copy");
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(tier.get(), path));
  DurableCopy copy;
  PTC_ASSIGN_OR_RETURN(copy.manifest, DecodeManifest(label, text));
  const nlohmann::json* durable =
      copy.manifest.extra.is_object() ? JsonFields(copy.manifest.extra, label).Find("durable") : nullptr;
  if (durable == nullptr || !durable->is_object()) {
    return CorruptionError(label + ": \"extra\" has no \"durable\" object: not a durable tier's copy");
  }
  JsonFields f(*durable, label + ": extra.durable");
  PTC_ASSIGN_OR_RETURN(copy.id.job, f.String("job"));
  PTC_ASSIGN_OR_RETURN(copy.id.contents, f.String("contents"));
  if (copy.id.job != job) {
    return FailedPreconditionError(label + ": a copy of job '" + copy.id.job + "', not of '" + job + "'");
  }
  copy.manifest.extra.erase("durable");
  return copy;
}

Result<GenerationManifest> RestoredManifest(const GenerationManifest& copy, uint64_t generation) {
  GenerationManifest out = copy;
  out.generation = generation;
  out.parent.reset();
  out.rank_file_copies.clear();
  out.shards.clear();
  const std::string gen = GenerationDirName(generation);
  for (const auto& [w, pieces] : PiecesByWorker(copy)) {
    const std::string dir = JoinPath(gen, WorkerDirName(w));
    std::map<std::string, int> counters;  // stem -> next K, as GenerationWriter counts
    uint64_t end = 0;
    for (const ShardRecord* s : pieces) {
      if (s->file != pieces.front()->file || s->offset < end) {
        return CorruptionError("durable.json: worker " + std::to_string(w) + "'s pieces are not back to back in one "
                               "object (tensor '" + s->tensor + "' in " + s->file + ")");
      }
      end = s->offset + s->nbytes;
      ShardRecord r = *s;
      const std::string stem = SanitizeFileName(s->tensor);
      r.h5 = JoinPath(dir, stem + ".s" + std::to_string(counters[stem]++) + ".h5");
      r.file = JoinPath(dir, kRestoredFile);
      out.shards.push_back(std::move(r));
    }
  }
  return out;
}

Status RestoreShare(const DurableLocation& tier, const GenerationManifest& copy, const GenerationManifest& restored,
                    int worker, Store& store) {
  if (store.has_generation()) {
    return FailedPreconditionError(store.root() + ": holds a generation already: a restore is for an empty store");
  }
  const auto pieces = PiecesByWorker(copy);
  const auto mine = pieces.find(worker);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<GenerationWriter> writer, store.BeginGenerationAt(restored.generation));
  if (mine != pieces.end()) {
    const ShardRecord& last = *mine->second.back();
    const std::string object = JoinPath(tier.dir, last.file);
    const std::string named = tier.name + "/" + last.file;
    const std::string part = store.AbsPath("restore-" + WorkerDirName(worker) + ".part");
    Env* local = store.env();
    Status s = Download(tier.get(), object, last.offset + last.nbytes, local, part);
    if (s.ok()) s = writer->AdoptFile(part, worker, std::string(kRestoredFile));
    if (s.ok()) s = AddPieces(restored, worker, named, *writer, local, part);
    (void)local->Remove(part);  // the generation's link keeps the bytes
    PTC_RETURN_IF_ERROR(s);
  }
  for (const ShardRecord& r : restored.shards) {
    if (r.worker != worker) writer->AddShard(r);
  }
  GenerationManifest meta = restored;
  meta.shards.clear();
  return writer->Commit(std::move(meta));
}

}  // namespace ptc::cluster
