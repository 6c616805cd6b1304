#include "transform/device/switch_plan.h"

#include <algorithm>
#include <set>

#include "ptc/store/manifest.h"
#include "transform/plan.h"

namespace ptc::transform::device {
namespace {

constexpr const char* kGradSuffix = ".grad";

uint64_t AlignUp(uint64_t n) { return (n + kStagingAlign - 1) / kStagingAlign * kStagingAlign; }

// Where a (global tensor, box) lives on one rank: buffer and segment.
struct Place {
  int buffer;
  const Segment* segment;
};
using PlaceMap = std::map<std::pair<std::string, Box>, std::vector<Place>>;

PlaceMap IndexBuffers(const std::vector<LocalTensor>& buffers) {
  PlaceMap out;
  for (size_t b = 0; b < buffers.size(); ++b) {
    for (const Segment& s : buffers[b].segments) out[{s.tensor, s.box}].push_back({static_cast<int>(b), &s});
  }
  return out;
}

// Element address of region.begin inside a segment, and the segment's strides.
int64_t AddressOf(const Segment& s, const Box& region) {
  int64_t a = s.layout.offset;
  for (size_t d = 0; d < region.rank(); ++d) a += (region.begin[d] - s.box.begin[d]) * s.layout.strides[d];
  return a;
}

// The box of `boxes` that contains `region`.
const Box* Containing(const std::vector<Box>& boxes, const Box& region) {
  for (const Box& b : boxes) {
    if (Contains(b, region)) return &b;
  }
  return nullptr;
}

// Cuts `region` into boxes of at most `limit` bytes (limit >= elem), row-major.
void SplitRegion(const Box& region, size_t elem, uint64_t limit, std::vector<Box>* out) {
  if (static_cast<uint64_t>(region.volume()) * elem <= limit) {
    out->push_back(region);
    return;
  }
  size_t d = 0;
  while (region.end[d] - region.begin[d] == 1) ++d;
  const uint64_t step = static_cast<uint64_t>(region.volume() / (region.end[d] - region.begin[d])) * elem;
  const Index rows = step <= limit ? static_cast<Index>(limit / step) : 1;
  for (Index i = region.begin[d]; i < region.end[d]; i += rows) {
    Box part = region;
    part.begin[d] = i;
    part.end[d] = std::min(region.end[d], i + rows);
    if (step <= limit) {
      out->push_back(part);
    } else {
      SplitRegion(part, elem, limit, out);
    }
  }
}

// One remote piece: a region of a source segment on `from` for target
// segments on `to` (all the target's places of that box).
struct Piece {
  int from, to;
  Place src;
  std::vector<Place> dst;
  Box region;
  uint32_t elem;
  uint64_t padded() const { return AlignUp(static_cast<uint64_t>(region.volume()) * elem); }
};

Status DescribeCopy(int32_t src, int64_t src_offset, const std::vector<Index>& src_strides, int32_t dst,
                    int64_t dst_offset, const std::vector<Index>& dst_strides, const Box& region, uint32_t elem,
                    const std::string& tensor, std::vector<StridedCopy>* out) {
  StridedCopy c;
  if (!MakeCopy(src, src_offset, src_strides, dst, dst_offset, dst_strides, region.shape(), elem, &c)) {
    return InvalidArgumentError("switch plan: the copy of " + tensor + region.ToString() + " needs more than " +
                                std::to_string(kMaxCopyDims) + " strided dimensions");
  }
  out->push_back(c);
  return Status();
}

class Scheduler {
 public:
  Scheduler(const SwitchRequest& req, SwitchPlan* plan) : req_(req), plan_(plan) {}

  Status Build() {
    const int world = std::max(req_.from.world_size(), req_.to.world_size());
    plan_->world = world;
    plan_->ranks.resize(world);
    PTC_ASSIGN_OR_RETURN(const ModelLayout a, SwitchLayout(req_.spec, req_.from, req_.contents), "layout A");
    PTC_ASSIGN_OR_RETURN(const ModelLayout b, SwitchLayout(req_.spec, req_.to, req_.contents), "layout B");
    for (int r = 0; r < world; ++r) {
      RankSchedule& rs = plan_->ranks[r];
      PTC_ASSIGN_OR_RETURN(rs.from, SwitchBuffers(a, r, req_.contents), "layout A");
      PTC_ASSIGN_OR_RETURN(rs.to, SwitchBuffers(b, r, req_.contents), "layout B");
      from_places_.push_back(IndexBuffers(rs.from));
      to_places_.push_back(IndexBuffers(rs.to));
      for (const LocalTensor& t : rs.to) {
        for (const Segment& s : t.segments) plan_->bytes_total += s.box.volume() * DTypeSize(t.dtype);
      }
    }
    PTC_ASSIGN_OR_RETURN(Plan plan, PlanOverRanks());
    PTC_RETURN_IF_ERROR(Emit(plan));
    return Bucket();
  }

