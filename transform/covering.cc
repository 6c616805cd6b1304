#include "transform/covering.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>

namespace ptc::transform {
namespace {

void AddPiece(uint64_t bytes, Fragmentation* f) {
  f->pieces++;
  f->smallest_piece = f->pieces == 1 ? bytes : std::min(f->smallest_piece, bytes);
}

// Whether every target not stored as it is gets written whole.
bool Compacts(CommitMode mode) { return mode == CommitMode::kCompact || mode == CommitMode::kCompactWorkerLocal; }
// Whether a target may be stored only by a piece on its own worker.
bool WorkerLocal(CommitMode mode) {
  return mode == CommitMode::kWorkerLocal || mode == CommitMode::kCompactWorkerLocal;
}

}  // namespace

Covering MakeCovering(const Plan& plan, const GenerationManifest& source, CommitMode mode) {
  Covering out;
  std::set<std::pair<size_t, int>> references;
  size_t c = 0;  // plan.copies are grouped by target, in target order
  for (size_t t = 0; t < plan.targets.size(); ++t) {
    const TargetShard& target = plan.targets[t];
    const size_t first = c;
    while (c < plan.copies.size() && plan.copies[c].target == t) ++c;
    out.fragmentation.shards++;
    std::optional<size_t> stored = target.kept;
    if (!stored && !WorkerLocal(mode)) stored = target.same;
    if (stored) {
      AddPiece(target.nbytes, &out.fragmentation);
      references.emplace(*stored, target.worker);
      continue;
    }
    for (size_t i = first; i < c; ++i) AddPiece(plan.copies[i].nbytes, &out.fragmentation);
    TargetShard piece{{target.key.tensor, {}}, target.worker, target.dtype, 0, {}, {}};
    const size_t index = out.writes.targets.size();
    for (size_t i = first; i < c; ++i) {
      const Copy& copy = plan.copies[i];
      if (!Compacts(mode) && source.shards[copy.source].worker == target.worker) {
        references.emplace(copy.source, target.worker);
        continue;
      }
      piece.key.boxes.push_back(copy.region);
      piece.nbytes += copy.nbytes;
      out.writes.copies.push_back({index, copy.source, copy.region, copy.nbytes});
    }
    // A piece that is the whole target is a target shard, stored as it is.
    if (piece.nbytes != target.nbytes) out.compact_bytes += target.nbytes;
    if (piece.key.boxes.empty()) continue;
    if (piece.nbytes == target.nbytes) piece.key.boxes = target.key.boxes;  // in the target's own order
    out.bytes_written += piece.nbytes;
    out.writes.targets.push_back(std::move(piece));
  }
  out.references.assign(references.begin(), references.end());
  for (const auto& [s, worker] : out.references) out.bytes_referenced += source.shards[s].nbytes;
  out.writes.bytes_total = out.bytes_written;
  return out;
}

Covering PartOf(const Covering& covering, int worker) {
  Covering out = covering;
  out.writes.targets.clear();
  out.writes.copies.clear();
  out.bytes_written = 0;
  std::vector<size_t> index(covering.writes.targets.size(), SIZE_MAX);
  for (size_t t = 0; t < covering.writes.targets.size(); ++t) {
    const TargetShard& target = covering.writes.targets[t];
    if (target.worker != worker) continue;
    index[t] = out.writes.targets.size();
    out.writes.targets.push_back(target);
    out.bytes_written += target.nbytes;
  }
  for (const Copy& copy : covering.writes.copies) {
    if (index[copy.target] == SIZE_MAX) continue;
    out.writes.copies.push_back(copy);
    out.writes.copies.back().target = index[copy.target];
  }
  out.writes.bytes_total = out.bytes_written;
  return out;
}

}  // namespace ptc::transform
