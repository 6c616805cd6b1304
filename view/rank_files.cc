#include "view/rank_files.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <tuple>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/format/safetensors.h"
#include "transform/covering.h"
#include "transform/plan.h"
#include "view/dcp_file.h"
#include "view/megatron_file.h"

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

// One file's plan before the copy budget: its spec and the bytes of its copies.
struct Candidate {
  ptc::RankFileSpec spec;
  uint64_t copy_bytes = 0;
};

// Places the stored shards of `t`, whose bytes start at `base` of `c`'s file:
// a shard its worker stores in no file yet (`placed`, nor `mine`: this
// file's) is placed, any other copied. False when a shard is not contiguous.
bool PlaceTensor(const ptc::LocalTensor& t, uint64_t base, const std::set<Key>& placed, std::set<Key>* mine,
                 Candidate* c) {
  ptc::RankFileSpec& file = c->spec;
  const uint64_t elem = ptc::DTypeSize(t.dtype);
  for (const ptc::ShardKey& key : ptc::StoredShards(t)) {
    uint64_t bytes = 0;
    for (const ptc::Box& b : key.boxes) bytes += static_cast<uint64_t>(b.volume()) * elem;
    if (bytes == 0) continue;
    const ptc::Index start = ContiguousStart(t, key);
    if (start < 0) return false;
    const uint64_t at = base + static_cast<uint64_t>(start) * elem;
    Key k{file.worker, key.tensor, key.boxes};
    if (placed.count(k) || !mine->insert(k).second) {
      file.copies.push_back({key.tensor, key.boxes, at});
      c->copy_bytes += bytes;
    } else {
      file.placements.push_back({key.tensor, key.boxes, at});
    }
  }
  return true;
}

// The file of `c` once its tensors are placed (`mine`): nullopt when it
// places and copies nothing; else its shards join `placed`.
std::optional<Candidate> Finish(Candidate c, const std::set<Key>& mine, std::set<Key>* placed) {
  if (c.spec.placements.empty() && c.spec.copies.empty()) return std::nullopt;
  placed->insert(mine.begin(), mine.end());
  return c;
}