 private:
  // The planner over a manifest whose "workers" are the ranks of layout A.
  Result<Plan> PlanOverRanks() {
    ParallelConfig from = req_.from, to = req_.to;
    from.per_worker = to.per_worker = 1;  // a worker per rank
    PTC_ASSIGN_OR_RETURN(const ModelLayout a, SwitchLayout(req_.spec, from, req_.contents), "layout A");
    const ModelSpec& spec = a.spec();
    PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(spec));
    for (const GlobalTensor& g : globals) {
      source_.tensors.push_back({g.name, g.dtype, g.shape});
      if (!HasOptimizerState(g)) buffers_.insert(g.name);
    }
    for (int r = 0; r < from.world_size(); ++r) {
      PTC_ASSIGN_OR_RETURN(RankView view, a.View(r), "layout A");
      for (const auto* list : {&view.model, &view.optim}) {
        for (const LocalTensor& t : *list) {
          for (ShardKey& key : StoredShards(t)) {
            ShardRecord s;
            s.tensor = std::move(key.tensor);
            s.boxes = std::move(key.boxes);
            s.worker = r;
            s.file = "rank-" + std::to_string(r);
            source_.shards.push_back(std::move(s));
          }
        }
      }
    }
    PlanRequest pr;
    pr.source = &source_;
    pr.spec = spec;
    pr.target = to;
    pr.topology.workers_per_host = std::max(1, req_.ranks_per_host);
    PTC_ASSIGN_OR_RETURN(Plan plan, MakePlan(pr), "layout B");
    if (!plan.missing.empty()) {
      return InternalError("switch plan: no rank of layout A holds " + plan.missing[0].first +
                           plan.missing[0].second.ToString());
    }
    return plan;
  }

  // Every (copy, field) as a local descriptor or a remote piece. A kept
  // target (identical shard on its own rank) still copies: A's and B's
  // buffers are separate memory.
  Status Emit(const Plan& plan) {
    for (size_t t = 0; t < plan.targets.size(); ++t) {
      if (!plan.targets[t].kept) continue;
      for (const Box& box : plan.targets[t].key.boxes) PTC_RETURN_IF_ERROR(EmitOne(plan, t, *plan.targets[t].kept, box));
    }
    for (const Copy& c : plan.copies) PTC_RETURN_IF_ERROR(EmitOne(plan, c.target, c.source, c.region));
    return Status();
  }

  Status EmitOne(const Plan& plan, size_t target, size_t source, const Box& region) {
    const TargetShard& t = plan.targets[target];
    const ShardRecord& s = source_.shards[source];
    const int from = s.worker, to = t.worker;
    const Box* src_box = Containing(s.boxes, region);
    const Box* dst_box = Containing(t.key.boxes, region);
    if (src_box == nullptr || dst_box == nullptr) return InternalError("switch plan: a copy leaves its shards");
    std::vector<std::string> names = {s.tensor};
    const bool is_param = IsParameter(s.tensor);
    if (is_param && req_.contents.grads) names.push_back(s.tensor + kGradSuffix);
    for (const std::string& name : names) {
      auto src = from_places_[from].find({name, *src_box});
      auto dst = to_places_[to].find({name, *dst_box});
      if (src == from_places_[from].end() || dst == to_places_[to].end()) {
        return InternalError("switch plan: " + name + src_box->ToString() + " is in no buffer of rank " +
                             std::to_string(from) + " or " + std::to_string(to));
      }
      const uint32_t elem =
          static_cast<uint32_t>(DTypeSize(plan_->ranks[from].from[src->second[0].buffer].dtype));
      const uint64_t bytes = static_cast<uint64_t>(region.volume()) * elem;
      if (from == to) {
        const Place& sp = src->second[0];
        for (const Place& dp : dst->second) {
          PTC_RETURN_IF_ERROR(DescribeCopy(sp.buffer, AddressOf(*sp.segment, region), sp.segment->layout.strides,
                                           dp.buffer, AddressOf(*dp.segment, region), dp.segment->layout.strides,
                                           region, elem, name, &plan_->ranks[to].local));
          plan_->ranks[to].bytes_local += bytes;
          plan_->bytes_local += bytes;
        }
        continue;
      }
      std::vector<Box> parts;
      SplitRegion(region, elem, std::max<uint64_t>(elem, req_.budget_bytes / 2 / kStagingAlign * kStagingAlign),
                  &parts);
      for (Box& part : parts) pieces_.push_back({from, to, src->second[0], dst->second, std::move(part), elem});
      plan_->bytes_moved += bytes;
      plan_->messages[{from, to}] += bytes;
    }
    return Status();
  }

