// The files and byte ranges a peer server serves.
#include "cluster/served_files.h"

#include <algorithm>

namespace ptc::cluster {

ServedFiles::ServedFiles(const std::vector<std::shared_ptr<const GenerationManifest>>& manifests, int worker) {
  for (const auto& m : manifests) {
    if (m == nullptr) continue;
    generations_.push_back(m->generation);
    for (const ShardRecord& s : m->shards) {
      if (s.nbytes == 0 || (worker >= 0 && s.worker != worker)) continue;
      extents_[s.file].emplace_back(s.offset, s.offset + s.nbytes);
    }
  }
  for (auto& [file, ranges] : extents_) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint64_t, uint64_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    ranges = std::move(merged);
  }
}

Status ServedFiles::Check(std::string_view file, uint64_t offset, uint64_t length) const {
  const auto it = extents_.find(std::string(file));
  if (it == extents_.end()) return NotFoundError("no served generation names the file '" + std::string(file) + "'");
  const std::string range =
      "bytes " + std::to_string(offset) + "+" + std::to_string(length) + " of '" + std::string(file) + "'";
  if (offset > UINT64_MAX - length) return InvalidArgumentError(range + ": overflow");
  const auto& ranges = it->second;
  // The last extent beginning at or before offset.
  auto next = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(offset, UINT64_MAX));
  if (next != ranges.begin()) {
    const auto& r = *std::prev(next);
    if (offset >= r.first && offset + length <= r.second) return Status::OK();
  }
  return InvalidArgumentError(range + " lie outside its shard data");
}

}  // namespace ptc::cluster
