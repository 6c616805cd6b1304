#include "cluster/durable.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "ptc/base/json_fields.h"
#include "ptc/store/shard_verify.h"
#include "ptc/store/store_layout.h"

namespace ptc::cluster {
namespace {

// Bytes copied per read of a piece.
constexpr uint64_t kCopyChunk = 4 << 20;

// "gen-NNNNNN/worker-WW" + ext, relative to the tier.
std::string ShareName(uint64_t generation, int worker, std::string_view ext) {
  return GenerationDirName(generation) + "/" + WorkerDirName(worker) + std::string(ext);
}

// A piece's (tensor, boxes), by reference into a manifest.
using PieceKey = std::pair<std::string_view, const std::vector<Box>*>;
struct PieceKeyLess {
  bool operator()(const PieceKey& a, const PieceKey& b) const {
    return std::tie(a.first, *a.second) < std::tie(b.first, *b.second);
  }
};

// The workers with a share of `m`, and their shares.
std::map<int, std::vector<ShardRecord>> Shares(const GenerationManifest& m) {
  std::set<int> workers;
  for (const ShardRecord& s : m.shards) workers.insert(s.worker);
  std::map<int, std::vector<ShardRecord>> out;
  for (int w : workers) {
    if (auto share = DurableShare(m, w); !share.empty()) out.emplace(w, std::move(share));
  }
  return out;
}

// The same piece (tensor, boxes, bytes) apart from where it is stored.
bool SamePiece(const ShardRecord& a, const ShardRecord& b) {
  return std::tie(a.tensor, a.boxes, a.nbytes, a.checksum, a.block_checksums) ==
         std::tie(b.tensor, b.boxes, b.nbytes, b.checksum, b.block_checksums);
}

}  // namespace

std::vector<ShardRecord> DurableShare(const GenerationManifest& m, int worker) {
  // The lowest worker holding each (tensor, boxes).
  std::map<PieceKey, int, PieceKeyLess> lowest;
  for (const ShardRecord& s : m.shards) {
    auto [it, added] = lowest.try_emplace({s.tensor, &s.boxes}, s.worker);
    if (!added) it->second = std::min(it->second, s.worker);
  }
  std::vector<ShardRecord> share;
  std::set<PieceKey, PieceKeyLess> taken;  // a worker's own repeats (a covering may list a piece twice)
  for (const ShardRecord& s : m.shards) {
    if (s.worker == worker && lowest.at({s.tensor, &s.boxes}) == worker && taken.insert({s.tensor, &s.boxes}).second) {
      share.push_back(s);
    }
  }
  return share;
}

Status WriteDurableShare(Env* env, const Store& store, const GenerationManifest& m, int worker,
                         const std::string& dir, const std::atomic<bool>* stop, Env* tier) {
  if (tier == nullptr) tier = env;
  std::vector<ShardRecord> share = DurableShare(m, worker);
  if (share.empty()) return Status::OK();
  const std::string data = ShareName(m.generation, worker, ".bin");
  const std::string path = JoinPath(dir, data);
  PTC_RETURN_IF_ERROR(tier->CreateDirs(DirName(path)));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, tier->OpenWrite(path));
  auto buffer = std::make_unique_for_overwrite<char[]>(kCopyChunk);
  uint64_t offset = 0;
  for (ShardRecord& s : share) {
    PTC_ASSIGN_OR_RETURN(auto reader, VerifyingShardReader::Open(env, store, s));
    while (reader->position() < s.nbytes) {
      if (stop != nullptr && *stop) return FailedPreconditionError(path + ": cancelled");
      const uint64_t n = std::min(kCopyChunk, s.nbytes - reader->position());
      PTC_ASSIGN_OR_RETURN(const char* bytes, reader->Next(n, buffer.get()));
      PTC_RETURN_IF_ERROR(out->Append(bytes, n));
    }
    PTC_RETURN_IF_ERROR(reader->Finish());
    s.file = data;
    s.offset = offset;
    offset += s.nbytes;
  }
  PTC_RETURN_IF_ERROR(out->Sync());
  PTC_RETURN_IF_ERROR(out->Close());
  GenerationManifest records;
  records.generation = m.generation;
  records.config = m.config;
  records.tensors = m.tensors;
  records.shards = std::move(share);
  return WriteFileAtomic(tier, JoinPath(dir, ShareName(m.generation, worker, ".json")), EncodeManifest(records));
}

