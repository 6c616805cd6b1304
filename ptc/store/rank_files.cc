// Copies inside rank files, as records and by piece.
#include "ptc/store/rank_files.h"

#include <tuple>

namespace ptc {
namespace {

using Key = std::tuple<int, std::string, std::vector<Box>>;  // (worker, tensor, boxes)

std::map<Key, const ShardRecord*> PiecesOf(const GenerationManifest& m) {
  std::map<Key, const ShardRecord*> out;
  for (const ShardRecord& s : m.shards) out.emplace(Key{s.worker, s.tensor, s.boxes}, &s);
  return out;
}

// Calls fn(piece, file, copy) for every copy of `m` whose piece has bytes.
template <typename Fn>
void ForEachCopy(const GenerationManifest& m, Fn fn) {
  const std::map<Key, const ShardRecord*> pieces = PiecesOf(m);
  for (const RankFileCopies& f : m.rank_file_copies) {
    for (const CopyRecord& c : f.copies) {
      auto it = pieces.find(Key{f.worker, c.tensor, c.boxes});
      if (it == pieces.end() || it->second->nbytes == 0) continue;  // refused by DecodeManifest
      fn(*it->second, f, c);
    }
  }
}

}  // namespace

std::vector<ShardRecord> CopyRecords(const GenerationManifest& m) {
  std::vector<ShardRecord> out;
  ForEachCopy(m, [&](const ShardRecord& piece, const RankFileCopies& f, const CopyRecord& c) {
    ShardRecord r = piece;
    r.file = f.file;
    r.offset = c.offset;
    r.h5.clear();
    out.push_back(std::move(r));
  });
  return out;
}

std::map<const ShardRecord*, std::vector<CopyPlace>> CopiesByPiece(const GenerationManifest& m) {
  std::map<const ShardRecord*, std::vector<CopyPlace>> out;
  ForEachCopy(m, [&](const ShardRecord& piece, const RankFileCopies& f, const CopyRecord& c) {
    out[&piece].push_back({f.file, c.offset});
  });
  return out;
}

}  // namespace ptc
