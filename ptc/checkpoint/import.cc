#include "ptc/checkpoint/import.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ptc/base/checksum.h"
#include "ptc/model/limits.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/model_spec.h"
#include "ptc/store/store.h"

namespace ptc {
namespace {

std::string BoxesText(const std::vector<Box>& boxes) {
  std::string k;
  for (const Box& b : boxes) k += (k.empty() ? "" : " ") + b.ToString();
  return k;
}

// The file offset of segment `s`'s bytes when they are one run of `at`'s
// file, in the order a dense read gives them; nullopt otherwise.
std::optional<uint64_t> OneRun(const FileTensor& at, const Segment& s) {
  if (s.box.empty()) return std::nullopt;
  size_t runs = 0;
  Index first = 0;
  ForEachRun(s.box, s.box, s.layout, s.box, DenseLayout(s.box), [&](Index src, Index, Index) {
    if (runs++ == 0) first = src;
  });
  if (runs != 1) return std::nullopt;
  return at.base + static_cast<uint64_t>(first) * at.elem_size;
}

class Importer {
 public:
  // `holder`: the worker every shard is written on; -1: the worker of its rank.
  Importer(const CheckpointSource& source, GenerationWriter* writer, const ProgressFn& progress, int holder = -1)
      : source_(source), writer_(writer), progress_(progress), holder_(holder) {}

  Status ImportRank(const RankView& view) {
    PTC_ASSIGN_OR_RETURN(auto ckpt, source_.open_rank(view));
    const int worker = holder_ >= 0 ? holder_ : source_.config.WorkerOf(view.rank);
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) {
        // The segments of each key's tensor, in order: a ZeRO-1 piece holds
        // segments of every parameter, so no scan of all of them per key.
        std::unordered_map<std::string_view, std::vector<const Segment*>> segments;
        for (const Segment& s : t.segments) segments[s.tensor].push_back(&s);
        for (const ShardKey& key : StoredShards(t)) {
          PTC_RETURN_IF_ERROR(ImportShard(*ckpt, view.rank, worker, t, key, segments.at(key.tensor)));
        }
      }
    }
    return Status::OK();
  }

  ImportResult result;

 private:
  // Streams the shard's data (its segments: those of key.tensor, each densely, in order) to `consume`.
  Status ReadShard(const RankCheckpoint& ckpt, const LocalTensor& t, const std::vector<const Segment*>& segments,
                   const std::function<Status(const void*, size_t)>& consume) {
    for (const Segment* seg : segments) {
      const Segment& s = *seg;
      const size_t n = static_cast<size_t>(s.box.volume()) * DTypeSize(t.dtype);
      if (n > buf_size_) {  // grown without zeroing: ReadRegion fills every byte
        buf_.reset(new unsigned char[n]);
        buf_size_ = n;
      }
      const FileTensor at = ckpt.Locate(t, s);
      PTC_RETURN_IF_ERROR(ReadRegion(at, s.box, buf_.get(), s.box, DenseLayout(s.box)));
      if (source_.crcs) {  // the CRC of the bytes at hand: the file is not read again for it
        if (const std::optional<uint64_t> offset = OneRun(at, s)) source_.crcs->Add(at.file->path(), *offset, buf_.get(), n);
      }
      PTC_RETURN_IF_ERROR(consume(buf_.get(), n));
      result.bytes_read += n;
      if (progress_) progress_(n);
    }
    return Status::OK();
  }

  Status ImportShard(const RankCheckpoint& ckpt, int rank, int worker, const LocalTensor& t, const ShardKey& key,
                     const std::vector<const Segment*>& segments) {
    uint64_t checksum;
    if (stored_.count({key, worker})) {
      ShardHasher hash;
      PTC_RETURN_IF_ERROR(ReadShard(ckpt, t, segments, [&](const void* p, size_t n) {
        hash.Update(p, n);
        return Status::OK();
      }));
      checksum = hash.Finish().checksum;
    } else {
      PTC_ASSIGN_OR_RETURN(auto sink, NewSink(ckpt, t, key, segments, worker));
      PTC_RETURN_IF_ERROR(ReadShard(ckpt, t, segments, [&](const void* p, size_t n) { return sink->Append(p, n); }));
      PTC_ASSIGN_OR_RETURN(ShardRecord record, sink->Finish());
      checksum = record.checksum;
      result.shards++;
      result.bytes_stored += record.nbytes;
      writer_->AddShard(std::move(record));
      stored_.insert({key, worker});
    }
    auto [it, first] = seen_.try_emplace(key, checksum, rank);
    if (!first && it->second.first != checksum) {
      return InvalidArgumentError("replicas disagree: tensor '" + key.tensor + "' " + BoxesText(key.boxes) +
                                  " differs between " + source_.rank_file(it->second.second) + " and " +
                                  source_.rank_file(rank) + " ('" + t.name + "')");
    }
    return Status::OK();
  }