  // A parameter (with a gradient): no optimizer state, no model buffer.
  bool IsParameter(const std::string& tensor) const {
    if (buffers_.count(tensor) != 0) return false;
    for (const char* kind : kOptimizerKinds) {
      const std::string suffix = std::string(".") + kind;
      if (tensor.size() > suffix.size() && tensor.compare(tensor.size() - suffix.size(), suffix.size(), suffix) == 0)
        return false;
    }
    return true;
  }

  // First fit of the pieces into buckets: a bucket takes a piece when the
  // sender's and the receiver's staging (sends + receives) stay within budget.
  Status Bucket() {
    const uint64_t budget = req_.budget_bytes;
    std::vector<std::vector<uint64_t>> used;  // [bucket][rank]
    std::vector<size_t> bucket_of(pieces_.size());
    // Ranks' pieces in a fixed order: by (sender, receiver), then as planned.
    std::vector<size_t> order(pieces_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tie(pieces_[a].from, pieces_[a].to) < std::tie(pieces_[b].from, pieces_[b].to);
    });
    // Per rank, the first bucket with room for the smallest piece (kStagingAlign
    // bytes): the buckets below it cannot take any piece of that rank.
    std::vector<size_t> open(plan_->world, 0);
    auto advance = [&](int r) {
      while (open[r] < used.size() && used[open[r]][r] + kStagingAlign > budget) ++open[r];
    };
    for (size_t i : order) {
      const Piece& p = pieces_[i];
      const uint64_t n = p.padded();
      size_t b = std::max(open[p.from], open[p.to]);
      while (b < used.size() && (used[b][p.from] + n > budget || used[b][p.to] + n > budget)) ++b;
      if (b == used.size()) used.emplace_back(plan_->world, 0);
      used[b][p.from] += n;
      used[b][p.to] += n;
      bucket_of[i] = b;
      advance(p.from);
      advance(p.to);
    }
    plan_->num_buckets = used.size();
    for (RankSchedule& rs : plan_->ranks) rs.buckets.resize(used.size());
    std::vector<std::vector<size_t>> in_bucket(used.size());
    for (size_t i : order) in_bucket[bucket_of[i]].push_back(i);
    // Per bucket and rank: message sizes per peer, then piece positions.
    for (size_t b = 0; b < used.size(); ++b) {
      // (rank, peer) -> pieces, in `order`.
      std::map<std::pair<int, int>, std::vector<size_t>> out, in;
      for (size_t i : in_bucket[b]) {
        out[{pieces_[i].from, pieces_[i].to}].push_back(i);
        in[{pieces_[i].to, pieces_[i].from}].push_back(i);
      }
      std::vector<uint64_t> cursor(plan_->world, 0);
      for (auto& [key, list] : out) {  // sends first, ascending peer
        SwitchBucket& sb = plan_->ranks[key.first].buckets[b];
        PeerSpan span{key.second, cursor[key.first], 0};
        for (size_t i : list) {
          const Piece& p = pieces_[i];
          PTC_RETURN_IF_ERROR(DescribeCopy(p.src.buffer, AddressOf(*p.src.segment, p.region),
                                           p.src.segment->layout.strides, kStagingBuffer,
                                           static_cast<int64_t>((span.offset + span.bytes) / p.elem),
                                           RowMajorStrides(p.region.shape()), p.region, p.elem,
                                           p.src.segment->tensor, &sb.pack));
          span.bytes += p.padded();
        }
        cursor[key.first] += span.bytes;
        sb.sends.push_back(span);
      }
      for (auto& [key, list] : in) {
        SwitchBucket& sb = plan_->ranks[key.first].buckets[b];
        PeerSpan span{key.second, cursor[key.first], 0};
        for (size_t i : list) {
          const Piece& p = pieces_[i];
          for (const Place& dp : p.dst) {
            PTC_RETURN_IF_ERROR(DescribeCopy(kStagingBuffer, static_cast<int64_t>((span.offset + span.bytes) / p.elem),
                                             RowMajorStrides(p.region.shape()), dp.buffer,
                                             AddressOf(*dp.segment, p.region), dp.segment->layout.strides, p.region,
                                             p.elem, dp.segment->tensor, &sb.unpack));
          }
          span.bytes += p.padded();
        }
        cursor[key.first] += span.bytes;
        sb.recvs.push_back(span);
      }
      for (int r = 0; r < plan_->world; ++r) {
        RankSchedule& rs = plan_->ranks[r];
        SwitchBucket& sb = rs.buckets[b];
        sb.staging_bytes = cursor[r];
        rs.staging_bytes = std::max(rs.staging_bytes, sb.staging_bytes);
        for (const PeerSpan& s : sb.sends) rs.bytes_sent += s.bytes;
        for (const PeerSpan& s : sb.recvs) rs.bytes_received += s.bytes;
      }
    }
    for (const RankSchedule& rs : plan_->ranks) {
      plan_->bottleneck = std::max({plan_->bottleneck, rs.bytes_sent, rs.bytes_received});
    }
    return Status();
  }