// `tensors` as one safetensors rank file: the shards its worker does not
// store yet placed in it (added to `placed`), copies of the others; nullopt
// when a shard is not contiguous in it (`placed` unchanged then).
ptc::Result<std::optional<Candidate>> PlanFile(const std::vector<ptc::LocalTensor>& tensors,
                                               const std::map<std::string, std::string>& metadata, int worker,
                                               std::string name, std::set<Key>* placed) {
  std::vector<ptc::TensorSpec> specs;
  for (const ptc::LocalTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  Candidate c;
  c.spec.worker = worker;
  c.spec.name = std::move(name);
  PTC_ASSIGN_OR_RETURN(std::string header, ptc::EncodeSafetensorsHeader(specs, metadata));
  uint64_t pos = header.size();
  c.spec.literals.push_back({0, std::move(header)});
  std::set<Key> mine;
  for (const ptc::LocalTensor& t : tensors) {
    if (!PlaceTensor(t, pos, *placed, &mine, &c)) return std::nullopt;
    pos += static_cast<uint64_t>(ptc::NumElements(t.shape)) * ptc::DTypeSize(t.dtype);
  }
  c.spec.size = pos;
  return Finish(std::move(c), mine, placed);
}

// Rank `rank`'s model_optim_rng.pt as one rank file, as PlanFile.
ptc::Result<std::optional<Candidate>> PlanMegatronRankFile(const ptc::ModelLayout& layout, const ptc::RankView& view,
                                                           const RankFileOptions& options,
                                                           const MegatronInputs& megatron, std::set<Key>* placed) {
  const std::string what = ptc::RankDirName(view.rank);
  const auto crcs = megatron.crcs.find(view.rank);
  if (crcs == megatron.crcs.end()) return std::nullopt;  // another worker's file (ReadMegatronInputs)
  PTC_ASSIGN_OR_RETURN(MegatronFilePlan plan,
                       PlanMegatronFile(layout.spec(), layout.config(), view, megatron.state, options.names), what);
  PTC_ASSIGN_OR_RETURN(MegatronFileBytes bytes, LayMegatronFile(plan, crcs->second), what);
  Candidate c;
  c.spec.worker = layout.config().WorkerOf(view.rank);
  c.spec.name = what + "." + kMegatronArchive + ".pt";
  c.spec.size = bytes.size;
  std::set<Key> mine;
  for (MegatronFilePart& part : bytes.parts) {
    if (part.tensor == nullptr) {
      c.spec.literals.push_back({part.offset, std::move(part.literal)});
    } else if (!PlaceTensor(*part.tensor, part.offset, *placed, &mine, &c)) {
      return std::nullopt;
    }
  }
  return Finish(std::move(c), mine, placed);
}

uint64_t PlacedBytes(const ptc::RankFileSpec& f, const std::map<std::string, size_t>& elem) {
  uint64_t n = 0;
  for (const auto& p : f.placements) {
    for (const ptc::Box& b : p.boxes) n += static_cast<uint64_t>(b.volume()) * elem.at(p.tensor);
  }
  return n;
}

// Keeps the copies of the files that fit their worker's budget (fewest copy
// bytes first); drops the copies, or the file when it places nothing, of the others.
std::vector<ptc::RankFileSpec> ApplyBudget(std::vector<Candidate> files, const std::map<std::string, size_t>& elem,
                                           uint64_t budget) {
  std::map<int, uint64_t> left;  // per worker
  for (const Candidate& c : files) {
    uint64_t& l = left[c.spec.worker];
    if (budget == RankFileOptions::kWorkerStored) {
      l += PlacedBytes(c.spec, elem);
    } else {
      l = budget;
    }
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < files.size(); ++i) {
    if (files[i].copy_bytes > 0) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return files[a].copy_bytes < files[b].copy_bytes; });
  for (size_t i : order) {
    uint64_t& l = left[files[i].spec.worker];
    if (files[i].copy_bytes <= l) {
      l -= files[i].copy_bytes;
    } else {
      files[i].spec.copies.clear();
    }
  }
  std::vector<ptc::RankFileSpec> out;
  for (Candidate& c : files) {
    if (!c.spec.placements.empty() || !c.spec.copies.empty()) out.push_back(std::move(c.spec));
  }
  return out;
}

}  // namespace

