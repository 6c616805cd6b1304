#include "cluster/durable_restore.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "cluster/s3/s3_env.h"
#include "ptc/base/json_fields.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/store_layout.h"

namespace ptc::cluster {
namespace {

// The download: ranged GETs of kChunk bytes, kStreams at once, each written
// where it belongs in the local file as it arrives (from a bucket: no buffer
// of ours, memory kStreams MiB in the transport; from a directory: through
// a buffer of kBufferBytes per stream). Long requests: a server that reads
// ahead (radosgw's window) answers each one at its pace, fewer of them start cold.
constexpr uint64_t kChunk = 64 << 20;
constexpr int kStreams = 4;
constexpr uint64_t kBufferBytes = 4 << 20;
// Bytes read back per append of a piece to its sink.
constexpr uint64_t kCheckChunk = 4 << 20;

// Bytes [at, at + n) of `in` written at the same offset of `out`.
Status CopyRange(const RandomAccessFile& in, uint64_t at, uint64_t n, WritableFile& out,
                 std::unique_ptr<char[]>& buffer) {
  Status streamed = s3::StreamRange(in, at, n, [&](uint64_t off, const char* data, size_t k) {
    return out.PWrite(at + off, data, k);
  });
  if (streamed.code() != Code::kUnimplemented) return streamed;
  if (!buffer) buffer = std::make_unique_for_overwrite<char[]>(kBufferBytes);
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min(kBufferBytes, n - done);
    PTC_RETURN_IF_ERROR(in.Read(at + done, k, buffer.get()));
    PTC_RETURN_IF_ERROR(out.PWrite(at + done, buffer.get(), k));
    done += k;
  }
  return Status::OK();
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
      std::unique_ptr<char[]> buffer;  // a directory's reads only
      for (uint64_t i; (i = next++) < chunks;) {
        const uint64_t at = i * kChunk;
        Status s = CopyRange(*in, at, std::min(kChunk, size - at), *out, buffer);
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

}  // namespace

std::map<int, std::vector<const ShardRecord*>> SharesOf(const GenerationManifest& copy) {
  std::map<int, std::vector<const ShardRecord*>> out;
  for (const ShardRecord& s : copy.shards) out[s.worker].push_back(&s);
  for (auto& [w, pieces] : out) {
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const ShardRecord* a, const ShardRecord* b) { return a->offset < b->offset; });
  }
  return out;
}

Result<std::vector<ShardRecord>> LinkShare(const DurableLocation& tier, const GenerationManifest& copy,
                                           const std::vector<const ShardRecord*>& pieces, Store& store,
                                           GenerationWriter& writer, int worker, const std::string& name) {
  if (pieces.empty()) return std::vector<ShardRecord>{};
  const ShardRecord& last = *pieces.back();
  const std::string object = tier.name + "/" + last.file;
  const std::string part = store.AbsPath(name + ".part");
  Env* local = store.env();
  Status s = Download(tier.get(), JoinPath(tier.dir, last.file), last.offset + last.nbytes, local, part);
  if (s.ok()) s = writer.AdoptFile(part, worker, name);
  (void)local->Remove(part);  // the generation's link keeps the bytes
  PTC_RETURN_IF_ERROR(s);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in,
                       local->OpenRead(store.AbsPath(JoinPath(JoinPath(GenerationDirName(writer.generation()),
                                                                        WorkerDirName(worker)), name))));
  auto buffer = std::make_unique_for_overwrite<char[]>(kCheckChunk);
  const auto tensors = TensorsByName(copy);
  std::vector<ShardRecord> out;
  for (const ShardRecord* want : pieces) {
    const auto t = tensors.find(want->tensor);
    if (t == tensors.end()) return CorruptionError(object + ": piece of unknown tensor '" + want->tensor + "'");
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<ShardSink> sink,
                         writer.NewShardIn(want->tensor, t->second->dtype, want->boxes, worker, name, want->offset));
    for (uint64_t at = 0; at < want->nbytes;) {
      const uint64_t n = std::min(kCheckChunk, want->nbytes - at);
      PTC_RETURN_IF_ERROR(in->Read(want->offset + at, n, buffer.get()));
      PTC_RETURN_IF_ERROR(sink->Append(buffer.get(), n));
      at += n;
    }
    PTC_ASSIGN_OR_RETURN(ShardRecord got, sink->Finish());
    if (got.checksum != want->checksum || got.block_checksums != want->block_checksums) {
      return CorruptionError(object + ": tensor '" + want->tensor + "' at " + std::to_string(want->offset) + "+" +
                             std::to_string(want->nbytes) + " does not match its checksum in durable.json (altered)");
    }
    out.push_back(std::move(got));
  }
  return out;
}