Result<bool> CompleteDurable(Env* env, const GenerationManifest& m, const DurableIdentity& id, int worker,
                             const std::string& dir) {
  GenerationManifest copy = m;
  copy.shards.clear();
  // The generation's extra (its dataset position) kept beside the copy's identity.
  copy.extra = m.extra.is_object() ? m.extra : nlohmann::json::object();
  copy.extra["durable"] = {{"job", id.job}, {"contents", id.contents}};
  for (const auto& [w, share] : Shares(m)) {
    const std::string path = JoinPath(dir, ShareName(m.generation, w, ".json"));
    if (!env->Exists(path)) return false;
    PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
    PTC_ASSIGN_OR_RETURN(GenerationManifest records, DecodeManifest(path, text));
    const bool same = records.shards.size() == share.size() &&
                      std::equal(share.begin(), share.end(), records.shards.begin(), SamePiece);
    if (records.generation != m.generation || !same) {
      return CorruptionError(path + ": not worker " + std::to_string(w) + "'s share of generation " +
                             std::to_string(m.generation));
    }
    for (ShardRecord& s : records.shards) copy.shards.push_back(std::move(s));
  }
  const std::string path = JoinPath(dir, kDurableManifest);
  const std::string tmp = path + ".tmp-" + WorkerDirName(worker);
  {
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->OpenWrite(tmp));
    const std::string text = EncodeManifest(copy);
    PTC_RETURN_IF_ERROR(file->Append(text.data(), text.size()));
    PTC_RETURN_IF_ERROR(file->Sync());
    PTC_RETURN_IF_ERROR(file->Close());
  }
  PTC_RETURN_IF_ERROR(env->Rename(tmp, path));
  PTC_RETURN_IF_ERROR(env->SyncDir(dir));
  PTC_ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  for (const std::string& name : names) {
    auto g = ParseGenerationDirName(name);
    if (g && *g != m.generation) PTC_RETURN_IF_ERROR(env->RemoveTree(JoinPath(dir, name)));
  }
  return true;
}

Result<std::vector<ShardRecord>> DecodeDurable(std::string_view label, std::string_view text,
                                               const DurableIdentity& id, const std::vector<TensorRecord>& tensors) {
  PTC_ASSIGN_OR_RETURN(GenerationManifest copy, DecodeManifest(label, text));
  const std::string where(label);
  const nlohmann::json* durable = copy.extra.is_object() ? JsonFields(copy.extra, where).Find("durable") : nullptr;
  if (durable == nullptr || !durable->is_object()) {
    return CorruptionError(where + ": \"extra\" has no \"durable\" object: not a durable tier's copy");
  }
  JsonFields f(*durable, where + ": extra.durable");
  PTC_ASSIGN_OR_RETURN(std::string job, f.String("job"));
  PTC_ASSIGN_OR_RETURN(std::string contents, f.String("contents"));
  if (job != id.job) return FailedPreconditionError(where + ": a copy of job '" + job + "', not of '" + id.job + "'");
  if (contents != id.contents) {
    return FailedPreconditionError(where + ": a copy of contents " + contents + ", the job's are " + id.contents +
                                   " (an older state)");
  }
  const auto by_name = TensorsByName(copy);
  for (const TensorRecord& t : tensors) {
    const auto found = by_name.find(t.name);
    const TensorRecord* held = found == by_name.end() ? nullptr : found->second;
    if (held == nullptr || !(*held == t)) {
      return FailedPreconditionError(where + ": tensor '" + t.name + "' is " +
                                     (held == nullptr ? "missing" : "of another dtype or shape"));
    }
  }
  return std::move(copy.shards);
}

Result<std::vector<ShardRecord>> LoadDurable(Env* env, const std::string& dir, const DurableIdentity& id,
                                             const std::vector<TensorRecord>& tensors) {
  const std::string path = JoinPath(dir, kDurableManifest);
  if (!env->Exists(path)) return NotFoundError(path + ": the durable tier holds no complete copy yet");
  PTC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path));
  PTC_ASSIGN_OR_RETURN(std::vector<ShardRecord> shards, DecodeDurable(path, text, id, tensors));
  for (ShardRecord& s : shards) {
    s.worker = kDurableWorker;
    s.file = std::string(kDurablePrefix) + s.file;
  }
  return shards;
}

}  // namespace ptc::cluster
