#include "transform/stream.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

#include "ptc/store/generation_writer.h"
#include "ptc/store/shard_verify.h"

namespace ptc::transform::internal {
namespace {

// Rows are the indices of dimension 0; a scalar box is one row.
Index RowBegin(const Box& b) { return b.rank() ? b.begin[0] : 0; }
Index RowEnd(const Box& b) { return b.rank() ? b.end[0] : 1; }

// Bytes of one row of `b` stored densely.
uint64_t RowBytes(const Box& b, size_t elem) {
  const Index rows = RowEnd(b) - RowBegin(b);
  return rows > 0 ? static_cast<uint64_t>(b.volume() / rows) * elem : 0;
}

// The part of `b` in rows [r0, r1).
Box Rows(const Box& b, Index r0, Index r1) {
  Box p = b;
  if (p.rank()) p.begin[0] = std::max(b.begin[0], r0), p.end[0] = std::min(b.end[0], r1);
  return p;
}

// A shard can be swept when its boxes have rank `rank` and each ends (in
// rows) before the next begins: then rows in increasing order are its bytes
// in file order.
bool RowOrdered(const std::vector<Box>& boxes, size_t rank) {
  if (boxes.empty()) return false;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i].rank() != rank) return false;
    if (i > 0 && (rank == 0 || boxes[i - 1].end[0] > boxes[i].begin[0])) return false;
  }
  return true;
}

size_t Root(std::vector<size_t>& parent, size_t x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

// One box of a shard of the group.
struct Segment {
  bool source;   // else a target
  size_t shard;  // index into GroupStream::sources_ or targets_
  const Box* box;
  uint64_t row_bytes;
};

class GroupStream {
 public:
  GroupStream(const CopyGroup& group, const Plan& plan, const std::vector<size_t>& first_copy, const Store& store,
              const GenerationManifest& source, const ExecuteOptions& options, Scratch* scratch)
      : group_(group),
        plan_(plan),
        first_copy_(first_copy),
        store_(store),
        manifest_(source),
        options_(options),
        scratch_(scratch),
        elem_(DTypeSize(plan.targets[group.targets.front()].dtype)) {}

  Status Run(GenerationWriter* writer);

 private:
  struct Source {
    std::unique_ptr<VerifyingShardReader> reader;
    bool checked = false;
    Box part;                    // this band's rows of its box
    const char* data = nullptr;  // their bytes; null when not in this band
  };
  struct Target {
    size_t index = 0;  // into Plan::targets
    std::unique_ptr<ShardSink> sink;
    Box part;
    const char* data = nullptr;  // this band's bytes: assembled, or a source's
  };

  Status Open(GenerationWriter* writer);
  std::vector<Segment> Segments() const;
  Status Band(const std::vector<const Segment*>& active, Index r0, Index r1);
  Status Assemble(Target& target, Index r0, Index r1, char** mem);
  Status Check(Source& s);

  const CopyGroup& group_;
  const Plan& plan_;
  const std::vector<size_t>& first_copy_;
  const Store& store_;
  const GenerationManifest& manifest_;
  const ExecuteOptions& options_;
  Scratch* scratch_;
  const size_t elem_;
  std::vector<Source> sources_;
  std::vector<Target> targets_;
  std::unordered_map<size_t, size_t> local_;  // manifest index -> index into sources_
};

Status GroupStream::Open(GenerationWriter* writer) {
  for (size_t s : group_.sources) {
    local_[s] = sources_.size();
    PTC_ASSIGN_OR_RETURN(auto reader, VerifyingShardReader::Open(store_.env(), store_, manifest_.shards[s]));
    sources_.emplace_back();
    sources_.back().reader = std::move(reader);
  }
  for (size_t t : group_.targets) {
    const TargetShard& target = plan_.targets[t];
    PTC_ASSIGN_OR_RETURN(auto sink, writer->NewShard(target.key.tensor, target.dtype, target.key.boxes, target.worker));
    if (const ShardRecord* same = VerbatimSource(plan_, first_copy_, t, manifest_)) {
      PTC_RETURN_IF_ERROR(sink->AdoptChecksums(*same));
    }
    targets_.emplace_back();
    targets_.back().index = t;
    targets_.back().sink = std::move(sink);
  }
  return Status::OK();
}

// Sources first, so that a band reads them before it assembles the targets.
std::vector<Segment> GroupStream::Segments() const {
  std::vector<Segment> segs;
  for (size_t i = 0; i < sources_.size(); ++i) {
    for (const Box& b : sources_[i].reader->shard().boxes) segs.push_back({true, i, &b, RowBytes(b, elem_)});
  }
  for (size_t i = 0; i < targets_.size(); ++i) {
    for (const Box& b : plan_.targets[targets_[i].index].key.boxes) segs.push_back({false, i, &b, RowBytes(b, elem_)});
  }
  return segs;
}

Status GroupStream::Check(Source& s) {
  if (s.checked) return Status::OK();
  s.checked = true;
  return s.reader->Finish();
}

Status GroupStream::Run(GenerationWriter* writer) {
  PTC_RETURN_IF_ERROR(Open(writer));
  const std::vector<Segment> segs = Segments();
  // Between consecutive row boundaries the same segments are active.
  std::vector<Index> bounds;
  for (const Segment& s : segs) bounds.push_back(RowBegin(*s.box)), bounds.push_back(RowEnd(*s.box));
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::vector<const Segment*> active;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    const Index lo = bounds[i], hi = bounds[i + 1];
    active.clear();
    uint64_t row_bytes = 0;
    for (const Segment& s : segs) {
      if (RowBegin(*s.box) <= lo && RowEnd(*s.box) >= hi) active.push_back(&s), row_bytes += s.row_bytes;
    }
    if (active.empty()) continue;
    const Index step = row_bytes ? std::max<Index>(1, static_cast<Index>(options_.chunk_bytes / row_bytes)) : hi - lo;
    for (Index r = lo; r < hi; r += step) PTC_RETURN_IF_ERROR(Band(active, r, std::min(hi, r + step)));
  }
  for (Source& s : sources_) PTC_RETURN_IF_ERROR(Check(s));
  for (Target& t : targets_) {
    PTC_ASSIGN_OR_RETURN(ShardRecord record, t.sink->Finish());
    writer->AddShard(std::move(record));
  }
  return Status::OK();
}