  const SwitchRequest& req_;
  SwitchPlan* plan_;
  GenerationManifest source_;
  std::set<std::string> buffers_;  // the model's buffers (HasOptimizerState false): no gradient
  std::vector<PlaceMap> from_places_, to_places_;
  std::vector<Piece> pieces_;
};

}  // namespace

uint64_t BufferBytes(const LocalTensor& t) { return static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype); }

Result<ModelLayout> SwitchLayout(ModelSpec spec, const ParallelConfig& config, const SwitchContents& contents) {
  spec.dtype = contents.param_dtype;
  spec.optimizer = contents.optimizer;
  return ModelLayout::Make(std::move(spec), config);
}

Result<std::vector<LocalTensor>> SwitchBuffers(const ModelLayout& layout, int rank, const SwitchContents& contents) {
  std::vector<LocalTensor> out;
  if (rank >= layout.world_size()) return out;
  PTC_ASSIGN_OR_RETURN(RankView view, layout.View(rank));
  for (LocalTensor& t : view.model) {
    t.dtype = contents.param_dtype;
    out.push_back(t);
  }
  if (contents.grads) {
    for (const LocalTensor& t : view.model) {
      if (!HasOptimizerState(t)) continue;  // a buffer has no gradient
      LocalTensor g = t;
      g.name += kGradSuffix;
      g.dtype = contents.grad_dtype;
      for (Segment& seg : g.segments) seg.tensor += kGradSuffix;
      out.push_back(std::move(g));
    }
  }
  for (LocalTensor& t : view.optim) out.push_back(std::move(t));
  return out;
}

Result<SwitchPlan> MakeSwitchPlan(const SwitchRequest& request) {
  if (request.budget_bytes < 64) {
    return InvalidArgumentError("switch plan: a staging budget of " + std::to_string(request.budget_bytes) +
                                " bytes is below the minimum of 64");
  }
  SwitchPlan plan;
  Scheduler scheduler(request, &plan);
  PTC_RETURN_IF_ERROR(scheduler.Build());
  return plan;
}

std::string SwitchKey(const SwitchRequest& r) {
  const SwitchContents& c = r.contents;
  return r.spec.schema.ToJson().dump() + "|" + r.spec.dims.ToString() + "|" + r.from.ToString() + "|" +
         r.to.ToString() + "|" + std::string(DTypeName(c.param_dtype)) + "|" +
         (c.grads ? std::string(DTypeName(c.grad_dtype)) : "-") + "|" + (c.optimizer ? "optim" : "-") + "|" +
         std::to_string(r.ranks_per_host) + "|" + std::to_string(r.budget_bytes);
}

Result<std::shared_ptr<const SwitchPlan>> SwitchPlanCache::Get(const SwitchRequest& request) {
  const std::string key = SwitchKey(request);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = plans_.find(key); it != plans_.end()) {
      ++hits_;
      return it->second;
    }
  }
  // Planned outside the lock: two threads may both plan a new key; the first stored wins.
  PTC_ASSIGN_OR_RETURN(SwitchPlan plan, MakeSwitchPlan(request));
  auto shared = std::make_shared<const SwitchPlan>(std::move(plan));
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.try_emplace(key, std::move(shared)).first->second;
}

size_t SwitchPlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

uint64_t SwitchPlanCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace ptc::transform::device
