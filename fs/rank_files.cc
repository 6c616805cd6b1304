#include "fs/rank_files.h"

#include <set>
#include <tuple>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/format/safetensors.h"
#include "transform/covering.h"
#include "transform/plan.h"

namespace ptcfs {
namespace {

using Key = std::tuple<int, std::string, std::vector<ptc::Box>>;  // (worker, tensor, boxes)

// Where the shard `key` lies in `local`'s buffer, in elements, when its boxes
// are stored there densely one after another in their order (the stored
// shard's own layout); otherwise -1.
ptc::Index ContiguousStart(const ptc::LocalTensor& local, const ptc::ShardKey& key) {
  ptc::Index start = -1, next = 0;
  size_t box = 0;
  for (const ptc::Segment& seg : local.segments) {
    if (seg.tensor != key.tensor) continue;
    if (box >= key.boxes.size() || !(seg.box == key.boxes[box])) return -1;
    if (start < 0) start = next = seg.layout.offset;
    if (!(seg.layout == ptc::DenseLayout(seg.box, next))) return -1;
    next += seg.box.volume();
    ++box;
  }
  return box == key.boxes.size() ? start : -1;
}

// `tensors` as one rank file, or nullopt when a shard of them is not
// contiguous or already placed (`placed` is updated only on success).
ptc::Result<std::optional<ptc::RankFileSpec>> PlanFile(const std::vector<ptc::LocalTensor>& tensors,
                                                       const std::map<std::string, std::string>& metadata, int worker,
                                                       std::string name, std::set<Key>* placed) {
  std::vector<ptc::TensorSpec> specs;
  for (const ptc::LocalTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  ptc::RankFileSpec file;
  file.worker = worker;
  file.name = std::move(name);
  PTC_ASSIGN_OR_RETURN(file.header, ptc::EncodeSafetensorsHeader(specs, metadata));
  uint64_t pos = file.header.size();
  std::set<Key> mine;
  for (const ptc::LocalTensor& t : tensors) {
    const uint64_t elem = ptc::DTypeSize(t.dtype);
    for (const ptc::ShardKey& key : ptc::StoredShards(t)) {
      uint64_t bytes = 0;
      for (const ptc::Box& b : key.boxes) bytes += static_cast<uint64_t>(b.volume()) * elem;
      if (bytes == 0) continue;
      const ptc::Index start = ContiguousStart(t, key);
      Key k{worker, key.tensor, key.boxes};
      if (start < 0 || placed->count(k) || !mine.insert(k).second) return std::nullopt;
      file.placements.push_back({key.tensor, key.boxes, pos + static_cast<uint64_t>(start) * elem});
    }
    pos += static_cast<uint64_t>(ptc::NumElements(t.shape)) * elem;
  }
  file.size = pos;
  if (file.placements.empty()) return std::nullopt;
  placed->insert(mine.begin(), mine.end());
  return file;
}

}  // namespace

std::map<std::string, std::string> SafetensorsMetadata(const ptc::ParallelConfig& config, int rank) {
  return {{"format", "pt"}, {"ptcfs.rank", std::to_string(rank)}, {"ptcfs.config", config.ToString()}};
}

ptc::Result<std::vector<ptc::RankFileSpec>> PlanRankFiles(const ptc::ModelLayout& layout) {
  const ptc::ParallelConfig& config = layout.config();
  std::vector<ptc::RankFileSpec> out;
  std::set<Key> placed;
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, layout.View(rank));
    const int worker = config.WorkerOf(rank);
    const auto metadata = SafetensorsMetadata(config, rank);
    const std::string dir = ptc::RankDirName(rank);
    for (const auto& [list, file] : {std::pair{&view.model, "model.safetensors"}, {&view.optim, "optim.safetensors"}}) {
      if (list->empty()) continue;
      PTC_ASSIGN_OR_RETURN(auto planned, PlanFile(*list, metadata, worker, dir + "." + file, &placed));
      if (planned) out.push_back(std::move(*planned));
    }
  }
  return out;
}

bool RankFilesWritten(const std::vector<ptc::RankFileSpec>& files, const ptc::GenerationManifest& generation) {
  std::map<Key, const ptc::ShardRecord*> records;
  for (const ptc::ShardRecord& s : generation.shards) records[{s.worker, s.tensor, s.boxes}] = &s;
  for (const ptc::RankFileSpec& f : files) {
    for (const ptc::RankFileSpec::Placement& p : f.placements) {
      auto it = records.find({f.worker, p.tensor, p.boxes});
      if (it == records.end()) return false;
      const ptc::ShardRecord& s = *it->second;
      const bool in_file = s.file.size() > f.name.size() && s.file.ends_with("/" + f.name);
      if (s.h5.empty() || !in_file || s.offset != p.offset) return false;
    }
  }
  return true;
}

ptc::Result<RankFileCompaction> PlanRankFileCompaction(const ptc::Store& store) {
  RankFileCompaction out;
  PTC_ASSIGN_OR_RETURN(out.compaction, ptc::transform::PlanCompaction(store));
  ptc::transform::Compaction& c = out.compaction;
  PTC_ASSIGN_OR_RETURN(const ptc::ModelLayout layout, ptc::ModelLayout::Make(c.spec, c.config));
  PTC_ASSIGN_OR_RETURN(out.files, PlanRankFiles(layout));
  if (RankFilesWritten(out.files, *c.source)) return out;
  // Every target written: those stored as they are copied from that shard, box by box.
  PTC_ASSIGN_OR_RETURN(ptc::transform::Plan plan,
                       ptc::transform::MakePlan({c.source.get(), c.spec, c.config, {}, std::nullopt}));
  std::vector<ptc::transform::Copy> copies;
  size_t next = 0;
  for (size_t t = 0; t < plan.targets.size(); ++t) {
    ptc::transform::TargetShard& target = plan.targets[t];
    while (next < plan.copies.size() && plan.copies[next].target == t) copies.push_back(plan.copies[next++]);
    const std::optional<size_t> stored = target.kept ? target.kept : target.same;
    if (!stored) continue;
    const uint64_t elem = ptc::DTypeSize(target.dtype);
    for (const ptc::Box& box : target.key.boxes) {
      copies.push_back({t, *stored, box, static_cast<uint64_t>(box.volume()) * elem});
    }
    target.kept.reset();
    target.same.reset();
  }
  plan.copies = std::move(copies);
  c.covering = ptc::transform::MakeCovering(plan, *c.source, ptc::transform::CommitMode::kCompact);
  return out;
}

}  // namespace ptcfs