// Rows [r0, r1): read every active source's rows, then assemble and append
// every active target's.
Status GroupStream::Band(const std::vector<const Segment*>& active, Index r0, Index r1) {
  uint64_t need = 0;
  for (const Segment* s : active) need += static_cast<uint64_t>(r1 - r0) * s->row_bytes;
  char* mem = scratch_->Get(need);
  for (Source& s : sources_) s.data = nullptr;
  for (const Segment* seg : active) {
    const uint64_t n = static_cast<uint64_t>(r1 - r0) * seg->row_bytes;
    if (seg->source) {
      Source& s = sources_[seg->shard];
      s.part = Rows(*seg->box, r0, r1);
      PTC_ASSIGN_OR_RETURN(s.data, s.reader->Next(n, mem));
      mem += n;
      if (s.reader->position() == s.reader->shard().nbytes) PTC_RETURN_IF_ERROR(Check(s));
      continue;
    }
    Target& t = targets_[seg->shard];
    t.part = Rows(*seg->box, r0, r1);
    PTC_RETURN_IF_ERROR(Assemble(t, r0, r1, &mem));
    PTC_RETURN_IF_ERROR(t.sink->Append(t.data, n));
    PTC_RETURN_IF_ERROR(Advance(options_, n));
  }
  return Status::OK();
}

// Points t.data at the bytes of t.part: a source's own band when it is the
// same box, else a copy assembled at *mem from the sources' bands.
Status GroupStream::Assemble(Target& t, Index r0, Index r1, char** mem) {
  t.data = nullptr;
  char* assembled = nullptr;
  Index covered = 0;
  for (size_t c = first_copy_[t.index]; c < first_copy_[t.index + 1]; ++c) {
    const Copy& copy = plan_.copies[c];
    if (RowEnd(copy.region) <= r0 || RowBegin(copy.region) >= r1) continue;
    const Source& s = sources_[local_.at(copy.source)];
    const Box part = Rows(copy.region, r0, r1);
    if (s.data == nullptr || !Contains(s.part, part) || !Contains(t.part, part)) {
      return InternalError("copy " + part.ToString() + " of tensor '" + plan_.targets[t.index].key.tensor +
                           "' is outside the rows being written");
    }
    if (part == t.part && part == s.part) {
      t.data = s.data;  // the band is exactly what was read
      covered = part.volume();
      break;
    }
    if (t.data == nullptr) {
      assembled = *mem;
      t.data = assembled;
      *mem += static_cast<uint64_t>(t.part.volume()) * elem_;
    }
    CopyRegion(part, s.data, s.part, DenseLayout(s.part), assembled, t.part, DenseLayout(t.part), elem_);
    covered += part.volume();
  }
  if (covered != t.part.volume()) {
    return InternalError("the copies of tensor '" + plan_.targets[t.index].key.tensor + "' do not tile " +
                         t.part.ToString());
  }
  return Status::OK();
}

}  // namespace