ptc::Result<uint64_t> ParseCopyBudget(const std::string& text) {
  if (text == "all") return RankFileOptions::kAll;
  if (text == "none") return uint64_t{0};
  if (text == "stored") return RankFileOptions::kWorkerStored;
  const auto bad = [&] {
    return ptc::InvalidArgumentError("'" + text +
                                     "': expected all, none, stored or a byte count (K, M, G, T suffixes)");
  };
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return bad();
  size_t used = 0;
  uint64_t n = 0;
  while (used < text.size() && std::isdigit(static_cast<unsigned char>(text[used]))) {
    if (__builtin_mul_overflow(n, uint64_t{10}, &n) ||
        __builtin_add_overflow(n, static_cast<uint64_t>(text[used] - '0'), &n)) {
      return bad();
    }
    ++used;
  }
  static const std::map<std::string, int> kShifts = {{"", 0}, {"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}};
  const auto shift = kShifts.find(text.substr(used));
  if (shift == kShifts.end() || n > ((RankFileOptions::kWorkerStored - 1) >> shift->second)) return bad();
  return n << shift->second;
}

std::map<std::string, std::string> SafetensorsMetadata(const ptc::ParallelConfig& config, int rank) {
  return {{"format", "pt"}, {"ptcfs.rank", std::to_string(rank)}, {"ptcfs.config", config.ToString()}};
}

ptc::Result<RankFileFormat> ParseRankFileFormat(const std::string& text) {
  if (text == "safetensors") return RankFileFormat::kSafetensors;
  if (text == "megatron") return RankFileFormat::kMegatron;
  if (text == "dcp") return RankFileFormat::kDcp;
  return ptc::InvalidArgumentError("'" + text + "': expected safetensors, megatron or dcp");
}

namespace {

// The name of a DCP rank file is its keys' prefix and the file's name: a
// change of keys is a change of files.
std::string DcpRankFilePrefix(ptc::dcp::Keys keys) {
  switch (keys) {
    case ptc::dcp::Keys::kTorch:
      return "dcp.";
    case ptc::dcp::Keys::kMegatronCore:
      return "torch_dist.";
    case ptc::dcp::Keys::kTorchtitan:
      return "dcp-torchtitan.";
  }
  return "dcp.";
}

}  // namespace

ptc::Result<std::vector<ptc::RankFileSpec>> PlanDcpRankFiles(const ptc::GenerationManifest& m, ptc::dcp::Keys keys) {
  PTC_ASSIGN_OR_RETURN(const ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(m, keys));
  std::set<Key> stored;
  for (const ptc::ShardRecord& s : m.shards) stored.insert({s.worker, s.tensor, s.boxes});
  std::vector<ptc::RankFileSpec> out;
  for (const ptc::dcp::File& f : plan.files) {
    ptc::RankFileSpec spec;
    spec.worker = f.worker;
    spec.name = DcpRankFilePrefix(keys) + f.name;
    spec.size = f.size;
    bool whole = true;  // every chunk's storage a piece of the worker
    for (const ptc::dcp::Chunk& c : f.chunks) {
      PTC_ASSIGN_OR_RETURN(DcpChunkBytes bytes, LayDcpChunk(plan, c), f.name);
      for (auto& [at, text] : bytes.literals) spec.literals.push_back({at, std::move(text)});
      if (bytes.storage_size == 0) continue;
      const ptc::dcp::Tensor& t = plan.tensors[c.tensor];
      const std::vector<ptc::Segment> segments = ptc::dcp::ChunkSegments(t, c.box);
      if (segments.size() != 1 || !(segments[0].layout == ptc::DenseLayout(segments[0].box, 0)) ||
          !stored.count({f.worker, segments[0].tensor, {segments[0].box}})) {
        whole = false;
        break;
      }
      spec.placements.push_back({segments[0].tensor, {segments[0].box}, bytes.storage_offset});
    }
    if (whole) out.push_back(std::move(spec));
  }
  return out;
}

ptc::Result<MegatronInputs> ReadMegatronInputs(const ptc::Store& store,
                                               std::shared_ptr<const ptc::GenerationManifest> generation,
                                               const ptc::ModelLayout& layout, ptc::megatron::NameSet names,
                                               int worker) {
  MegatronInputs in;
  PTC_ASSIGN_OR_RETURN(in.state,
                       ptc::megatron::LoadMegatronState(generation->extra, store.ManifestPath(generation->generation)));
  ptc::GenerationReader reader(store, generation, /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(const std::vector<ptc::RankView> views, MegatronTreeViews(layout));
  for (const ptc::RankView& view : views) {
    const std::string what = ptc::RankDirName(view.rank);
    const int holder = layout.config().WorkerOf(view.rank);
    if (worker >= 0 && holder != worker) continue;
    PTC_ASSIGN_OR_RETURN(MegatronFilePlan plan, PlanMegatronFile(layout.spec(), layout.config(), view, in.state, names),
                         what);
    auto verified = [](const ptc::ShardRecord&, uint64_t, uint64_t) {
      return ptc::Status::OK();  // the reader verifies each shard when it opens it
    };
    PTC_ASSIGN_OR_RETURN(in.crcs[view.rank], StorageCrcs(reader, plan, holder, verified), what);
  }
  return in;
}

ptc::Result<std::vector<ptc::RankFileSpec>> PlanRankFiles(const ptc::ModelLayout& layout,
                                                          const RankFileOptions& options,
                                                          const MegatronInputs* megatron) {
  if (options.format == RankFileFormat::kDcp) {
    return ptc::InvalidArgumentError("DCP rank files are those of a generation (PlanDcpRankFiles)");
  }
  const ptc::ParallelConfig& config = layout.config();
  std::vector<Candidate> files;
  std::map<std::string, size_t> elem;  // per global tensor
  std::set<Key> placed;
  if (options.format == RankFileFormat::kMegatron) {
    if (megatron == nullptr) return ptc::InvalidArgumentError("Megatron rank files: no Megatron state given");
    PTC_ASSIGN_OR_RETURN(const std::vector<ptc::RankView> views, MegatronTreeViews(layout));
    for (const ptc::RankView& view : views) {
      for (const auto* list : {&view.model, &view.optim}) {
        for (const ptc::LocalTensor& t : *list) {
          for (const ptc::Segment& seg : t.segments) elem[seg.tensor] = ptc::DTypeSize(t.dtype);
        }
      }
      PTC_ASSIGN_OR_RETURN(auto planned, PlanMegatronRankFile(layout, view, options, *megatron, &placed));
      if (planned) files.push_back(std::move(*planned));
    }
    return ApplyBudget(std::move(files), elem, options.copy_budget);
  }
  for (int rank = 0; rank < config.world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, layout.View(rank));
    const int worker = config.WorkerOf(rank);
    const auto metadata = SafetensorsMetadata(config, rank);
    const std::string dir = ptc::RankDirName(rank);
    for (const auto& [list, file] : {std::pair{&view.model, "model.safetensors"}, {&view.optim, "optim.safetensors"}}) {
      if (list->empty()) continue;
      for (const ptc::LocalTensor& t : *list) {
        for (const ptc::Segment& seg : t.segments) elem[seg.tensor] = ptc::DTypeSize(t.dtype);
      }
      PTC_ASSIGN_OR_RETURN(auto planned, PlanFile(*list, metadata, worker, dir + "." + file, &placed));
      if (planned) files.push_back(std::move(*planned));
    }
  }
  return ApplyBudget(std::move(files), elem, options.copy_budget);
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
    if (f.copies.empty()) continue;
    const auto listed = std::find_if(
        generation.rank_file_copies.begin(), generation.rank_file_copies.end(), [&](const ptc::RankFileCopies& c) {
          return c.worker == f.worker && c.file.size() > f.name.size() && c.file.ends_with("/" + f.name);
        });
    if (listed == generation.rank_file_copies.end()) return false;
    for (const ptc::RankFileSpec::Placement& p : f.copies) {
      const ptc::CopyRecord want{p.tensor, p.boxes, p.offset};
      if (std::find(listed->copies.begin(), listed->copies.end(), want) == listed->copies.end()) return false;
    }
  }
  return true;
}

ptc::Result<RankFileCompaction> PlanRankFileCompaction(ptc::transform::Compaction planned,
                                                       const ptc::ModelLayout& layout, const RankFileOptions& options,
                                                       const MegatronInputs* megatron) {
  RankFileCompaction out;
  out.compaction = std::move(planned);
  ptc::transform::Compaction& c = out.compaction;
  PTC_ASSIGN_OR_RETURN(ptc::transform::Plan plan, ptc::transform::MakePlan({.source = c.source.get(),
                                                                            .spec = c.spec,
                                                                            .target = c.config,
                                                                            .alive = std::nullopt,
                                                                            .box_targets = c.box_targets}));
  if (options.format == RankFileFormat::kDcp) {
    // The generation written: the source's, its pieces the plan's targets.
    ptc::GenerationManifest written = *c.source;
    written.rank_file_copies.clear();
    written.shards.clear();
    for (const ptc::transform::TargetShard& t : plan.targets) {
      ptc::ShardRecord r;
      r.tensor = t.key.tensor;
      r.worker = t.worker;
      r.boxes = t.key.boxes;
      r.nbytes = t.nbytes;
      written.shards.push_back(std::move(r));
    }
    PTC_ASSIGN_OR_RETURN(out.files, PlanDcpRankFiles(written, options.dcp_keys));
  } else {
    PTC_ASSIGN_OR_RETURN(out.files, PlanRankFiles(layout, options, megatron));
  }
  if (RankFilesWritten(out.files, *c.source)) return out;
  // Every target written: those stored as they are copied from that shard, box by box.
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

ptc::Result<RankFileCompaction> PrepareRankFileCompaction(const ptc::Store& store, ptc::transform::Compaction planned,
                                                          const ptc::ModelLayout& layout,
                                                          const RankFileOptions& options, int worker) {
  if (options.format != RankFileFormat::kMegatron) return PlanRankFileCompaction(std::move(planned), layout, options);
  PTC_ASSIGN_OR_RETURN(MegatronInputs megatron,
                       ReadMegatronInputs(store, planned.source, layout, options.names, worker),
                       "the Megatron rank files' CRCs");
  return PlanRankFileCompaction(std::move(planned), layout, options, &megatron);
}

}  // namespace ptcfs
