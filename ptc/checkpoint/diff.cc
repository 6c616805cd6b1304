#include "ptc/checkpoint/diff.h"

#include <cstring>
#include <map>
#include <vector>

#include "ptc/model/limits.h"

namespace ptc {
namespace {

struct Holder {
  size_t rank;
  const LocalTensor* local;
  const Segment* segment;
};

struct Opened {
  ModelSpec spec;
  std::vector<RankView> views;
  std::vector<std::unique_ptr<RankCheckpoint>> ranks;
  std::map<std::string, std::vector<Holder>> holders;  // by global tensor
};

Result<Opened> OpenSide(Env* env, const Schema& schema, const ModelDims& dims, const CheckpointSide& side) {
  Opened o;
  PTC_ASSIGN_OR_RETURN(o.spec, InferModelSpec(env, side.dir, schema, dims));
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(o.spec, side.config));
  for (int r = 0; r < layout.world_size(); ++r) {
    PTC_ASSIGN_OR_RETURN(RankView view, layout.View(r));
    PTC_ASSIGN_OR_RETURN(auto ckpt, RankCheckpoint::Open(env, side.dir, view));
    o.views.push_back(std::move(view));
    o.ranks.push_back(std::move(ckpt));
  }
  for (size_t r = 0; r < o.views.size(); ++r) {
    for (const auto* list : {&o.views[r].model, &o.views[r].optim}) {
      for (const LocalTensor& t : *list) {
        for (const Segment& s : t.segments) o.holders[s.tensor].push_back({r, &t, &s});
      }
    }
  }
  return o;
}

std::vector<Index> Unflatten(const Shape& shape, Index flat) {
  std::vector<Index> idx(shape.size());
  const std::vector<Index> strides = RowMajorStrides(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    idx[d] = flat / strides[d];
    flat %= strides[d];
  }
  return idx;
}

std::string Hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = n; i-- > 0;) {  // little-endian: most significant byte last
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// One side's assembly of a global tensor: bytes plus which elements are set.
struct Assembly {
  std::vector<unsigned char> bytes;
  std::vector<bool> set;
};

// Copies one segment into the assembly; the first disagreement with an
// element already set by another replica is recorded in `diff`.
Status AddSegment(const Opened& side, const char* label, const GlobalTensor& g, const Holder& h, Assembly* out,
                  DiffResult* diff) {
  const LocalTensor& t = *h.local;
  const Segment& s = *h.segment;
  if (t.dtype != g.dtype) {
    return InvalidArgumentError(std::string(label) + " rank " + std::to_string(h.rank) + ": tensor '" + t.name +
                                "' is " + std::string(DTypeName(t.dtype)) + ", rank 0 has " +
                                std::string(DTypeName(g.dtype)));
  }
  const size_t elem = DTypeSize(g.dtype);
  const Box full = Box::Full(g.shape);
  std::vector<unsigned char> piece(s.box.volume() * elem);
  PTC_RETURN_IF_ERROR(ReadRegion(side.ranks[h.rank]->Locate(t, s), s.box, piece.data(), s.box, DenseLayout(s.box)));
  ForEachRun(s.box, s.box, DenseLayout(s.box), full, DenseLayout(full), [&](Index src, Index dst, Index cnt) {
    for (Index i = 0; i < cnt && diff->equal; ++i) {
      unsigned char* have = &out->bytes[(dst + i) * elem];
      const unsigned char* got = &piece[(src + i) * elem];
      if (!out->set[dst + i]) {
        std::memcpy(have, got, elem);
        out->set[dst + i] = true;
      } else if (std::memcmp(have, got, elem) != 0) {
        diff->equal = false;
        diff->tensor = g.name;
        diff->index = Unflatten(g.shape, dst + i);
        diff->reason = std::string(label) + ": replicas of '" + g.name + "' disagree at " + ShapeToString(diff->index) +
                       ": rank " + std::to_string(h.rank) + " tensor '" + t.name + "' has " + Hex(got, elem) +
                       ", another rank " + Hex(have, elem);
      }
    }
  });
  return Status::OK();
}

// Assembles `g` from every segment of every rank of `side`.
Status Assemble(const Opened& side, const char* label, const GlobalTensor& g, Assembly* out, DiffResult* diff) {
  const Index n = NumElements(g.shape);
  out->bytes.assign(n * DTypeSize(g.dtype), 0);
  out->set.assign(n, false);
  auto it = side.holders.find(g.name);
  if (it != side.holders.end()) {
    for (const Holder& h : it->second) {
      PTC_RETURN_IF_ERROR(AddSegment(side, label, g, h, out, diff));
      if (!diff->equal) return Status::OK();
    }
  }
  for (Index i = 0; i < n; ++i) {
    if (!out->set[i]) {
      return InternalError(std::string(label) + ": no rank holds element " + std::to_string(i) + " of " + g.name);
    }
  }
  return Status::OK();
}

}  // namespace

Result<DiffResult> DiffCheckpoints(Env* env, const Schema& schema, const ModelDims& dims, const CheckpointSide& a,
                                   const CheckpointSide& b, const ProgressFn& progress) {
  PTC_ASSIGN_OR_RETURN(Opened sa, OpenSide(env, schema, dims, a), "A (" + a.dir + ")");
  PTC_ASSIGN_OR_RETURN(Opened sb, OpenSide(env, schema, dims, b), "B (" + b.dir + ")");
  DiffResult diff;
  if (sa.spec.dtype != sb.spec.dtype || sa.spec.optimizer != sb.spec.optimizer) {
    diff.equal = false;
    diff.reason = "A holds " + std::string(DTypeName(sa.spec.dtype)) + (sa.spec.optimizer ? " with" : " without") +
                  " optimizer state, B " + std::string(DTypeName(sb.spec.dtype)) +
                  (sb.spec.optimizer ? " with" : " without");
    return diff;
  }
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(sa.spec));
  // Each side assembles one global tensor at a time: its bytes and a bit per element.
  const GlobalTensor* largest = nullptr;
  uint64_t held = 0;
  for (const GlobalTensor& g : globals) {
    const uint64_t n = static_cast<uint64_t>(NumElements(g.shape));
    if (const uint64_t bytes = 2 * (n * DTypeSize(g.dtype) + n / 8); bytes > held) held = bytes, largest = &g;
  }
  if (largest != nullptr) {
    PTC_RETURN_IF_ERROR(CheckHeldBytes(held, env->MemoryBytes(), "diff: assembling tensor '" + largest->name + "'"));
  }
  Assembly xa, xb;
  for (const GlobalTensor& g : globals) {
    PTC_RETURN_IF_ERROR(Assemble(sa, "A", g, &xa, &diff));
    if (!diff.equal) return diff;
    PTC_RETURN_IF_ERROR(Assemble(sb, "B", g, &xb, &diff));
    if (!diff.equal) return diff;
    const size_t elem = DTypeSize(g.dtype);
    if (xa.bytes != xb.bytes) {
      size_t i = 0;
      while (std::memcmp(&xa.bytes[i * elem], &xb.bytes[i * elem], elem) == 0) ++i;
      diff.equal = false;
      diff.tensor = g.name;
      diff.index = Unflatten(g.shape, i);
      diff.reason = "'" + g.name + "' differs at " + ShapeToString(diff.index) + ": A has " +
                    Hex(&xa.bytes[i * elem], elem) + ", B has " + Hex(&xb.bytes[i * elem], elem);
      return diff;
    }
    if (progress) progress(xa.bytes.size());
  }
  return diff;
}

}  // namespace ptc