  // Where the shard goes: into its own rank file where source_.adopt_files and
  // its bytes are one run of a file that could be linked, else a new shard file.
  Result<std::unique_ptr<ShardSink>> NewSink(const RankCheckpoint& ckpt, const LocalTensor& t, const ShardKey& key,
                                             const std::vector<const Segment*>& segments, int worker) {
    if (source_.adopt_files && segments.size() == 1 && !segments[0]->box.empty()) {
      const Segment& s = *segments[0];
      const FileTensor at = ckpt.Locate(t, s);
      if (const std::optional<uint64_t> offset = OneRun(at, s)) {
        const std::string* name = Adopted(*at.file, worker);
        if (name) return writer_->NewShardIn(key.tensor, t.dtype, key.boxes, worker, *name, *offset);
      }
    }
    return writer_->NewShard(key.tensor, t.dtype, key.boxes, worker);
  }

  // The name `file` has in the generation, linked on first use ("mp_rank_00_001.model_optim_rng.pt"
  // for .../mp_rank_00_001/model_optim_rng.pt); null when it cannot be linked.
  const std::string* Adopted(const RandomAccessFile& file, int worker) {
    auto [it, first] = adopted_.try_emplace({file.path(), worker});
    if (first) {
      const std::string& path = file.path();
      const std::string dir = DirName(path);
      const std::string base = dir.substr(dir.rfind('/') + 1) + "." + path.substr(path.rfind('/') + 1);
      std::string name = base;
      for (int k = 1; names_.count({worker, name}); ++k) name = std::to_string(k) + "." + base;
      if (writer_->AdoptFile(path, worker, name).ok()) {
        names_.insert({worker, name});
        it->second = std::move(name);
      }
    }
    return it->second ? &*it->second : nullptr;
  }

  const CheckpointSource& source_;
  GenerationWriter* writer_;
  const ProgressFn& progress_;
  const int holder_;
  std::unique_ptr<unsigned char[]> buf_;  // ReadShard's, buf_size_ bytes
  size_t buf_size_ = 0;
  std::set<std::pair<ShardKey, int>> stored_;          // (key, worker) written
  std::map<ShardKey, std::pair<uint64_t, int>> seen_;  // key -> (checksum, first rank)
  // (file path, worker) -> its name in the generation, or nullopt when it could not be linked
  std::map<std::pair<std::string, int>, std::optional<std::string>> adopted_;
  std::set<std::pair<int, std::string>> names_;  // (worker, name) given
};

Result<ImportResult> ImportInto(Store* store, const CheckpointSource& source, const std::vector<RankView>& views,
                                const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(auto writer, store->BeginGeneration());
  Importer importer(source, writer.get(), progress);
  for (const RankView& view : views) PTC_RETURN_IF_ERROR(importer.ImportRank(view));
  if (source.crcs) PTC_RETURN_IF_ERROR(source.crcs->Verify(store->env()));
  GenerationManifest meta;
  // State kept beside the tensors (the dataset position) carries over.
  if (store->has_generation()) meta.extra = store->current().extra;
  for (const auto& [key, value] : source.extra.items()) meta.extra[key] = value;
  PTC_RETURN_IF_ERROR(DescribeModel(source.spec, source.config, &meta));
  PTC_RETURN_IF_ERROR(writer->Commit(std::move(meta)));
  importer.result.generation = writer->generation();
  return importer.result;
}

