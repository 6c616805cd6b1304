#include "ptc/store/store_reader.h"

#include <algorithm>

#include "ptc/model/region_io.h"
#include "ptc/store/shard_verify.h"

namespace ptc {

GenerationReader::GenerationReader(const Store& store, std::shared_ptr<const GenerationManifest> manifest, bool verify)
    : store_(store), manifest_(std::move(manifest)), verify_(verify) {
  for (const TensorRecord& t : manifest_->tensors) dtype_size_[t.name] = DTypeSize(t.dtype);
  for (const ShardRecord& s : manifest_->shards) by_tensor_[s.tensor].push_back(&s);
}

Result<const RandomAccessFile*> GenerationReader::File(const ShardRecord& shard) const {
  // Verification reads the whole shard; it happens outside the lock.
  if (verify_) {
    bool known;
    {
      MutexLock lock(&mu_);
      known = verified_.count(&shard) > 0;
    }
    if (!known) {
      Status s = VerifyShard(store_.env(), store_, shard);
      MutexLock lock(&mu_);
      verified_.emplace(&shard, s);
    }
    MutexLock lock(&mu_);
    PTC_RETURN_IF_ERROR(verified_.at(&shard));
  }
  {
    MutexLock lock(&mu_);
    if (auto it = files_.find(shard.file); it != files_.end()) return it->second.get();
  }
  // Opened outside the lock: an open that is slow (a remote worker's file, a
  // busy disk) holds up only the reads of this shard, never those of others.
  // Two threads may open the same file at once; the first one kept wins and
  // the other's copy is closed, outside the lock.
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> opened, store_.env()->OpenRead(store_.AbsPath(shard.file)));
  const RandomAccessFile* kept;
  {
    MutexLock lock(&mu_);
    auto [it, inserted] = files_.try_emplace(shard.file, nullptr);
    if (inserted) it->second = std::move(opened);
    kept = it->second.get();
  }
  return kept;  // `opened`, when another thread's copy was kept, is closed here
}

Status GenerationReader::ReadShard(const ShardRecord& shard, const Box& region, void* dst, const Box& dst_box,
                                   const Layout& dst_layout) const {
  const size_t elem = dtype_size_.at(shard.tensor);
  uint64_t base = shard.offset;
  for (const Box& stored : shard.boxes) {
    if (Contains(stored, region)) {
      PTC_ASSIGN_OR_RETURN(const RandomAccessFile* file, File(shard));
      FileTensor src{file, base, stored, DenseLayout(stored), elem};
      return ReadRegion(src, region, dst, dst_box, dst_layout);
    }
    base += static_cast<uint64_t>(stored.volume()) * elem;
  }
  return InternalError("region " + region.ToString() + " is not inside one box of a shard of '" + shard.tensor + "'");
}

Status GenerationReader::Cover(const std::string& tensor, const Box& region, int prefer_worker,
                               const PartFn& fn) const {
  auto it = by_tensor_.find(tensor);
  if (it == by_tensor_.end()) return NotFoundError("tensor '" + tensor + "' has no stored shard");
  std::vector<const ShardRecord*> order = it->second;
  auto others =
      std::stable_partition(order.begin(), order.end(), [&](const ShardRecord* s) { return s->worker == prefer_worker; });
  // Copies on machines known to be gone last: a copy elsewhere serves the read.
  std::stable_partition(others, order.end(),
                        [&](const ShardRecord* s) { return store_.env()->Reachable(store_.AbsPath(s->file)); });
  const size_t elem = dtype_size_.at(tensor);
  std::vector<Box> missing = {region};
  for (const ShardRecord* shard : order) {
    if (missing.empty()) break;
    uint64_t base = shard->offset;
    for (const Box& stored : shard->boxes) {
      std::vector<Box> still;
      for (const Box& want : missing) {
        auto hit = Intersect(want, stored);
        if (!hit) {
          still.push_back(want);
          continue;
        }
        PTC_RETURN_IF_ERROR(fn(*shard, stored, base, *hit));
        for (Box& rest : Subtract(want, stored)) still.push_back(std::move(rest));
      }
      missing = std::move(still);
      base += static_cast<uint64_t>(stored.volume()) * elem;
    }
  }
  if (!missing.empty()) {
    return NotFoundError("tensor '" + tensor + "': no stored copy holds " + missing.front().ToString() +
                         " (generation " + std::to_string(manifest_->generation) + ")");
  }
  return Status::OK();
}

Status GenerationReader::Read(const std::string& tensor, const Box& region, void* dst, const Box& dst_box,
                              const Layout& dst_layout, int prefer_worker) const {
  auto known = dtype_size_.find(tensor);
  const size_t elem = known == dtype_size_.end() ? 0 : known->second;  // unknown: Cover reports it
  return Cover(tensor, region, prefer_worker,
               [&](const ShardRecord& shard, const Box& stored, uint64_t base, const Box& part) -> Status {
                 PTC_ASSIGN_OR_RETURN(const RandomAccessFile* file, File(shard));
                 FileTensor src{file, base, stored, DenseLayout(stored), elem};
                 return ReadRegion(src, part, dst, dst_box, dst_layout).WithContext("tensor '" + tensor + "'");
               });
}

}  // namespace ptc