std::string EncodeJobRecord(const JobRecord& r) {
  return nlohmann::json{{"job", r.job}, {"generation", r.generation}, {"config", r.config}, {"contents", r.contents}}
             .dump() + "\n";
}

namespace {

// kJobRecord of `tier`, when it is of `copy`'s job and contents.
Result<std::optional<JobRecord>> ReadJobRecord(const DurableLocation& tier, const DurableIdentity& copy) {
  const std::string path = JoinPath(tier.dir, kJobRecord);
  const std::string label = tier.name + "/" + std::string(kJobRecord);
  if (!tier.get()->Exists(path)) return std::optional<JobRecord>();
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(tier.get(), path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return CorruptionError(label + ": not a JSON object");
  JsonFields f(j, label);
  JobRecord r;
  PTC_ASSIGN_OR_RETURN(r.job, f.String("job"));
  PTC_ASSIGN_OR_RETURN(r.config, f.String("config"));
  PTC_ASSIGN_OR_RETURN(r.contents, f.String("contents"));
  const nlohmann::json* g = f.Find("generation");
  if (g == nullptr || !g->is_number_unsigned()) return CorruptionError(label + ": \"generation\" is not a number");
  r.generation = g->get<uint64_t>();
  if (r.job != copy.job || r.contents != copy.contents) return std::optional<JobRecord>();  // of an older copy
  return std::optional<JobRecord>(std::move(r));
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
  PTC_ASSIGN_OR_RETURN(copy.latest, ReadJobRecord(tier, copy.id));
  return copy;
}

Result<GenerationManifest> RestoredManifest(const GenerationManifest& copy, uint64_t generation) {
  GenerationManifest out = copy;
  out.generation = generation;
  out.parent.reset();
  out.rank_file_copies.clear();
  out.shards.clear();
  const std::string gen = GenerationDirName(generation);
  for (const auto& [w, pieces] : SharesOf(copy)) {
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
  const auto pieces = SharesOf(copy);
  const auto mine = pieces.find(worker);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<GenerationWriter> writer, store.BeginGenerationAt(restored.generation));
  if (mine != pieces.end()) {
    PTC_ASSIGN_OR_RETURN(std::vector<ShardRecord> linked,
                         LinkShare(tier, copy, mine->second, store, *writer, worker, std::string(kRestoredFile)));
    auto want = restored.shards.begin();
    for (ShardRecord& got : linked) {
      want = std::find_if(want, restored.shards.end(), [&](const ShardRecord& r) { return r.worker == worker; });
      if (want == restored.shards.end() || got != *want) {
        return InternalError(store.root() + ": tensor '" + got.tensor + "' of worker " + std::to_string(worker) +
                             " is not stored where the restored manifest places it (" + got.h5 + ")");
      }
      ++want;
      writer->AddShard(std::move(got));
    }
  }
  for (const ShardRecord& r : restored.shards) {
    if (r.worker != worker) writer->AddShard(r);
  }
  GenerationManifest meta = restored;
  meta.shards.clear();
  return writer->Commit(std::move(meta));
}

}  // namespace ptc::cluster