// The views of `ranks` (every rank when empty), each rank's files opened
// (checked) once. The largest segment (read into memory whole) must fit in
// `env`'s memory.
Result<std::vector<RankView>> CheckedViews(Env* env, const CheckpointSource& source, std::vector<int> ranks = {}) {
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(source.spec, source.config));
  if (ranks.empty()) {
    for (int r = 0; r < layout.world_size(); ++r) ranks.push_back(r);
  }
  std::vector<RankView> views;
  uint64_t largest = 0;
  std::string largest_name;
  for (int r : ranks) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(r));
    for (const auto* list : {&view.model, &view.optim}) {
      for (const LocalTensor& t : *list) {
        for (const Segment& s : t.segments) {
          const uint64_t bytes = static_cast<uint64_t>(s.box.volume()) * DTypeSize(t.dtype);
          if (bytes > largest) largest = bytes, largest_name = t.name;
        }
      }
    }
    views.push_back(std::move(view));
  }
  PTC_RETURN_IF_ERROR(CheckHeldBytes(largest, env->MemoryBytes(), "import: a piece of tensor '" + largest_name + "'"));
  for (const RankView& view : views) PTC_RETURN_IF_ERROR(source.open_rank(view).status());
  return views;
}

}  // namespace

Result<ImportResult> ImportInto(Store* store, const CheckpointSource& source, const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(std::vector<RankView> views, CheckedViews(store->env(), source));
  return ImportInto(store, source, views, progress);
}

Result<ImportResult> WriteRanks(Env* env, GenerationWriter* writer, const CheckpointSource& source,
                                const std::vector<int>& ranks, int worker, const ProgressFn& progress) {
  if (ranks.empty()) return ImportResult{};
  PTC_ASSIGN_OR_RETURN(std::vector<RankView> views, CheckedViews(env, source, ranks));
  Importer importer(source, writer, progress, worker);
  for (const RankView& view : views) PTC_RETURN_IF_ERROR(importer.ImportRank(view));
  if (source.crcs) PTC_RETURN_IF_ERROR(source.crcs->Verify(env));
  return importer.result;
}

Result<ImportResult> ImportCheckpoint(Env* env, const std::string& src_dir, const std::string& store_path,
                                      const Schema& schema, const ModelDims& dims, const ParallelConfig& config,
                                      const ProgressFn& progress) {
  CheckpointSource source;
  PTC_ASSIGN_OR_RETURN(source.spec, InferModelSpec(env, src_dir, schema, dims));
  source.config = config;
  source.open_rank = [env, src_dir](const RankView& view) { return RankCheckpoint::Open(env, src_dir, view); };
  source.rank_file = [src_dir](int rank) { return ModelFilePath(src_dir, rank); };
  return ImportFrom(env, source, store_path, progress);
}

Status WritePiece(GenerationWriter& writer, const std::string& tensor, DType dtype, std::vector<Box> boxes, int worker,
                  const RandomAccessFile& file, uint64_t offset, uint64_t size, std::vector<char>& buf,
                  const ProgressFn& progress, const std::string& what) {
  PTC_ASSIGN_OR_RETURN(auto sink, writer.NewShard(tensor, dtype, std::move(boxes), worker));
  for (uint64_t done = 0; done < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - done));
    PTC_RETURN_IF_ERROR(file.Read(offset + done, n, buf.data()), what);
    PTC_RETURN_IF_ERROR(sink->Append(buf.data(), n));
    done += n;
    if (progress) progress(n);
  }
  PTC_ASSIGN_OR_RETURN(ShardRecord record, sink->Finish());
  writer.AddShard(std::move(record));
  return Status::OK();
}

Result<ImportResult> ImportWith(Env* env, const std::string& store_path,
                                const std::function<Result<ImportResult>(Store*)>& write) {
  std::unique_ptr<Store> store;
  if (env->Exists(JoinPath(store_path, "manifest.json"))) {
    PTC_ASSIGN_OR_RETURN(store, Store::Open(env, store_path));
    return write(store.get());
  }
  const bool dir_existed = env->Exists(store_path);
  PTC_ASSIGN_OR_RETURN(store, Store::Create(env, store_path));
  auto result = write(store.get());
  if (!result.ok()) {
    store.reset();
    // Best effort: the store did not exist before this call.
    if (dir_existed) {
      auto names = env->ListDir(store_path);
      if (names.ok())
        for (const std::string& n : *names) (void)env->RemoveTree(JoinPath(store_path, n));
    } else {
      (void)env->RemoveTree(store_path);
    }
  }
  return result;
}

Result<ImportResult> ImportFrom(Env* env, const CheckpointSource& source, const std::string& store_path,
                                const ProgressFn& progress) {
  // Check every rank's files before the store is touched.
  PTC_ASSIGN_OR_RETURN(std::vector<RankView> views, CheckedViews(env, source));
  return ImportWith(env, store_path, [&](Store* store) { return ImportInto(store, source, views, progress); });
}

}  // namespace ptc