char* Scratch::Get(size_t n) {
  if (n > size_) {
    size_ = std::max(n, 2 * size_);
    buf_ = std::make_unique_for_overwrite<char[]>(size_);
  }
  return buf_.get();
}

const ShardRecord* VerbatimSource(const Plan& plan, const std::vector<size_t>& first_copy, size_t t,
                                  const GenerationManifest& source) {
  if (first_copy[t + 1] - first_copy[t] != 1) return nullptr;
  const TargetShard& target = plan.targets[t];
  const ShardRecord& s = source.shards[plan.copies[first_copy[t]].source];
  const bool same = s.tensor == target.key.tensor && s.boxes == target.key.boxes && s.nbytes == target.nbytes;
  return same ? &s : nullptr;
}

std::vector<size_t> FirstCopies(const Plan& plan) {
  std::vector<size_t> first(plan.targets.size() + 1);
  size_t c = 0;
  for (size_t t = 0; t < plan.targets.size(); ++t) {
    first[t] = c;
    while (c < plan.copies.size() && plan.copies[c].target == t) ++c;
  }
  first[plan.targets.size()] = c;
  return first;
}

std::vector<CopyGroup> GroupTargets(const Plan& plan, const std::vector<size_t>& first_copy,
                                    const std::vector<size_t>& to_write, const GenerationManifest& source) {
  // Union-find over targets: two targets that read one source share a group.
  std::vector<size_t> parent(plan.targets.size());
  std::iota(parent.begin(), parent.end(), 0);
  std::unordered_map<size_t, size_t> reader;  // source -> a target that reads it
  for (size_t t : to_write) {
    for (size_t c = first_copy[t]; c < first_copy[t + 1]; ++c) {
      auto [it, fresh] = reader.try_emplace(plan.copies[c].source, t);
      if (!fresh) parent[Root(parent, t)] = Root(parent, it->second);
    }
  }
  std::vector<CopyGroup> groups;
  std::unordered_map<size_t, size_t> group_of_root;
  for (size_t t : to_write) {
    auto [it, fresh] = group_of_root.try_emplace(Root(parent, t), groups.size());
    if (fresh) groups.emplace_back();
    CopyGroup& g = groups[it->second];
    g.targets.push_back(t);
    g.bytes += plan.targets[t].nbytes;
    for (size_t c = first_copy[t]; c < first_copy[t + 1]; ++c) g.sources.push_back(plan.copies[c].source);
  }
  for (CopyGroup& g : groups) {
    std::sort(g.targets.begin(), g.targets.end());
    std::sort(g.sources.begin(), g.sources.end());
    g.sources.erase(std::unique(g.sources.begin(), g.sources.end()), g.sources.end());
    const size_t rank = plan.targets[g.targets.front()].key.boxes.empty()
                            ? 0
                            : plan.targets[g.targets.front()].key.boxes.front().rank();
    g.streamable = true;
    for (size_t t : g.targets) g.streamable = g.streamable && RowOrdered(plan.targets[t].key.boxes, rank);
    for (size_t s : g.sources) g.streamable = g.streamable && RowOrdered(source.shards[s].boxes, rank);
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const CopyGroup& a, const CopyGroup& b) { return a.bytes > b.bytes; });
  return groups;
}

Status StreamGroup(const CopyGroup& group, const Plan& plan, const std::vector<size_t>& first_copy, const Store& store,
                   const GenerationManifest& source, GenerationWriter* writer, const ExecuteOptions& options,
                   Scratch* scratch) {
  GroupStream stream(group, plan, first_copy, store, source, options, scratch);
  return stream.Run(writer);
}

}  // namespace ptc::transform::internal
